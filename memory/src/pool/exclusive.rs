//! The exclusive pool: one request per page; free pages reused by requests
//! that waste at most a bounded fraction of them.

use super::Pools;
use super::records::{SizeClass, SliceState};
use crate::snapshot::PoolKind;

impl Pools {
    /// Takes the smallest free exclusive page that fits `size` bytes and
    /// wastes at most `max_waste_percent` of itself; returns its slice.
    pub(crate) fn take_exclusive(&mut self, size: u64, max_waste_percent: u64) -> Option<u32> {
        let &(page_size, page) = self.exclusive_free.range((size, 0)..).next()?;
        let waste = page_size - size;
        if waste.saturating_mul(100) > page_size.saturating_mul(max_waste_percent) {
            return None;
        }
        self.exclusive_free.remove(&(page_size, page));
        self.totals.exclusive_free_bytes -= page_size;
        let slice = self.pages.get(page)?.first;
        self.set_held(slice, SliceState::Allocated);
        Some(slice)
    }

    /// Adds an exclusive page and takes its slice at once.
    pub(crate) fn add_exclusive_page(
        &mut self,
        size: u64,
        storage: Option<crate::StorageId>,
    ) -> u32 {
        let (_, slice) = self.add_page(size, storage, PoolKind::Exclusive, SizeClass::Large);
        self.set_held(slice, SliceState::Allocated);
        slice
    }

    /// Frees an exclusive page's slice: the page waits for reuse. Returns
    /// whether the page now holds nothing (always, as it holds one slice).
    pub(crate) fn release_exclusive(&mut self, slice: u32) -> bool {
        let emptied = self.set_held(slice, SliceState::Free);
        let page = self.slices[slice].page;
        let size = self.slices[slice].size;
        self.exclusive_free.insert((size, page));
        self.totals.exclusive_free_bytes += size;
        emptied
    }
}
