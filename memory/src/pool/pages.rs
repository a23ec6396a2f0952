//! Adding and removing pages, and walking them.

use super::records::{NIL, Page, Slice, SliceState};
use super::{Pools, Totals};
use crate::StorageId;
use crate::snapshot::PoolKind;

impl Pools {
    /// Adds a page whose one slice spans it, free. A sliced page's slice goes
    /// into the free index; an exclusive page's is handed back to the caller
    /// to take. Returns (page, slice).
    pub(crate) fn add_page(
        &mut self,
        size: u64,
        storage: Option<StorageId>,
        kind: PoolKind,
    ) -> (u32, u32) {
        let page = self.pages.insert(Page {
            size,
            storage,
            kind,
            first: NIL,
            held_slices: 0,
            held_bytes: 0,
        });
        let slice = self.slices.insert(Slice {
            offset: 0,
            size,
            page,
            prev: NIL,
            next: NIL,
            link_prev: NIL,
            link_next: NIL,
            state: SliceState::Free,
        });
        if let Some(record) = self.pages.get_mut(page) {
            record.first = slice;
        }
        self.empty.insert((size, page));
        let totals = &mut self.totals;
        totals.empty_bytes += size;
        totals.reserved += size;
        if storage.is_none() {
            totals.unbacked += size;
        }
        match kind {
            PoolKind::Sliced => {
                totals.sliced_reserved += size;
                totals.sliced_pages += 1;
                match totals.page_sizes.iter_mut().find(|(s, _)| *s == size) {
                    Some((_, count)) => *count += 1,
                    None => totals.page_sizes.push((size, 1)),
                }
                self.index.insert(&mut self.slices, slice);
            }
            PoolKind::Exclusive => totals.exclusive_pages += 1,
        }
        (page, slice)
    }

    /// Whether the page holds no slice that is in use, pending or targeted.
    pub(crate) fn is_empty_page(&self, page: u32) -> bool {
        self.pages.get(page).is_some_and(|p| p.held_slices == 0)
    }

    /// Removes an empty page and returns it (its storage is the caller's to
    /// deallocate). `None` if the page is unknown or not empty.
    pub(crate) fn remove_empty_page(&mut self, page: u32) -> Option<Page> {
        let record = *self.pages.get(page)?;
        if record.held_slices != 0 {
            return None;
        }
        let slice = record.first;
        debug_assert_eq!(
            self.slices[slice].size, record.size,
            "an empty page is one slice"
        );
        match record.kind {
            PoolKind::Sliced => self.index.remove(&mut self.slices, slice),
            PoolKind::Exclusive => {
                if self.exclusive_free.remove(&(record.size, page)) {
                    self.totals.exclusive_free_bytes -= record.size;
                }
            }
        }
        self.slices.remove(slice);
        self.pages.remove(page);
        if self.empty.remove(&(record.size, page)) {
            self.totals.empty_bytes -= record.size;
        }
        self.forget_page(&record);
        Some(record)
    }

    fn forget_page(&mut self, record: &Page) {
        let totals = &mut self.totals;
        totals.reserved -= record.size;
        if record.storage.is_none() {
            totals.unbacked -= record.size;
        }
        match record.kind {
            PoolKind::Sliced => {
                totals.sliced_reserved -= record.size;
                totals.sliced_pages -= 1;
                if let Some(at) = totals
                    .page_sizes
                    .iter()
                    .position(|(s, _)| *s == record.size)
                {
                    totals.page_sizes[at].1 -= 1;
                    if totals.page_sizes[at].1 == 0 {
                        totals.page_sizes.swap_remove(at);
                    }
                }
            }
            PoolKind::Exclusive => totals.exclusive_pages -= 1,
        }
    }

    /// Records that a dry-run page now has memory.
    pub(crate) fn back_page(&mut self, page: u32, storage: StorageId) {
        if let Some(record) = self.pages.get_mut(page) {
            if record.storage.is_none() {
                self.totals.unbacked -= record.size;
            }
            record.storage = Some(storage);
        }
    }

    /// Keys of the pages that hold nothing.
    pub(crate) fn empty_pages(&self) -> Vec<u32> {
        self.empty.iter().map(|&(_, page)| page).collect()
    }

    /// The largest page that holds nothing, if any.
    pub(crate) fn largest_empty_page(&self) -> Option<u32> {
        self.empty.iter().next_back().map(|&(_, page)| page)
    }

    /// The slices of a page in address order.
    pub(crate) fn page_slices(&self, page: u32) -> PageSlices<'_> {
        PageSlices {
            pools: self,
            next: self.pages.get(page).map_or(NIL, |p| p.first),
        }
    }

    /// Forgets every page and slice, returning the pages (their storage is
    /// the caller's to deallocate).
    pub(crate) fn clear(&mut self) -> Vec<Page> {
        let pages: Vec<Page> = self.pages.iter().map(|(_, page)| *page).collect();
        self.pages.clear();
        self.slices.clear();
        self.index.clear();
        self.exclusive_free.clear();
        self.empty.clear();
        self.totals = Totals::default();
        pages
    }

    /// Marks a free or targeted slice held by an allocation, and the reverse,
    /// keeping the page's counts in step.
    pub(crate) fn set_held(&mut self, slice: u32, state: SliceState) {
        let was_held = self.slices[slice].state != SliceState::Free;
        let is_held = state != SliceState::Free;
        self.slices[slice].state = state;
        let size = self.slices[slice].size;
        let key = self.slices[slice].page;
        let Some(page) = self.pages.get_mut(key) else {
            return;
        };
        match (was_held, is_held) {
            (false, true) => {
                page.held_slices += 1;
                page.held_bytes += size;
                if page.held_slices == 1 {
                    let page_size = page.size;
                    self.empty.remove(&(page_size, key));
                    self.totals.empty_bytes -= page_size;
                }
            }
            (true, false) => {
                page.held_slices -= 1;
                page.held_bytes -= size;
                if page.held_slices == 0 {
                    let page_size = page.size;
                    self.empty.insert((page_size, key));
                    self.totals.empty_bytes += page_size;
                }
            }
            _ => {}
        }
    }
}

/// Iterator over a page's slices in address order: (key, slice).
pub(crate) struct PageSlices<'a> {
    pools: &'a Pools,
    next: u32,
}

impl Iterator for PageSlices<'_> {
    type Item = (u32, Slice);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next == NIL {
            return None;
        }
        let key = self.next;
        let slice = self.pools.slices[key];
        self.next = slice.next;
        Some((key, slice))
    }
}
