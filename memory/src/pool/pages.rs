//! Adding and removing pages, and walking them.

use super::records::{NIL, Page, SizeClass, Slice, SliceState};
use super::{Pools, Totals};
use crate::StorageId;
use crate::snapshot::PoolKind;

impl Pools {
    /// Adds a page whose one slice spans it, free. A sliced page's slice goes
    /// into its class's free index; an exclusive page's is handed back to the
    /// caller to take. Returns (page, slice).
    pub(crate) fn add_page(
        &mut self,
        size: u64,
        storage: Option<StorageId>,
        kind: PoolKind,
        class: SizeClass,
    ) -> (u32, u32) {
        let page = self.pages.insert(Page {
            size,
            storage,
            kind,
            first: NIL,
            held_slices: 0,
            held_bytes: 0,
            class,
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
            class,
        });
        if let Some(record) = self.pages.get_mut(page) {
            record.first = slice;
        }
        let totals = &mut self.totals;
        if kind != PoolKind::Virtual {
            totals.empty_bytes += size;
            totals.reserved += size;
            if storage.is_none() {
                totals.unbacked += size;
            }
        }
        match kind {
            PoolKind::Sliced => {
                totals.class_reserved[class.index()] += size;
                totals.sliced_pages += 1;
                match totals.page_sizes.iter_mut().find(|(s, _)| *s == size) {
                    Some((_, count)) => *count += 1,
                    None => totals.page_sizes.push((size, 1)),
                }
                self.empty_sliced[class.index()].insert((size, page));
                self.index[class.index()].insert(&mut self.slices, slice);
            }
            PoolKind::Exclusive => totals.exclusive_pages += 1,
            // Address space, not memory: its chunks are counted as they are backed.
            PoolKind::Virtual => self.index[class.index()].insert(&mut self.slices, slice),
        }
        (page, slice)
    }

    /// Whether the page holds no slice that is in use, pending or targeted.
    pub(crate) fn is_empty_page(&self, page: u32) -> bool {
        self.pages
            .get(page)
            .is_some_and(|p| p.kind != PoolKind::Virtual && p.held_slices == 0)
    }

    /// Removes an empty page and returns it (its storage is the caller's to
    /// deallocate). `None` if the page is unknown or not empty.
    pub(crate) fn remove_empty_page(&mut self, page: u32) -> Option<Page> {
        let record = *self.pages.get(page)?;
        if record.held_slices != 0 || record.kind == PoolKind::Virtual {
            return None;
        }
        let slice = record.first;
        debug_assert_eq!(
            self.slices[slice].size, record.size,
            "an empty page is one slice"
        );
        match record.kind {
            PoolKind::Sliced => {
                self.index[record.class.index()].remove(&mut self.slices, slice);
                self.empty_sliced[record.class.index()].remove(&(record.size, page));
            }
            PoolKind::Exclusive => {
                if self.exclusive_free.remove(&(record.size, page)) {
                    self.totals.exclusive_free_bytes -= record.size;
                }
            }
            PoolKind::Virtual => {}
        }
        self.slices.remove(slice);
        self.pages.remove(page);
        self.totals.empty_bytes -= record.size;
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
                totals.class_reserved[record.class.index()] -= record.size;
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
            PoolKind::Virtual => {}
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
        self.empty_sliced
            .iter()
            .flatten()
            .chain(&self.exclusive_free)
            .map(|&(_, page)| page)
            .collect()
    }

    /// Takes the smallest empty sliced page of `min_size..=max_size` bytes for
    /// `class` (moving its one free slice to that class's index), so a class
    /// that needs a page reuses one another class emptied.
    pub(crate) fn adopt_empty_page(
        &mut self,
        min_size: u64,
        max_size: u64,
        class: SizeClass,
    ) -> Option<u32> {
        let range = (min_size, 0)..=(max_size, u32::MAX);
        let &(size, page) = self
            .empty_sliced
            .iter()
            .filter_map(|empty| empty.range(range.clone()).next())
            .min()?;
        let record = self.pages.get_mut(page)?;
        let (old, slice) = (record.class, record.first);
        if old != class {
            record.class = class;
            self.empty_sliced[old.index()].remove(&(size, page));
            self.empty_sliced[class.index()].insert((size, page));
            self.index[old.index()].remove(&mut self.slices, slice);
            self.slices[slice].class = class;
            self.index[class.index()].insert(&mut self.slices, slice);
            let totals = &mut self.totals;
            totals.class_reserved[old.index()] -= size;
            totals.class_reserved[class.index()] += size;
        }
        Some(page)
    }

