//! `ContextState`: the health of a device context, as every part names it
//! (commands answer with it, the server's gate holds it), and the one
//! check of work against it (`admit`). The transitions between states are
//! `server/context.rs`'s alone.

use cistern_memory::{DevicePoison, StreamId};
use serde::{Deserialize, Serialize};

use crate::error::ServerError;

/// The state of one device's context.
///
/// Serializable; new variants go last (bincode encodes variants by position).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContextState {
    /// Normal work in `generation`.
    Active {
        /// The context generation; handles from older ones are stale.
        generation: u64,
    },
    /// A sticky fault was seen: every entry point refuses with it until
    /// `invalidate(generation)`.
    Poisoned {
        /// The generation the fault happened in.
        generation: u64,
        /// What faulted, where and with what status; every refusal carries it.
        poison: DevicePoison,
    },
    /// `invalidate` is draining the streams and probing the device; work is
    /// refused with the transient `ContextRetiring`.
    Retiring {
        /// The poisoned generation being retired.
        generation: u64,
    },
    /// Recovery failed: every call is refused with `ContextUnrecoverable`
    /// for the life of the process.
    Unrecoverable {
        /// The generation that could not be recovered.
        generation: u64,
        /// Why the drain, the sync or the probe failed.
        probe_error: String,
    },
    /// One capture is recording launches on `stream`: every other entry
    /// point is refused with the transient `CaptureInProgress`.
    Capturing {
        /// The context generation; the graph will belong to it.
        generation: u64,
        /// The only stream whose work the capture records.
        stream: StreamId,
    },
}

impl ContextState {
    /// The context generation now.
    pub fn generation(&self) -> u64 {
        match self {
            ContextState::Active { generation }
            | ContextState::Poisoned { generation, .. }
            | ContextState::Retiring { generation }
            | ContextState::Unrecoverable { generation, .. }
            | ContextState::Capturing { generation, .. } => *generation,
        }
    }

    /// Whether the context runs work.
    pub fn is_active(&self) -> bool {
        matches!(self, ContextState::Active { .. })
    }

    /// Whether a sticky fault poisoned the context (and no invalidate has begun).
    pub fn is_poisoned(&self) -> bool {
        matches!(self, ContextState::Poisoned { .. })
    }

    /// Whether a graph capture is recording.
    pub fn is_capturing(&self) -> bool {
        matches!(self, ContextState::Capturing { .. })
    }

    /// Whether recovery failed for good.
    pub fn is_unrecoverable(&self) -> bool {
        matches!(self, ContextState::Unrecoverable { .. })
    }

    /// The state's name, as traces show it.
    pub fn name(&self) -> &'static str {
        match self {
            ContextState::Active { .. } => "active",
            ContextState::Poisoned { .. } => "poisoned",
            ContextState::Retiring { .. } => "retiring",
            ContextState::Unrecoverable { .. } => "unrecoverable",
            ContextState::Capturing { .. } => "capturing",
        }
    }

    /// Lets a command that touches device `ordinal` through, or says why not.
    pub fn admit(&self, ordinal: usize) -> Result<(), ServerError> {
        match self {
            ContextState::Active { .. } => Ok(()),
            ContextState::Poisoned { poison, .. } => {
                Err(ServerError::ContextPoisoned(poison.clone()))
            }
            ContextState::Retiring { .. } => Err(ServerError::ContextRetiring { ordinal }),
            ContextState::Unrecoverable { probe_error, .. } => {
                Err(ServerError::ContextUnrecoverable {
                    ordinal,
                    probe_error: probe_error.clone(),
                })
            }
            ContextState::Capturing { .. } => Err(ServerError::CaptureInProgress { ordinal }),
        }
    }
}
