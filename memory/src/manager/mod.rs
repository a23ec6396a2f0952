//! `MemoryManager`: allocations named by ids, placed in pools, released as
//! streams complete.

mod chunks;
mod compaction;
mod placement;
mod report;

use crate::allocations::{Allocation, AllocationTable};
use crate::pool::{Pools, SizeClass, SliceState};
use crate::snapshot::PoolKind;
use crate::streams::Streams;
use crate::{
    AllocationId, AllocationPolicy, IoError, MemoryConfig, Reason, SliceLocation, Storage, StreamId,
};

/// The memory manager every backend drives: reserves slices of pages held
/// in a [`Storage`], under a memory limit.
///
/// Never panics whatever the caller passes; every failure is an [`IoError`].
pub struct MemoryManager<S: Storage> {
    storage: S,
    config: MemoryConfig,
    alignment: u64,
    /// The largest request that can ever be placed.
    max_request: u64,
    /// The largest page of the sliced pool.
    max_sliced_page: u64,
    pools: Pools,
    allocations: AllocationTable,
    streams: Streams,
    counters: Counters,
    /// The ticket of the compaction plan that may still be committed.
    plan: Option<u64>,
    next_plan: u64,
    /// log2 of the chunk size when requests go to the virtual range.
    chunk_shift: Option<u32>,
    /// The virtual range, once the first request needs it.
    space: Option<chunks::VirtualSpace>,
}

/// Counters and gauges kept on the hot path; `stats()` adds what is derived.
#[derive(Default)]
struct Counters {
    in_use: u64,
    requested: u64,
    peak_in_use: u64,
    peak_requested: u64,
    peak_reserved: u64,
    reservations: u64,
    storage_allocs: u64,
    storage_frees: u64,
    reclaims: u64,
    reclaimed_bytes: u64,
    retries: u64,
    ooms: u64,
    compactions: u64,
    relocations: u64,
}

impl<S: Storage> MemoryManager<S> {
    /// A manager over `storage` with `config`; an invalid config is `IoError::Unknown`.
    pub fn new(storage: S, config: MemoryConfig) -> Result<Self, IoError> {
        config.validate()?;
        let alignment = storage.alignment().max(1).next_power_of_two();
        let round_down = |bytes: u64| bytes / alignment * alignment;
        let max_request = round_down(config.limit.min(storage.max_buffer_size()));
        if max_request == 0 {
            return Err(IoError::unknown(
                "invalid memory config: the limit or the storage holds no aligned buffer",
            ));
        }
        let max_sliced_page = round_down(config.max_page_size.min(max_request)).max(alignment);
        let chunk_shift = Self::virtual_chunk_shift(&config, &storage, alignment);
        Ok(MemoryManager {
            chunk_shift,
            space: None,
            storage,
            alignment,
            max_request,
            max_sliced_page,
            pools: Pools::new(alignment),
            allocations: AllocationTable::default(),
            streams: Streams::default(),
            counters: Counters::default(),
            plan: None,
            next_plan: 1,
            config,
        })
    }

    /// Reserves `size` bytes for use on `stream`, recording the context
    /// `generation` it is made in.
    ///
    /// `BufferTooBig` if it can never fit; `OutOfMemory` if it does not fit
    /// now, after releasing empty pages and retrying once;
    /// `PageUpdateForbidden` if `policy` forbids the page it needs;
    /// `PageSizesExhausted` if it needs one more page size than allowed.
    pub fn reserve(
        &mut self,
        size: u64,
        policy: AllocationPolicy,
        generation: u64,
        stream: StreamId,
    ) -> Result<AllocationId, IoError> {
        let padded = self.padded(size)?;
        let placed = match self.place(padded, policy, stream) {
            Ok(placed) => placed,
            Err(shortfall) if shortfall.may_pass_after_release() => {
                self.counters.retries += 1;
                self.release_empty_pages();
                self.place(padded, policy, stream)
                    .map_err(|shortfall| self.failure(shortfall, size))?
            }
            Err(shortfall) => return Err(self.failure(shortfall, size)),
        };
        let slice_size = self.pools.slices[placed.slice].size;
        let counters = &mut self.counters;
        counters.in_use += slice_size;
        counters.requested += size;
        counters.peak_in_use = counters.peak_in_use.max(counters.in_use);
        counters.peak_requested = counters.peak_requested.max(counters.requested);
        counters.reservations += 1;
        Ok(self.allocations.insert(Allocation {
            slice: placed.slice,
            requested: size,
            generation,
            // The old work that still uses the slice may write it.
            uses: placed.carried_use.into_iter().collect(),
            writes: placed.carried_use.into_iter().collect(),
            pinned: false,
        }))
    }

    fn padded(&self, size: u64) -> Result<u64, IoError> {
        // The alignment is a power of two: a mask, not a division.
        let mask = self.alignment - 1;
        let padded = (size.max(1))
            .checked_add(mask)
            .map(|bumped| bumped & !mask)
            .filter(|&padded| padded <= self.max_request);
        padded.ok_or_else(|| IoError::buffer_too_big(size))
    }

