//! The sliced pool: best fit from the free index, split on take, merge with
//! free neighbours at once on release.

use super::Pools;
use super::records::{NIL, SizeClass, Slice, SliceState};

impl Pools {
    /// Takes a free slice of exactly `size` bytes (a multiple of the
    /// alignment) from the pages of `class`, splitting a larger one; `None`
    /// if no free slice there is large enough.
    pub(crate) fn take_sliced(&mut self, size: u64, class: SizeClass) -> Option<u32> {
        let key = self.index[class.index()].find(&self.slices, size)?;
        self.take_free_slice(key, size);
        Some(key)
    }

    /// Takes the free slice `key` (in the index) for `size` of its bytes,
    /// returning the rest to the index.
    pub(crate) fn take_free_slice(&mut self, key: u32, size: u64) {
        let slice = self.slices[key];
        let index = &mut self.index[slice.class.index()];
        index.remove(&mut self.slices, key);
        debug_assert!(slice.size >= size && slice.state == SliceState::Free);
        if slice.size > size {
            let rest = self.slices.insert(Slice {
                offset: slice.offset + size,
                size: slice.size - size,
                page: slice.page,
                prev: key,
                next: slice.next,
                link_prev: NIL,
                link_next: NIL,
                state: SliceState::Free,
                class: slice.class,
            });
            if slice.next != NIL {
                self.slices[slice.next].prev = rest;
            }
            self.slices[key].next = rest;
            self.slices[key].size = size;
            index.insert(&mut self.slices, rest);
        }
        self.set_held(key, SliceState::Allocated);
    }

    /// Frees a held slice of a sliced page, merging it with free neighbours.
    /// Returns whether the page now holds nothing.
    pub(crate) fn release_sliced(&mut self, key: u32) -> bool {
        self.release_and_merge(key).0
    }

    /// Like `release_sliced`, also returning the key of the merged free slice.
    pub(crate) fn release_and_merge(&mut self, key: u32) -> (bool, u32) {
        let emptied = self.set_held(key, SliceState::Free);
        let index = &mut self.index[self.slices[key].class.index()];
        let next = self.slices[key].next;
        if next != NIL && self.slices[next].state == SliceState::Free {
            index.remove(&mut self.slices, next);
            let absorbed = self.slices[next];
            self.slices[key].size += absorbed.size;
            self.slices[key].next = absorbed.next;
            if absorbed.next != NIL {
                self.slices[absorbed.next].prev = key;
            }
            self.slices.remove(next);
        }
        let prev = self.slices[key].prev;
        let mut key = key;
        if prev != NIL && self.slices[prev].state == SliceState::Free {
            index.remove(&mut self.slices, prev);
            let absorbed = self.slices[key];
            self.slices[prev].size += absorbed.size;
            self.slices[prev].next = absorbed.next;
            if absorbed.next != NIL {
                self.slices[absorbed.next].prev = prev;
            }
            self.slices.remove(key);
            key = prev;
        }
        index.insert(&mut self.slices, key);
        (emptied, key)
    }

    /// Takes the free slices of `pages` out of the index (a compaction must
    /// not place slices there) and returns them for `restore_free`.
    pub(crate) fn withhold_free(&mut self, pages: &[u32]) -> Vec<u32> {
        let mut withheld = Vec::new();
        for &page in pages {
            let free: Vec<u32> = self
                .page_slices(page)
                .filter(|(_, slice)| slice.state == SliceState::Free)
                .map(|(key, _)| key)
                .collect();
            for key in free {
                let class = self.slices[key].class;
                self.index[class.index()].remove(&mut self.slices, key);
                withheld.push(key);
            }
        }
        withheld
    }

    /// Puts slices taken out by `withhold_free` back into the index.
    pub(crate) fn restore_free(&mut self, withheld: Vec<u32>) {
        for key in withheld {
            let class = self.slices[key].class;
            self.index[class.index()].insert(&mut self.slices, key);
        }
    }
}
