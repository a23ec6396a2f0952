//! `WorkLog`: the launches a tape sent, their failure tokens, and the first
//! failure among them, latched.
//!
//! Launches return before they run, so a tape learns of a failed launch only
//! when it waits. Every waiting call asks the log first: the earliest failed
//! launch's error is the answer (the work that failed, not the read that
//! noticed), and it stays the answer of every later waiting call, because a
//! value computed after a failed launch is never trustworthy.

use cistern_runtime::{FailureToken, KernelLaunch, ServerError};

use crate::error::AutodiffError;

/// What a tape sent and how it went.
#[derive(Debug, Default)]
pub(super) struct WorkLog {
    /// Every launch, in the order sent (what one step ran, for a replay).
    launches: Vec<KernelLaunch>,
    /// Tokens not yet seen settled, in the order sent.
    pending: Vec<FailureToken>,
    /// The first failure seen; every later waiting call returns it.
    failure: Option<AutodiffError>,
}

impl WorkLog {
    /// Records a launch sent with `token`.
    pub(super) fn record(&mut self, launch: KernelLaunch, token: FailureToken) {
        self.launches.push(launch);
        self.pending.push(token);
    }

    /// Forgets the launches sent (a new step's record begins); their tokens
    /// and a latched failure stay.
    pub(super) fn forget_launches(&mut self) {
        self.launches.clear();
    }

    /// The launches sent, in order.
    pub(super) fn launches(&self) -> &[KernelLaunch] {
        &self.launches
    }

    /// The latched failure, if a waiting call has seen one.
    pub(super) fn failure(&self) -> Option<&AutodiffError> {
        self.failure.as_ref()
    }

    /// The answer of a call that waited on the tape's stream with `waited`:
    /// the earliest failed launch's error if there is one (latched), else
    /// `waited` as it came.
    ///
    /// Once a read on the stream has answered, every launch sent before it
    /// has settled its token; a token still pending (a read the server
    /// refused before it reached the stream) is kept for the next call.
    pub(super) fn settle<T>(&mut self, waited: Result<T, ServerError>) -> Result<T, AutodiffError> {
        self.prune()?;
        waited.map_err(AutodiffError::from)
    }

    /// The tokens of the launches not yet seen to succeed, in order (those
    /// that did are forgotten); the earliest failure (latched) where one
    /// has settled.
    pub(super) fn unsettled(&mut self) -> Result<Vec<FailureToken>, AutodiffError> {
        self.prune()?;
        Ok(self.pending.clone())
    }

    /// Forgets the tokens that succeeded; the latched failure, or the
    /// earliest settled one (latched now), if any.
    fn prune(&mut self) -> Result<(), AutodiffError> {
        if let Some(failure) = &self.failure {
            return Err(failure.clone());
        }
        let mut first_failure = None;
        self.pending.retain(|token| match token.check() {
            None => true,
            Some(Ok(())) => false,
            Some(Err(error)) => {
                first_failure.get_or_insert(error);
                false
            }
        });
        if let Some(error) = first_failure {
            let error = AutodiffError::from(error);
            self.failure = Some(error.clone());
            return Err(error);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cistern_runtime::PendingToken;

    fn failed(message: &str) -> FailureToken {
        let token = FailureToken::new();
        PendingToken::new(token.clone(), 0).fail(ServerError::InvalidArgument {
            message: message.into(),
        });
        token
    }

    #[test]
    fn the_earliest_failed_launch_is_the_answer_and_stays_latched() {
        let mut log = WorkLog::default();
        let ok = FailureToken::new();
        PendingToken::new(ok.clone(), 0).succeed();
        log.record(KernelLaunch::empty(), ok);
        log.record(KernelLaunch::empty(), failed("first"));
        log.record(KernelLaunch::empty(), failed("second"));
        let first = log.settle(Ok(()));
        let expected = AutodiffError::from(ServerError::InvalidArgument {
            message: "first".into(),
        });
        assert_eq!(first, Err(expected.clone()));
        assert_eq!(log.settle(Ok(7)), Err(expected));
        assert_eq!(log.launches().len(), 3);
    }

    #[test]
    fn a_pending_token_is_kept_and_the_wait_answers_for_itself() {
        let mut log = WorkLog::default();
        log.record(KernelLaunch::empty(), FailureToken::new());
        assert_eq!(log.settle(Ok(1)), Ok(1));
        assert!(log.failure().is_none());
        assert_eq!(log.pending.len(), 1);
    }
}