    /// Frees an allocation. Its slice is reused once every stream that used
    /// it has completed past its last use. `NotFound` if the id is unknown
    /// or already freed (a caller bug).
    pub fn free(&mut self, id: AllocationId) -> Result<(), IoError> {
        let allocation = self.allocations.remove(id).map_err(IoError::not_found)?;
        let slice = allocation.slice;
        self.counters.in_use -= self.pools.slices[slice].size;
        self.counters.requested -= allocation.requested;
        if !allocation.uses.is_empty() {
            let in_flight = self.streams.in_flight(&allocation.uses);
            if !in_flight.is_empty() {
                let size = self.pools.slices[slice].size;
                self.pools.slices[slice].state = SliceState::Pending;
                self.streams.defer(slice, size, &in_flight);
                return Ok(());
            }
        }
        self.release_slice(slice);
        Ok(())
    }

    /// Bytes held: pages, and blocks backing the virtual range.
    fn reserved(&self) -> u64 {
        let blocks = self.space.as_ref().map_or(0, |space| space.reserved);
        self.pools.totals.reserved + blocks
    }

    /// Gives a slice back to its pool.
    fn release_slice(&mut self, slice: u32) {
        if self.pools.slices[slice].class == SizeClass::Virtual {
            self.release_virtual(slice);
            return;
        }
        let page = self.pools.slices[slice].page;
        let emptied = match self.pools.pages.get(page).map(|page| page.kind) {
            Some(PoolKind::Sliced) => self.pools.release_sliced(slice),
            Some(PoolKind::Exclusive) => self.pools.release_exclusive(slice),
            // Virtual-range slices returned above, by their class.
            Some(PoolKind::Virtual) | None => {
                debug_assert!(false, "a held page slice has a sliced or exclusive page");
                false
            }
        };
        // Only with a spare, so a loop that frees and re-reserves the same
        // memory finds a page each time instead of allocating one.
        if emptied && self.reserved() > self.idle_budget() && self.pools.has_spare_for(page) {
            self.release_page(page);
        }
    }

    /// The most bytes of pages held while empty pages are kept: `idle_percent`
    /// above the peak bytes in use, plus one smallest page so that a program
    /// using less than a page does not release and allocate it in turn.
    /// Measured against the peak, not the bytes in use now, so a workload
    /// whose demand falls and rises again in cycles finds its pages still
    /// there instead of allocating them anew.
    fn idle_budget(&self) -> u64 {
        let base = self.counters.peak_in_use.max(self.counters.in_use);
        base.saturating_add(base / 100 * self.config.idle_percent)
            .saturating_add(self.config.min_page_size)
    }

    /// Before a page of `size` bytes is added: releases the largest empty
    /// pages while the pages held would exceed the idle budget. None of them
    /// was fit to hold the request, or it would have been placed there.
    pub(super) fn trim_idle_pages(&mut self, size: u64) {
        let budget = self.idle_budget();
        while self.reserved().saturating_add(size) > budget {
            let Some(page) = self.pools.largest_empty_page() else {
                break;
            };
            self.release_page(page);
        }
    }

    /// Releases an empty page and its storage; returns its bytes.
    fn release_page(&mut self, page: u32) -> u64 {
        let Some(record) = self.pools.remove_empty_page(page) else {
            return 0;
        };
        if let Some(storage) = record.storage {
            self.storage.dealloc(storage);
            self.counters.storage_frees += 1;
        }
        self.counters.reclaimed_bytes += record.size;
        record.size
    }

    fn release_empty_pages(&mut self) -> u64 {
        let pages: u64 = self
            .pools
            .empty_pages()
            .into_iter()
            .map(|page| self.release_page(page))
            .sum();
        pages + self.release_empty_blocks()
    }

    /// Where the allocation's bytes are now. Backs a dry-run page on first
    /// use: a failure then is `StorageMappingFailed` (its `source` says why).
    /// `NotFound` for an unknown or freed id; `StorageHandleNotFound` if the
    /// storage behind the slice is gone.
    pub fn locate(&mut self, id: AllocationId) -> Result<SliceLocation, IoError> {
        let slice_key = self.allocations.get(id).map_err(IoError::not_found)?.slice;
        let slice = self.pools.slices[slice_key];
        let page = *self
            .pools
            .pages
            .get(slice.page)
            .ok_or_else(|| IoError::storage_handle_not_found(Reason::StorageReleased))?;
        let storage = match page.storage {
            Some(storage) => storage,
            None => {
                let handle = self
                    .storage
                    .alloc(page.size)
                    .map_err(|source| IoError::storage_mapping_failed(page.size, source))?;
                self.counters.storage_allocs += 1;
                self.pools.back_page(slice.page, handle.id);
                handle.id
            }
        };
        if !self.storage.contains(storage) {
            return Err(IoError::storage_handle_not_found(Reason::StorageReleased));
        }
        Ok(SliceLocation {
            storage,
            offset: slice.offset,
            size: slice.size,
        })
    }

