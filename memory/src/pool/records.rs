//! Slice and page records in arenas with stable keys: a split or a merge
//! never renumbers a live slice, and a released page never shifts another.

use crate::StorageId;
use crate::snapshot::PoolKind;

/// The key no record has: the end of a neighbour or free-list chain.
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SliceState {
    Free,
    Allocated,
    /// Freed while streams still use it.
    Pending,
    /// Reserved as a compaction destination.
    Target,
}

/// Which requests a sliced page serves. Small and large requests never share
/// a page, so long-lived small slices do not pin the space large ones free.
/// The virtual range serves every request of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SizeClass {
    Small,
    Large,
    Virtual,
}

/// How many size classes there are (free indexes and per-class totals).
pub(crate) const CLASSES: usize = 3;

impl SizeClass {
    /// The position of the class's free index.
    pub(crate) fn index(self) -> usize {
        match self {
            SizeClass::Small => 0,
            SizeClass::Large => 1,
            SizeClass::Virtual => 2,
        }
    }
}

/// A slice of a page, linked to its address neighbours (boundary tags) and,
/// while free, to the other free slices of its size class.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slice {
    pub(crate) offset: u64,
    pub(crate) size: u64,
    pub(crate) page: u32,
    pub(crate) prev: u32,
    pub(crate) next: u32,
    pub(crate) link_prev: u32,
    pub(crate) link_next: u32,
    pub(crate) state: SliceState,
    /// Its page's class, kept here so the hot path reads one record.
    pub(crate) class: SizeClass,
}

#[derive(Default)]
pub(crate) struct SliceArena {
    slots: Vec<Slice>,
    vacant: Vec<u32>,
}

impl SliceArena {
    pub(crate) fn insert(&mut self, slice: Slice) -> u32 {
        match self.vacant.pop() {
            Some(key) => {
                self.slots[key as usize] = slice;
                key
            }
            None => {
                self.slots.push(slice);
                (self.slots.len() - 1) as u32
            }
        }
    }

    pub(crate) fn remove(&mut self, key: u32) {
        self.vacant.push(key);
    }

    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.vacant.clear();
    }
}

impl std::ops::Index<u32> for SliceArena {
    type Output = Slice;
    fn index(&self, key: u32) -> &Slice {
        &self.slots[key as usize]
    }
}

impl std::ops::IndexMut<u32> for SliceArena {
    fn index_mut(&mut self, key: u32) -> &mut Slice {
        &mut self.slots[key as usize]
    }
}

/// One storage allocation and the bookkeeping of what its slices hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Page {
    pub(crate) size: u64,
    /// `None` until a dry-run page is first resolved.
    pub(crate) storage: Option<StorageId>,
    pub(crate) kind: PoolKind,
    /// The slice at offset 0; the others follow by `next`.
    pub(crate) first: u32,
    /// Slices that are not free (allocated, pending or compaction targets),
    /// and their bytes; not kept for the virtual range (see `Pools::held_bytes`).
    pub(crate) held_slices: u32,
    pub(crate) held_bytes: u64,
    /// The requests its slices serve (sliced pages; exclusive pages say large).
    pub(crate) class: SizeClass,
}

#[derive(Default)]
pub(crate) struct PageArena {
    slots: Vec<Option<Page>>,
    vacant: Vec<u32>,
}

impl PageArena {
    pub(crate) fn insert(&mut self, page: Page) -> u32 {
        match self.vacant.pop() {
            Some(key) => {
                self.slots[key as usize] = Some(page);
                key
            }
            None => {
                self.slots.push(Some(page));
                (self.slots.len() - 1) as u32
            }
        }
    }

    pub(crate) fn remove(&mut self, key: u32) -> Option<Page> {
        let page = self.slots.get_mut(key as usize)?.take();
        if page.is_some() {
            self.vacant.push(key);
        }
        page
    }

    pub(crate) fn get(&self, key: u32) -> Option<&Page> {
        self.slots.get(key as usize)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, key: u32) -> Option<&mut Page> {
        self.slots.get_mut(key as usize)?.as_mut()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Page)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(key, page)| page.as_ref().map(|page| (key as u32, page)))
    }

    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.vacant.clear();
    }
}
