//! Frees deferred until the streams that used a slice complete.
//!
//! A freed slice with uses still in flight is pending: it is released when
//! every such stream reports completion past its last use. While exactly one
//! stream has uses in flight, a reservation on that same stream may take it
//! at once: the stream's own order keeps the old work before the new.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use crate::{IdMap, StreamId};

#[derive(Default)]
struct StreamState {
    completed: Option<u64>,
    /// (sequence, ticket, slice): pending frees waiting on this stream.
    fences: BinaryHeap<Reverse<(u64, u64, u32)>>,
    /// (size, slice): pending slices this stream alone still uses.
    reusable: BTreeSet<(u64, u32)>,
}

struct PendingFree {
    ticket: u64,
    outstanding: u32,
    size: u64,
    only: Option<(StreamId, u64)>,
}

#[derive(Default)]
pub(crate) struct Streams {
    states: IdMap<StreamId, StreamState>,
    pending: IdMap<u32, PendingFree>,
    next_ticket: u64,
    pending_bytes: u64,
    reusable: usize,
}

impl Streams {
    pub(crate) fn is_done(&self, stream: StreamId, sequence: u64) -> bool {
        self.states
            .get(&stream)
            .and_then(|state| state.completed)
            .is_some_and(|completed| completed >= sequence)
    }

    /// The uses still in flight among `uses`.
    pub(crate) fn in_flight(&self, uses: &[(StreamId, u64)]) -> Vec<(StreamId, u64)> {
        uses.iter()
            .copied()
            .filter(|&(stream, sequence)| !self.is_done(stream, sequence))
            .collect()
    }

    /// Whether any of `uses` is still in flight.
    pub(crate) fn any_in_flight(&self, uses: &[(StreamId, u64)]) -> bool {
        uses.iter()
            .any(|&(stream, sequence)| !self.is_done(stream, sequence))
    }

    /// Defers the release of `slice` until every use in `in_flight` (non-empty) completes.
    pub(crate) fn defer(&mut self, slice: u32, size: u64, in_flight: &[(StreamId, u64)]) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let only = match in_flight {
            [single] => Some(*single),
            _ => None,
        };
        for &(stream, sequence) in in_flight {
            let state = self.states.entry(stream).or_default();
            state.fences.push(Reverse((sequence, ticket, slice)));
        }
        if let Some((stream, _)) = only {
            self.states
                .entry(stream)
                .or_default()
                .reusable
                .insert((size, slice));
            self.reusable += 1;
        }
        self.pending.insert(
            slice,
            PendingFree {
                ticket,
                outstanding: in_flight.len() as u32,
                size,
                only,
            },
        );
        self.pending_bytes += size;
    }

    /// Takes a pending slice that `stream` alone still uses, of at least
    /// `size` bytes and wasting at most a quarter of itself. Returns the
    /// slice and the use it carries over to its new allocation.
    pub(crate) fn take_reusable(&mut self, stream: StreamId, size: u64) -> Option<(u32, u64)> {
        if self.reusable == 0 {
            return None;
        }
        let state = self.states.get_mut(&stream)?;
        let &(slice_size, slice) = state.reusable.range((size, 0)..).next()?;
        if (slice_size - size) * 4 > slice_size {
            return None;
        }
        state.reusable.remove(&(slice_size, slice));
        self.reusable -= 1;
        let pending = self.pending.remove(&slice)?;
        self.pending_bytes -= pending.size;
        pending.only.map(|(_, sequence)| (slice, sequence))
    }

    /// Records that `stream` completed every use up to `sequence`; returns
    /// the slices whose frees may now be released.
    pub(crate) fn complete(&mut self, stream: StreamId, sequence: u64) -> Vec<u32> {
        let state = self.states.entry(stream).or_default();
        state.completed = Some(state.completed.map_or(sequence, |c| c.max(sequence)));
        let mut passed = Vec::new();
        while let Some(&Reverse((fence, ticket, slice))) = state.fences.peek() {
            if fence > sequence {
                break;
            }
            state.fences.pop();
            passed.push((ticket, slice));
        }
        let mut released = Vec::new();
        for (ticket, slice) in passed {
            let Some(pending) = self.pending.get_mut(&slice) else {
                continue;
            };
            if pending.ticket != ticket {
                continue;
            }
            pending.outstanding -= 1;
            if pending.outstanding > 0 {
                continue;
            }
            let size = pending.size;
            if let Some((only, _)) = pending.only
                && let Some(state) = self.states.get_mut(&only)
                && state.reusable.remove(&(size, slice))
            {
                self.reusable -= 1;
            }
            self.pending.remove(&slice);
            self.pending_bytes -= size;
            released.push(slice);
        }
        released
    }

    pub(crate) fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Forgets every pending free (their slices are gone); completions are kept.
    pub(crate) fn clear_pending(&mut self) {
        for state in self.states.values_mut() {
            state.fences.clear();
            state.reusable.clear();
        }
        self.pending.clear();
        self.pending_bytes = 0;
        self.reusable = 0;
    }
}
