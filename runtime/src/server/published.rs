//! The context's (generation, health), published by the server on every
//! transition in one atomic word that clients read without a round trip.
//!
//! A reader sees a state the context was in at some moment at or after its
//! last command was answered: good enough to refuse early (a store checks
//! it at every entry), never a substitute for the server's own gate.

use serde::{Deserialize, Serialize};

use crate::context_state::ContextState;
use crate::sync::Arc;
use crate::sync::atomic::{AtomicU64, Ordering};

/// The health of a device context, without the details of its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Health {
    /// Normal work.
    Active,
    /// A sticky fault was seen: invalidate, then take fresh handles.
    Poisoned,
    /// An invalidate is draining and probing: retry shortly.
    Retiring,
    /// Recovery failed: restart the process.
    Unrecoverable,
    /// One stream is recording a graph: other work retries shortly.
    Capturing,
}

/// The published state: a context's generation and health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceState {
    /// The context generation; handles of any other are stale.
    pub generation: u64,
    /// What the context does with work now.
    pub health: Health,
}

impl DeviceState {
    /// The published form of `state`.
    pub fn of(state: &ContextState) -> Self {
        let health = match state {
            ContextState::Active { .. } => Health::Active,
            ContextState::Poisoned { .. } => Health::Poisoned,
            ContextState::Retiring { .. } => Health::Retiring,
            ContextState::Unrecoverable { .. } => Health::Unrecoverable,
            ContextState::Capturing { .. } => Health::Capturing,
        };
        DeviceState {
            generation: state.generation(),
            health,
        }
    }

    fn pack(self) -> u64 {
        let health = match self.health {
            Health::Active => 0,
            Health::Poisoned => 1,
            Health::Retiring => 2,
            Health::Unrecoverable => 3,
            Health::Capturing => 4,
        };
        (self.generation << 3) | health
    }

    fn unpack(word: u64) -> Self {
        let health = match word & 0b111 {
            0 => Health::Active,
            1 => Health::Poisoned,
            2 => Health::Retiring,
            4 => Health::Capturing,
            _ => Health::Unrecoverable,
        };
        DeviceState {
            generation: word >> 3,
            health,
        }
    }
}

/// A context's published state, shared by its server (the writer) and
/// every client (readers); cheap to clone.
#[derive(Clone, Debug)]
pub struct PublishedState(Arc<AtomicU64>);

impl PublishedState {
    /// A state that reads `state` until the server publishes another.
    pub(crate) fn new(state: &ContextState) -> Self {
        PublishedState(Arc::new(AtomicU64::new(DeviceState::of(state).pack())))
    }

    /// The state last published; never waits.
    pub fn read(&self) -> DeviceState {
        DeviceState::unpack(self.0.load(Ordering::Acquire))
    }

    pub(crate) fn publish(&self, state: &ContextState) {
        self.0
            .store(DeviceState::of(state).pack(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use cistern_memory::{BackTrace, DevicePoison, StreamId};

    use super::*;

    #[test]
    fn every_state_reads_back_as_published() {
        let poison = DevicePoison {
            ordinal: 0,
            generation: 7,
            operation: "launch trap".into(),
            status: "trapped".into(),
            backtrace: BackTrace::none(),
        };
        let states = [
            ContextState::Active { generation: 0 },
            ContextState::Poisoned {
                generation: 7,
                poison,
            },
            ContextState::Retiring { generation: 7 },
            ContextState::Unrecoverable {
                generation: 8,
                probe_error: "mismatch".into(),
            },
            ContextState::Capturing {
                generation: u64::MAX >> 3,
                stream: StreamId(2),
            },
        ];
        let published = PublishedState::new(&states[0]);
        for state in &states {
            published.publish(state);
            assert_eq!(published.read(), DeviceState::of(state));
            assert_eq!(published.read().generation, state.generation());
        }
    }
}
