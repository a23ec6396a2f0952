//! The pools: pages carved into slices, and the free-space index over them.
//!
//! Machinery only; the public value types live in `ids`, `stats`, `snapshot`.

mod exclusive;
mod index;
mod pages;
mod records;
mod sliced;

pub(crate) use records::{SizeClass, SliceState};

use records::CLASSES;

use std::collections::BTreeSet;

use index::FreeIndex;
use records::{PageArena, SliceArena};

/// Every page and slice the manager holds, with the free-space structures of
/// both pools and running totals.
pub(crate) struct Pools {
    pub(crate) slices: SliceArena,
    pub(crate) pages: PageArena,
    /// Free slices of sliced pages, one index per size class.
    index: [FreeIndex; CLASSES],
    /// Free exclusive pages (the empty ones) by (size, page key): best fit
    /// in O(log n).
    exclusive_free: BTreeSet<(u64, u32)>,
    /// Sliced pages that hold nothing, per size class, by (size, page key).
    empty_sliced: [BTreeSet<(u64, u32)>; CLASSES],
    pub(crate) totals: Totals,
}

/// Running totals kept in step with every page and slice change.
#[derive(Default)]
pub(crate) struct Totals {
    pub(crate) reserved: u64,
    pub(crate) unbacked: u64,
    /// Bytes of sliced pages per size class.
    pub(crate) class_reserved: [u64; CLASSES],
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
            index: std::array::from_fn(|_| FreeIndex::new(alignment)),
            exclusive_free: BTreeSet::new(),
            empty_sliced: std::array::from_fn(|_| BTreeSet::new()),
            totals: Totals::default(),
        }
    }
}
