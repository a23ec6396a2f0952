//! `WorkList`: the store's queued device work whose outcome it has not
//! seen yet, and what to put back if a step was refused as transient.

use cistern_runtime::FailureToken;

use super::step::OptimizerRun;
use super::store::{PendingForward, Staged};

/// Queued work, in the order sent.
#[derive(Debug, Default)]
pub(super) struct WorkList {
    pub(super) items: Vec<Queued>,
}

/// One queued launch (or batch) and what it was.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) token: FailureToken,
    pub(super) work: Effect,
}

/// What a queued launch did for the store.
#[derive(Debug)]
pub(super) enum Effect {
    /// A backward's copy of gradients into the staging buffer.
    Staging {
        /// That backward's serial.
        serial: u64,
    },
    /// An optimizer step, with the store's state from before it.
    Step(Box<Restore>),
    /// A device-chain train step, with the store's state and the loss
    /// serial from before it.
    ChainStep {
        /// The state before the step.
        restore: Box<Restore>,
        /// The loss serial before the step.
        loss_serial: u64,
    },
}

/// The store's state before a step: put back when the device refused the
/// step as transient (nothing ran), so the step can be retried.
#[derive(Debug)]
pub(super) struct Restore {
    pub(super) pending: Option<PendingForward>,
    pub(super) staged: Option<Staged>,
    pub(super) optimizer: Option<OptimizerRun>,
}

impl WorkList {
    /// Records queued `work` settled through `token`.
    pub(super) fn push(&mut self, token: FailureToken, work: Effect) {
        self.items.push(Queued { token, work });
    }

    /// The first queued work that failed, with its error, if any.
    pub(super) fn first_failure(&self) -> Option<cistern_runtime::ServerError> {
        self.items.iter().find_map(|item| match item.token.check() {
            Some(Err(error)) => Some(error),
            _ => None,
        })
    }
}
