//! `MemorySnapshot`: every page and slice, for debugging and plots.

use serde::{Deserialize, Serialize};

use crate::{AllocationId, StorageId};

/// Which pool a page belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PoolKind {
    /// Pages split into slices for small and medium requests.
    Sliced,
    /// One large request per page.
    Exclusive,
    /// An address range backed chunk by chunk where the storage can map;
    /// its `size` is address space, not memory held.
    Virtual,
}

/// What a slice is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SliceUse {
    /// Free: reusable by any request.
    Free,
    /// Held by a live allocation.
    Allocated {
        /// The allocation holding it (ids are never reused).
        id: AllocationId,
        /// Bytes the caller asked for.
        requested: u64,
        /// Referenced by a captured graph: never moves.
        pinned: bool,
    },
    /// Freed, but streams that used it have not completed yet.
    PendingFree,
    /// The destination of a planned, uncommitted compaction move.
    CompactionTarget,
}

/// One slice of a page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceSnapshot {
    /// Byte offset in the page.
    pub offset: u64,
    /// Bytes spanned.
    pub size: u64,
    /// What it holds.
    pub state: SliceUse,
}

/// One page (one storage buffer) and its slices in address order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageSnapshot {
    /// The storage buffer; `None` for a dry-run page not yet backed.
    pub storage: Option<StorageId>,
    /// The pool that carved it.
    pub pool: PoolKind,
    /// The page's bytes (address space, for the virtual range).
    pub size: u64,
    /// Its slices, covering the page without gaps.
    pub slices: Vec<SliceSnapshot>,
}

/// Every page the manager holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySnapshot {
    /// The storage alignment every slice honours.
    pub alignment: u64,
    /// The pages, in no particular order.
    pub pages: Vec<PageSnapshot>,
}
