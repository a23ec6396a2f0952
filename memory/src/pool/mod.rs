//! The pools: pages carved into slices, and the free-space index over them.
//!
//! Machinery only; the public value types live in `ids`, `stats`, `snapshot`.

mod exclusive;
mod index;
mod pages;
mod records;
mod sliced;

pub(crate) use records::SliceState;

use std::collections::BTreeSet;

use index::FreeIndex;
use records::{PageArena, SliceArena};

/// Every page and slice the manager holds, with the free-space structures of
/// both pools and running totals.
pub(crate) struct Pools {
    pub(crate) slices: SliceArena,
    pub(crate) pages: PageArena,
    index: FreeIndex,
    /// Free exclusive pages by (size, page key): best fit in O(log n).
    exclusive_free: BTreeSet<(u64, u32)>,
    /// Pages of either pool that hold nothing, by (size, page key).
    empty: BTreeSet<(u64, u32)>,
    pub(crate) totals: Totals,
}

/// Running totals kept in step with every page and slice change.
#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) reserved: u64,
    pub(crate) unbacked: u64,
    pub(crate) sliced_reserved: u64,
    pub(crate) sliced_pages: u64,
    pub(crate) exclusive_pages: u64,
    pub(crate) exclusive_free_bytes: u64,
    /// Bytes of pages that hold nothing.
    pub(crate) empty_bytes: u64,
    /// Sliced page sizes held, with how many pages have each.
    pub(crate) page_sizes: Vec<(u64, u32)>,
}

impl Pools {
    pub(crate) fn new(alignment: u64) -> Self {
        Pools {
            slices: SliceArena::default(),
            pages: PageArena::default(),
            index: FreeIndex::new(alignment),
            exclusive_free: BTreeSet::new(),
            empty: BTreeSet::new(),
            totals: Totals::default(),
        }
    }
}
