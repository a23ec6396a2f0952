//! `ContextState`: the health of a device context, the entry gate every
//! command passes, and the transitions between states.
//!
//! The arrows (see `docs/state-machine.md`): `Active → Poisoned` on a sticky
//! fault; `Poisoned → Retiring` on `invalidate(seen)` with the poisoned
//! generation; `Retiring → Active(generation + 1)` when the drain, the sync
//! and the probe pass; `Retiring → Unrecoverable` when any of them fails;
//! `Active → Capturing` on `BeginCapture`, `Capturing → Active` when the
//! capture ends or is discarded, `Capturing → Poisoned` on a sticky fault of
//! work queued before it. The gate stays the one place that refuses work.

use cistern_memory::{DevicePoison, StreamId};

use super::published::PublishedState;
use crate::context_state::ContextState;
use crate::error::ServerError;

/// One device's context state and the only code that changes it; every
/// change is traced with the ordinal, both states and the generation.
#[derive(Debug)]
pub(crate) struct Context {
    ordinal: usize,
    state: ContextState,
    /// Every change is published here, for clients to read without a round trip.
    published: PublishedState,
}

impl Context {
    /// An active context in generation 0.
    pub(crate) fn new(ordinal: usize) -> Self {
        let state = ContextState::Active { generation: 0 };
        Context {
            ordinal,
            published: PublishedState::new(&state),
            state,
        }
    }

    /// The published state, for clients.
    pub(crate) fn published(&self) -> &PublishedState {
        &self.published
    }

    /// The state now.
    pub(crate) fn state(&self) -> &ContextState {
        &self.state
    }

    /// The entry gate of every command that touches the device.
    pub(crate) fn admit(&self) -> Result<(), ServerError> {
        self.state.admit(self.ordinal)
    }

    /// The context generation now.
    pub(crate) fn generation(&self) -> u64 {
        self.state.generation()
    }

    /// `Active → Poisoned` (or `Capturing → Poisoned`, which discards the
    /// capture). Only a working context is poisoned: the first fault wins,
    /// and a fault met while retiring (the old generation's work, or the
    /// probe's) is the recovery's business.
    pub(crate) fn poison(&mut self, poison: DevicePoison) {
        if let ContextState::Active { generation } | ContextState::Capturing { generation, .. } =
            self.state
        {
            self.change(ContextState::Poisoned { generation, poison });
        }
    }

    /// `Active → Capturing` on `stream`; false (and no change) in any other state.
    pub(crate) fn begin_capture(&mut self, stream: StreamId) -> bool {
        match self.state {
            ContextState::Active { generation } => {
                self.change(ContextState::Capturing { generation, stream });
                true
            }
            _ => false,
        }
    }

    /// `Capturing → Active`; no change in any other state (a capture a
    /// fault discarded leaves the context poisoned).
    pub(crate) fn end_capture(&mut self) {
        if let ContextState::Capturing { generation, .. } = self.state {
            self.change(ContextState::Active { generation });
        }
    }

    /// `Poisoned → Retiring`; false (and no change) in any other state.
    pub(crate) fn retire(&mut self) -> bool {
        match self.state {
            ContextState::Poisoned { generation, .. } => {
                self.change(ContextState::Retiring { generation });
                true
            }
            _ => false,
        }
    }

    /// `Retiring → Active(generation + 1)`.
    pub(crate) fn recover(&mut self) {
        if let ContextState::Retiring { generation } = self.state {
            self.change(ContextState::Active {
                generation: generation + 1,
            });
        } else {
            debug_assert!(false, "only a retiring context recovers");
        }
    }

    /// `Retiring → Unrecoverable`, for the life of the process.
    pub(crate) fn fail(&mut self, probe_error: String) {
        if let ContextState::Retiring { generation } = self.state {
            self.change(ContextState::Unrecoverable {
                generation,
                probe_error,
            });
        } else {
            debug_assert!(false, "only a retiring context fails its recovery");
        }
    }

