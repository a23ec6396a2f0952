//! The invariants checked after every step: the context's transitions and
//! generation, and the memory manager's accounting and layout.

use std::collections::HashMap;

use cistern::memory::SliceUse;
use cistern::runtime::{AllocationId, ContextState, ServerCore};

use super::model::Client;
use super::world::{Failure, Faults};
use cistern::runtime::testing::{TestBackend, TestDevice};

/// The context as last seen, and the recoveries counted so far.
pub struct Watch {
    last: ContextState,
    recoveries: u64,
}

impl Watch {
    /// Starts watching from `state`.
    pub fn new(state: &ContextState) -> Self {
        Watch {
            last: state.clone(),
            recoveries: 0,
        }
    }

    /// The generation as last seen.
    pub fn generation(&self) -> u64 {
        self.last.generation()
    }

    /// The context moved only along the state machine's arrows, the
    /// generation only by one per recovery, and a recovery ended as the
    /// probe faults left say (three failed probes in a row, a sticky or a
    /// mismatched one: unrecoverable). True when a recovery ended as
    /// predicted.
    pub fn check(
        &mut self,
        core: &ServerCore<TestBackend>,
        device: &TestDevice,
        faults: &mut Faults,
    ) -> Result<bool, Failure> {
        let now = core.context().clone();
        let (old, new) = (self.last.generation(), now.generation());
        if new != old {
            if new != old + 1 {
                return Err(format!("the generation went from {old} to {new}"));
            }
            // A recovery that ended as a capture began ends in capturing.
            if !matches!(self.last, ContextState::Retiring { .. })
                || !(now.is_active() || now.is_capturing())
            {
                return Err(format!(
                    "the generation advanced from {} to {}",
                    self.last.name(),
                    now.name()
                ));
            }
            self.recoveries += 1;
        }
        let arrow = (self.last.name(), now.name());
        let allowed = arrow.0 == arrow.1
            || matches!(
                arrow,
                ("active", "poisoned")
                    | ("poisoned", "retiring")
                    // A fault taken and an invalidate handled in one command.
                    | ("active", "retiring")
                    | ("retiring", "active")
                    | ("retiring", "unrecoverable")
                    | ("active", "capturing")
                    | ("capturing", "active")
                    | ("capturing", "poisoned")
                    | ("capturing", "retiring")
                    | ("retiring", "capturing")
            );
        if !allowed {
            return Err(format!("the context went from {} to {}", arrow.0, arrow.1));
        }
        let mut predicted = false;
        if arrow.0 == "retiring" && arrow.1 != "retiring" {
            if let Some(fails) = faults.next_recovery_fails() {
                if fails != now.is_unrecoverable() {
                    return Err(format!(
                        "the probe faults say the recovery {}, but it ended {now:?}",
                        if fails { "fails" } else { "succeeds" }
                    ));
                }
                predicted = true;
            }
        }
        if now.is_poisoned() && !faults.trap_possible(new) {
            return Err(format!("generation {new} was poisoned without a trap"));
        }
        if now.is_unrecoverable() && !faults.unrecoverable_possible() {
            return Err(format!("the recovery failed without a cause: {now:?}"));
        }
        let resets = device.reset_generations().len() as u64;
        if resets < self.recoveries {
            return Err(format!(
                "{} recoveries but only {resets} device resets",
                self.recoveries,
            ));
        }
        self.last = now;
        Ok(predicted)
    }

    /// Accounting within limits; pages covered by slices without overlap;
    /// every buffer the model holds live is allocated, once, at its size.
    pub fn check_memory(
        &self,
        core: &ServerCore<TestBackend>,
        clients: &[Client],
        generation: u64,
    ) -> Result<(), Failure> {
        let memory = core.memory();
        let stats = memory.stats();
        if stats.in_use_bytes > stats.reserved_bytes || stats.reserved_bytes > stats.limit_bytes {
            return Err(format!(
                "in use {} / reserved {} / limit {}",
                stats.in_use_bytes, stats.reserved_bytes, stats.limit_bytes
            ));
        }
        let snapshot = memory.snapshot();
        let mut allocated: HashMap<AllocationId, u64> = HashMap::new();
        for page in &snapshot.pages {
            let mut end = 0;
            let mut slices: Vec<_> = page.slices.iter().collect();
            slices.sort_by_key(|slice| slice.offset);
            for slice in slices {
                if slice.offset != end {
                    return Err(format!(
                        "a page of {} bytes has a slice at {} after one ending at {end}",
                        page.size, slice.offset
                    ));
                }
                end = slice.offset + slice.size;
                if let SliceUse::Allocated { id, requested, .. } = slice.state {
                    if requested > slice.size {
                        return Err(format!(
                            "{id:?} asks {requested} of a {}-byte slice",
                            slice.size
                        ));
                    }
                    if allocated.insert(id, requested).is_some() {
                        return Err(format!("{id:?} is allocated twice"));
                    }
                }
            }
            if end != page.size {
                return Err(format!("a page of {} bytes is covered to {end}", page.size));
            }
        }
        if allocated.len() as u64 != stats.live_allocations {
            return Err(format!(
                "{} allocated slices but {} live allocations",
                allocated.len(),
                stats.live_allocations
            ));
        }
        if matches!(
            core.context(),
            ContextState::Retiring { .. } | ContextState::Unrecoverable { .. }
        ) {
            // The old generation may already be released; the model learns
            // that when the generation changes (or never, when lost).
            return Ok(());
        }
        for client in clients {
            for buffer in &client.live {
                if buffer.handle.generation != generation {
                    continue;
                }
                match allocated.get(&buffer.handle.id) {
                    Some(&requested) if requested == buffer.size => {}
                    other => {
                        return Err(format!(
                            "live {:?} of {} bytes is {other:?} in the snapshot",
                            buffer.handle.id, buffer.size
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
