//! `WorkList`: the store's queued device work whose outcome it has not
//! seen yet, each item with what it did to the store (`E`), so that work
//! refused as transient can be undone.

use cistern_runtime::{FailureToken, ServerError};

use crate::error::BackendError;

/// Queued work, in the order sent.
#[derive(Debug)]
pub(super) struct WorkList<E> {
    items: Vec<Queued<E>>,
}

/// One queued launch (or batch) and what it did to the store.
#[derive(Debug)]
struct Queued<E> {
    token: FailureToken,
    effect: E,
}

/// What [`WorkList::settle`] found, its settled work removed.
#[derive(Debug)]
pub(super) struct Settled<E> {
    /// The work the device refused as transient (nothing ran), in order,
    /// with its error.
    pub(super) refused: Vec<(E, BackendError)>,
    /// The first other failure, where the walk stopped (left queued).
    pub(super) failed: Option<BackendError>,
}

impl<E> Default for WorkList<E> {
    fn default() -> Self {
        WorkList { items: Vec::new() }
    }
}

impl<E> WorkList<E> {
    /// Records queued work settled through `token`.
    pub(super) fn push(&mut self, token: FailureToken, effect: E) {
        self.items.push(Queued { token, effect });
    }

    /// Removes the latest queued work; what it did, if any was queued.
    pub(super) fn pop_latest(&mut self) -> Option<E> {
        self.items.pop().map(|item| item.effect)
    }

    /// The first queued work that failed, with its error, if any.
    pub(super) fn first_failure(&self) -> Option<ServerError> {
        self.items.iter().find_map(|item| match item.token.check() {
            Some(Err(error)) => Some(error),
            _ => None,
        })
    }

    /// Walks the work in order: forgets what succeeded, removes and
    /// returns what was refused as transient, and stops at the first
    /// other failure.
    pub(super) fn settle(&mut self) -> Settled<E> {
        let mut settled = Settled {
            refused: Vec::new(),
            failed: None,
        };
        let mut index = 0;
        while index < self.items.len() {
            match self.items[index].token.check() {
                None => index += 1,
                Some(Ok(())) => {
                    self.items.remove(index);
                }
                Some(Err(error)) => {
                    let error = BackendError::from(error);
                    if !error.is_transient() {
                        settled.failed = Some(error);
                        break;
                    }
                    let item = self.items.remove(index);
                    settled.refused.push((item.effect, error));
                }
            }
        }
        settled
    }
}