    /// The context generation the allocation was made in.
    pub fn generation_of(&self, id: AllocationId) -> Result<u64, IoError> {
        self.allocations
            .get(id)
            .map(|allocation| allocation.generation)
            .map_err(IoError::not_found)
    }

    /// The bytes the caller asked for.
    pub fn size_of(&self, id: AllocationId) -> Result<u64, IoError> {
        self.allocations
            .get(id)
            .map(|allocation| allocation.requested)
            .map_err(IoError::not_found)
    }

    /// Records a use of the allocation by work number `sequence` on `stream`.
    pub fn record_use(
        &mut self,
        id: AllocationId,
        stream: StreamId,
        sequence: u64,
    ) -> Result<(), IoError> {
        self.record(id, stream, sequence, false)
    }

    /// Records a use that writes the allocation: later uses on other
    /// streams are ordered after it (see [`conflicts`](Self::conflicts)).
    pub fn record_write(
        &mut self,
        id: AllocationId,
        stream: StreamId,
        sequence: u64,
    ) -> Result<(), IoError> {
        self.record(id, stream, sequence, true)
    }

    fn record(
        &mut self,
        id: AllocationId,
        stream: StreamId,
        sequence: u64,
        writes: bool,
    ) -> Result<(), IoError> {
        let allocation = self.allocations.get_mut(id).map_err(IoError::not_found)?;
        raise_last(&mut allocation.uses, stream, sequence);
        if writes {
            raise_last(&mut allocation.writes, stream, sequence);
        }
        Ok(())
    }

    /// The uses on streams other than `stream`, still in flight, that a new
    /// use of `id` on `stream` conflicts with: every use if it writes, the
    /// writes otherwise (reads of one allocation on two streams do not
    /// conflict). At most one `(stream, last sequence)` per stream, pushed
    /// onto `conflicts`.
    pub fn conflicts(
        &self,
        id: AllocationId,
        stream: StreamId,
        writes: bool,
        conflicts: &mut Vec<(StreamId, u64)>,
    ) -> Result<(), IoError> {
        let allocation = self.allocations.get(id).map_err(IoError::not_found)?;
        let uses = if writes {
            &allocation.uses
        } else {
            &allocation.writes
        };
        for &(other, sequence) in uses {
            if other != stream && !self.streams.is_done(other, sequence) {
                conflicts.push((other, sequence));
            }
        }
        Ok(())
    }

    /// Records that every use on `stream` with a sequence up to `sequence`
    /// has completed; releases the frees that waited only on them.
    pub fn stream_completed(&mut self, stream: StreamId, sequence: u64) {
        for slice in self.streams.complete(stream, sequence) {
            self.release_slice(slice);
        }
    }

    /// Marks the allocation referenced by a captured graph (`true`): it never moves.
    pub fn set_pinned(&mut self, id: AllocationId, pinned: bool) -> Result<(), IoError> {
        self.allocations
            .get_mut(id)
            .map_err(IoError::not_found)?
            .pinned = pinned;
        Ok(())
    }

    /// Releases every page that holds nothing, and every block of the virtual
    /// range none of whose chunks is mapped; returns the bytes released.
    pub fn reclaim(&mut self) -> u64 {
        self.counters.reclaims += 1;
        self.release_empty_pages()
    }

    /// Releases every allocation and page and empties the storage (an
    /// invalidate); returns the bytes released. Old ids answer `NotFound`
    /// (`AlreadyFreed`) from now on.
    pub fn release_all(&mut self) -> u64 {
        self.allocations.clear();
        self.streams.clear_pending();
        self.plan = None;
        let mut released = self.close_range();
        for page in self.pools.clear() {
            if page.kind == PoolKind::Virtual {
                continue;
            }
            if let Some(storage) = page.storage {
                self.storage.dealloc(storage);
                self.counters.storage_frees += 1;
            }
            released += page.size;
        }
        self.counters.in_use = 0;
        self.counters.requested = 0;
        self.counters.reclaimed_bytes += released;
        released
    }

    /// The configuration the manager runs with.
    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// The storage, to read buffers.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// The storage, mutably (a backend's own bookkeeping). Deallocating a
    /// page behind the manager's back makes its slices `StorageHandleNotFound`.
    pub fn storage_mut(&mut self) -> &mut S {
        &mut self.storage
    }
}

/// Raises `stream`'s last recorded sequence in `uses` to `sequence`.
fn raise_last(uses: &mut Vec<(StreamId, u64)>, stream: StreamId, sequence: u64) {
    match uses.iter_mut().find(|(s, _)| *s == stream) {
        Some((_, last)) => *last = (*last).max(sequence),
        None => uses.push((stream, sequence)),
    }
}