    /// Whether another empty page could serve every request that the empty
    /// `page` could: one of its pool and class, at least as large.
    pub(crate) fn has_spare_for(&self, page: u32) -> bool {
        let Some(record) = self.pages.get(page) else {
            return false;
        };
        let empty = match record.kind {
            PoolKind::Sliced => &self.empty_sliced[record.class.index()],
            PoolKind::Exclusive => &self.exclusive_free,
            PoolKind::Virtual => return false,
        };
        empty
            .range((record.size, 0)..)
            .take(2)
            .any(|&(_, other)| other != page)
    }

    /// The largest page that holds nothing, if any.
    pub(crate) fn largest_empty_page(&self) -> Option<u32> {
        let [small, large, _] = &self.empty_sliced;
        let largest = [small.last(), large.last(), self.exclusive_free.last()];
        largest.into_iter().flatten().max().map(|&(_, page)| page)
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
        for index in &mut self.index {
            index.clear();
        }
        self.exclusive_free.clear();
        for empty in &mut self.empty_sliced {
            empty.clear();
        }
        self.totals = Totals::default();
        pages
    }

    /// Marks a free or targeted slice held by an allocation, and the reverse,
    /// keeping the page's counts in step. Returns whether the page now holds
    /// nothing.
    pub(crate) fn set_held(&mut self, slice: u32, state: SliceState) -> bool {
        if self.slices[slice].class == SizeClass::Virtual {
            // The virtual range is never empty nor released as a page: its
            // counts are not kept (`held_bytes` walks it when asked).
            self.slices[slice].state = state;
            return false;
        }
        let was_held = self.slices[slice].state != SliceState::Free;
        let is_held = state != SliceState::Free;
        self.slices[slice].state = state;
        let size = self.slices[slice].size;
        let key = self.slices[slice].page;
        let Some(page) = self.pages.get_mut(key) else {
            return false;
        };
        match (was_held, is_held) {
            (false, true) => {
                page.held_slices += 1;
                page.held_bytes += size;
                if page.held_slices == 1 {
                    let page_size = page.size;
                    match page.kind {
                        PoolKind::Sliced => {
                            self.empty_sliced[page.class.index()].remove(&(page_size, key));
                            self.totals.empty_bytes -= page_size;
                        }
                        PoolKind::Exclusive => self.totals.empty_bytes -= page_size,
                        PoolKind::Virtual => {}
                    }
                }
            }
            (true, false) => {
                page.held_slices -= 1;
                page.held_bytes -= size;
                if page.held_slices == 0 {
                    let page_size = page.size;
                    match page.kind {
                        PoolKind::Sliced => {
                            self.empty_sliced[page.class.index()].insert((page_size, key));
                            self.totals.empty_bytes += page_size;
                        }
                        PoolKind::Exclusive => self.totals.empty_bytes += page_size,
                        PoolKind::Virtual => {}
                    }
                }
            }
            _ => {}
        }
        page.held_slices == 0
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

impl Pools {
    /// Bytes of a page's slices that are not free. Kept as a count for
    /// pages; walked for the virtual range, whose count is not kept.
    pub(crate) fn held_bytes(&self, page: u32) -> u64 {
        match self.pages.get(page) {
            Some(record) if record.kind == PoolKind::Virtual => self
                .page_slices(page)
                .filter(|(_, slice)| slice.state != SliceState::Free)
                .map(|(_, slice)| slice.size)
                .sum(),
            Some(record) => record.held_bytes,
            None => 0,
        }
    }
}
