//! `ContextState`: the health of a device context, and the entry gate every
//! command passes.
//!
//! Issue 5 adds `Retiring` and `Unrecoverable` (invalidate, probe), issue 6
//! `Capturing`; the gate stays the one place that refuses work.

use cistern_memory::DevicePoison;
use serde::{Deserialize, Serialize};

use crate::ServerError;

/// The state of one device's context.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContextState {
    /// Normal work in `generation`.
    Active {
        /// The context generation; handles from older ones are stale.
        generation: u64,
    },
    /// A sticky fault was seen: every entry point refuses with it.
    Poisoned {
        /// The generation the fault happened in.
        generation: u64,
        /// The fault.
        poison: DevicePoison,
    },
}

impl ContextState {
    /// The context generation now.
    pub fn generation(&self) -> u64 {
        match self {
            ContextState::Active { generation } | ContextState::Poisoned { generation, .. } => {
                *generation
            }
        }
    }

    /// Whether a sticky fault poisoned the context.
    pub fn is_poisoned(&self) -> bool {
        matches!(self, ContextState::Poisoned { .. })
    }

    /// Lets a command that touches the device through, or says why not.
    pub fn admit(&self) -> Result<(), ServerError> {
        match self {
            ContextState::Active { .. } => Ok(()),
            ContextState::Poisoned { poison, .. } => {
                Err(ServerError::ContextPoisoned(poison.clone()))
            }
        }
    }

    /// Records a sticky fault; the first one wins.
    pub(crate) fn poison(&mut self, poison: DevicePoison) {
        if let ContextState::Active { generation } = *self {
            *self = ContextState::Poisoned { generation, poison };
        }
    }
}

#[cfg(test)]
mod tests {
    use cistern_memory::BackTrace;

    use super::*;

    fn fault(status: &str) -> DevicePoison {
        DevicePoison {
            ordinal: 0,
            generation: 0,
            operation: "launch trap".into(),
            status: status.into(),
            backtrace: BackTrace::none(),
        }
    }

    #[test]
    fn a_poisoned_context_refuses_with_its_first_fault() {
        let mut state = ContextState::Active { generation: 4 };
        assert!(state.admit().is_ok());
        state.poison(fault("first"));
        state.poison(fault("second"));
        assert_eq!(state.generation(), 4);
        assert_eq!(
            state.admit(),
            Err(ServerError::ContextPoisoned(fault("first")))
        );
    }
}