    fn change(&mut self, new: ContextState) {
        let old = std::mem::replace(&mut self.state, new);
        self.published.publish(&self.state);
        let new = &self.state;
        match new {
            ContextState::Active { .. }
            | ContextState::Retiring { .. }
            | ContextState::Capturing { .. } => tracing::info!(
                device = self.ordinal,
                old = old.name(),
                new = new.name(),
                old_generation = old.generation(),
                generation = new.generation(),
                "context state changed"
            ),
            ContextState::Poisoned { poison, .. } => tracing::error!(
                device = self.ordinal,
                old = old.name(),
                new = new.name(),
                old_generation = old.generation(),
                generation = new.generation(),
                code = cistern_memory::ErrorCode::DevicePoisoned.stable_id(),
                operation = %poison.operation,
                status = %poison.status,
                "context state changed: a sticky fault poisoned the device"
            ),
            ContextState::Unrecoverable { probe_error, .. } => tracing::error!(
                device = self.ordinal,
                old = old.name(),
                new = new.name(),
                old_generation = old.generation(),
                generation = new.generation(),
                code = cistern_memory::ErrorCode::DeviceLost.stable_id(),
                probe_error = %probe_error,
                "context state changed: recovery failed"
            ),
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
        let mut context = Context::new(0);
        assert!(context.admit().is_ok());
        context.poison(fault("first"));
        context.poison(fault("second"));
        assert_eq!(context.generation(), 0);
        assert_eq!(
            context.admit(),
            Err(ServerError::ContextPoisoned(fault("first")))
        );
    }

    #[test]
    fn each_state_refuses_with_its_own_error() {
        let mut context = Context::new(3);
        context.poison(fault("trap"));
        assert!(context.retire());
        assert_eq!(
            context.admit(),
            Err(ServerError::ContextRetiring { ordinal: 3 })
        );
        context.fail("mismatch".into());
        assert_eq!(
            context.admit(),
            Err(ServerError::ContextUnrecoverable {
                ordinal: 3,
                probe_error: "mismatch".into()
            })
        );
        assert!(context.state().is_unrecoverable());
    }

    #[test]
    fn only_a_poisoned_context_retires_and_recovery_advances_the_generation_once() {
        let mut context = Context::new(0);
        assert!(!context.retire());
        context.poison(fault("trap"));
        assert!(context.retire());
        assert!(!context.retire());
        context.poison(fault("the probe's own fault"));
        assert_eq!(context.state(), &ContextState::Retiring { generation: 0 });
        context.recover();
        assert_eq!(context.state(), &ContextState::Active { generation: 1 });
    }

    #[test]
    fn a_capture_begins_only_when_active_and_a_fault_ends_it_poisoned() {
        let mut context = Context::new(1);
        assert!(context.begin_capture(StreamId(0)));
        assert!(!context.begin_capture(StreamId(0)));
        assert_eq!(
            context.admit(),
            Err(ServerError::CaptureInProgress { ordinal: 1 })
        );
        context.end_capture();
        assert_eq!(context.state(), &ContextState::Active { generation: 0 });
        assert!(context.begin_capture(StreamId(2)));
        context.poison(fault("trap"));
        assert!(context.state().is_poisoned());
        context.end_capture();
        assert!(context.state().is_poisoned());
        assert!(!context.begin_capture(StreamId(2)));
    }

    #[test]
    fn states_round_trip_through_serde() {
        let states = [
            ContextState::Active { generation: 2 },
            ContextState::Poisoned {
                generation: 2,
                poison: fault("trap"),
            },
            ContextState::Retiring { generation: 2 },
            ContextState::Unrecoverable {
                generation: 2,
                probe_error: "probe mismatch".into(),
            },
            ContextState::Capturing {
                generation: 2,
                stream: StreamId(3),
            },
        ];
        for state in states {
            let json = serde_json::to_string(&state).unwrap_or_default();
            let back: Result<ContextState, _> = serde_json::from_str(&json);
            assert_eq!(back.ok(), Some(state));
        }
    }
}
