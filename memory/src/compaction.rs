//! `CompactionPlan` and `Relocation`: the moves a compaction asks the caller to copy.

use crate::{AllocationId, SliceLocation};

/// One allocation to move: copy `from.size` bytes from `from` to `to`, then commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Relocation {
    /// The allocation; its id stays valid and names the new location after commit.
    pub id: AllocationId,
    /// Where its bytes are now.
    pub from: SliceLocation,
    /// Where they go (reserved for the move until commit or abort).
    pub to: SliceLocation,
}

/// Moves that evacuate sparse pages. Copy every move's bytes, then
/// `commit_compaction`; or `abort_compaction` to leave everything as it was.
/// Only the latest plan can be committed.
#[derive(Debug)]
pub struct CompactionPlan {
    /// The moves, in no particular order; empty when nothing is worth moving.
    pub moves: Vec<Relocation>,
    pub(crate) ticket: u64,
    /// Per move: (source slice, destination slice).
    pub(crate) slices: Vec<(u32, u32)>,
    /// The pages being evacuated, released at commit if empty.
    pub(crate) pages: Vec<u32>,
}

impl CompactionPlan {
    /// Whether the plan moves nothing.
    pub fn is_empty(&self) -> bool {
        self.moves.is_empty()
    }
}
