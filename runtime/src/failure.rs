//! `FailureToken`: how the outcome of asynchronous work reaches its owner.

use crate::error::ServerError;
use crate::sync::{Arc, Condvar, Mutex};

/// The outcome of one piece of asynchronous work (a launch, a batch),
/// shared between its owner and the executor that runs it.
///
/// The executor sets it when the work ran or failed, so the error reaches
/// whoever submitted the work rather than whoever synchronizes next. Cheap
/// to clone; every clone sees the same outcome.
#[derive(Clone, Debug, Default)]
pub struct FailureToken {
    state: Arc<TokenState>,
}

#[derive(Debug, Default)]
struct TokenState {
    outcome: Mutex<Option<Result<(), ServerError>>>,
    settled: Condvar,
}

impl FailureToken {
    /// A token whose work has not run yet.
    pub fn new() -> Self {
        FailureToken::default()
    }

    /// The outcome if the work has run or failed; `None` while it is pending.
    pub fn check(&self) -> Option<Result<(), ServerError>> {
        self.state.outcome.lock().clone()
    }

    /// Whether the work failed (so far: `false` while pending).
    pub fn is_failed(&self) -> bool {
        matches!(*self.state.outcome.lock(), Some(Err(_)))
    }

    /// Blocks until the work ran (`Ok`) or failed (its error). Never hangs
    /// on a dead server: work dropped unrun settles as `ServerGone`.
    pub fn wait(&self) -> Result<(), ServerError> {
        let mut outcome = self.state.outcome.lock();
        loop {
            if let Some(result) = outcome.as_ref() {
                return result.clone();
            }
            self.state.settled.wait(&mut outcome);
        }
    }

    /// Settles the token; the first outcome wins.
    fn settle(&self, result: Result<(), ServerError>) {
        let mut outcome = self.state.outcome.lock();
        if outcome.is_none() {
            *outcome = Some(result);
            self.state.settled.notify_all();
        }
    }
}

/// The error of the first of `tokens` that failed, if any (pending ones
/// count as not failed): what refuses work that consumes their results.
pub fn first_failure(tokens: &[FailureToken]) -> Option<ServerError> {
    tokens.iter().find_map(|token| match token.check() {
        Some(Err(error)) => Some(error),
        _ => None,
    })
}

/// The executor's side of a [`FailureToken`]: settle it with [`succeed`] or
/// [`fail`]. Dropped unsettled (the work was discarded because its server
/// or executor ended), it settles the token as `ServerGone`, so no owner
/// waits forever.
///
/// [`succeed`]: PendingToken::succeed
/// [`fail`]: PendingToken::fail
#[derive(Debug)]
pub struct PendingToken {
    token: Option<FailureToken>,
    ordinal: usize,
}

impl PendingToken {
    /// Wraps `token` for work on device `ordinal`.
    pub fn new(token: FailureToken, ordinal: usize) -> Self {
        PendingToken {
            token: Some(token),
            ordinal,
        }
    }

    /// The work ran.
    pub fn succeed(mut self) {
        if let Some(token) = self.token.take() {
            token.settle(Ok(()));
        }
    }

    /// The work failed with `error`.
    pub fn fail(mut self, error: ServerError) {
        if let Some(token) = self.token.take() {
            token.settle(Err(error));
        }
    }
}

impl Drop for PendingToken {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            token.settle(Err(ServerError::ServerGone {
                ordinal: self.ordinal,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_pending_until_its_work_settles_it() {
        let token = FailureToken::new();
        assert!(token.check().is_none());
        PendingToken::new(token.clone(), 0).succeed();
        assert_eq!(token.check(), Some(Ok(())));
        assert_eq!(token.wait(), Ok(()));
    }

    #[test]
    fn the_first_outcome_wins() {
        let token = FailureToken::new();
        let error = ServerError::InvalidArgument {
            message: "x".into(),
        };
        PendingToken::new(token.clone(), 0).fail(error.clone());
        PendingToken::new(token.clone(), 0).succeed();
        assert_eq!(token.wait(), Err(error));
        assert!(token.is_failed());
    }

    #[test]
    fn work_dropped_unrun_settles_its_token_as_server_gone() {
        let token = FailureToken::new();
        drop(PendingToken::new(token.clone(), 3));
        assert_eq!(token.wait(), Err(ServerError::ServerGone { ordinal: 3 }));
    }

    #[test]
    fn a_waiter_on_another_thread_is_woken() {
        let token = FailureToken::new();
        let pending = PendingToken::new(token.clone(), 0);
        let waiter = std::thread::spawn(move || token.wait());
        pending.succeed();
        assert!(matches!(waiter.join(), Ok(Ok(()))));
    }
}
