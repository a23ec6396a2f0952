//! Where a request goes: a stream's pending slice, the exclusive pool, or the
//! sliced pool, adding a page when the policy and the limit allow.

use super::MemoryManager;
use crate::pool::{SizeClass, SliceState};
use crate::snapshot::PoolKind;
use crate::{AllocationPolicy, IoError, Storage, StorageId, StreamId};

/// Why a request could not be placed; turned into an `IoError` (with a
/// backtrace) only when the manager gives up.
pub(super) enum Shortfall {
    NoRoom,
    SizesExhausted,
    Forbidden,
    Storage(IoError),
}

impl Shortfall {
    pub(super) fn may_pass_after_release(&self) -> bool {
        match self {
            Shortfall::NoRoom | Shortfall::SizesExhausted => true,
            Shortfall::Storage(error) => matches!(
                error,
                IoError::OutOfMemory { .. } | IoError::AllocationFailed { .. }
            ),
            Shortfall::Forbidden => false,
        }
    }
}

pub(super) struct Placement {
    pub(super) slice: u32,
    /// A use still in flight on the reserving stream, carried over from the
    /// pending slice this request took.
    pub(super) carried_use: Option<(StreamId, u64)>,
}

impl<S: Storage> MemoryManager<S> {
    pub(super) fn place(
        &mut self,
        padded: u64,
        policy: AllocationPolicy,
        stream: StreamId,
    ) -> Result<Placement, Shortfall> {
        if let Some((slice, sequence)) = self.streams.take_reusable(stream, padded) {
            self.pools.set_held(slice, SliceState::Allocated);
            return Ok(Placement {
                slice,
                carried_use: Some((stream, sequence)),
            });
        }
        let virtual_shift = self
            .chunk_shift
            .filter(|_| policy != AllocationPolicy::DryRun);
        let slice = if let Some(shift) = virtual_shift {
            self.place_virtual(padded, policy, shift)?
        } else if padded >= self.config.exclusive_threshold || padded > self.max_sliced_page {
            self.place_exclusive(padded, policy)?
        } else {
            self.place_sliced(padded, policy)?
        };
        Ok(Placement {
            slice,
            carried_use: None,
        })
    }

    fn place_sliced(&mut self, padded: u64, policy: AllocationPolicy) -> Result<u32, Shortfall> {
        let class = if padded >= self.config.min_page_size {
            SizeClass::Large
        } else {
            SizeClass::Small
        };
        if let Some(slice) = self.pools.take_sliced(padded, class) {
            return Ok(slice);
        }
        // An empty page that another class left, no larger than the page this
        // request would get (or twice the request), serves without a storage
        // allocation and without much waste.
        let fresh = self.sliced_page_size(padded, class);
        let largest = fresh.as_ref().map_or(0, |&size| size);
        let adopted =
            self.pools
                .adopt_empty_page(padded, largest.max(padded.saturating_mul(2)), class);
        if adopted.is_none() {
            if policy == AllocationPolicy::Forbidden {
                // A capture may not add pages: any free space held will do.
                let other = match class {
                    SizeClass::Small => SizeClass::Large,
                    SizeClass::Large | SizeClass::Virtual => SizeClass::Small,
                };
                return self
                    .pools
                    .take_sliced(padded, other)
                    .ok_or(Shortfall::Forbidden);
            }
            let size = fresh?;
            let storage = self.page_storage(size, policy)?;
            self.pools.add_page(size, storage, PoolKind::Sliced, class);
            self.note_reserved();
        }
        self.pools
            .take_sliced(padded, class)
            .ok_or(Shortfall::NoRoom)
    }

    fn place_exclusive(&mut self, padded: u64, policy: AllocationPolicy) -> Result<u32, Shortfall> {
        let waste = self.config.exclusive_max_waste_percent;
        if let Some(slice) = self.pools.take_exclusive(padded, waste) {
            return Ok(slice);
        }
        if policy == AllocationPolicy::Forbidden {
            return Err(Shortfall::Forbidden);
        }
        let room = self.room();
        let rounded = self.exclusive_page_size(padded);
        let size = if rounded <= room { rounded } else { padded };
        if size > room {
            return Err(Shortfall::NoRoom);
        }
        let storage = self.page_storage(size, policy)?;
        let slice = self.pools.add_exclusive_page(size, storage);
        self.note_reserved();
        Ok(slice)
    }

    /// Bytes of pages that can still be added under the limit.
    pub(super) fn room(&self) -> u64 {
        self.config.limit.saturating_sub(self.reserved())
    }

    /// Exclusive pages are rounded up to a 32nd of the next power of two (at
    /// most ~6% more), so close sizes can share pages.
    fn exclusive_page_size(&self, padded: u64) -> u64 {
        self.rounded_up(padded, 32, self.max_request)
    }

    /// `padded` rounded up to a multiple of a `parts`th of the next power of
    /// two, if that stays within `cap`; keeps the number of distinct sizes
    /// bounded (`parts / 2` per octave).
    fn rounded_up(&self, padded: u64, parts: u64, cap: u64) -> u64 {
        let granule = (padded.next_power_of_two() / parts).max(self.alignment);
        padded
            .checked_next_multiple_of(granule)
            .filter(|&size| size <= cap)
            .unwrap_or(padded)
    }

    /// The size of a new sliced page for a request of `padded` bytes, within
    /// the limit and the bound on distinct sizes; a held size or the request
    /// itself when tight. Small requests get a power of two that grows with
    /// their pages; a large one gets a page sized to it (in quarter steps
    /// between powers of two, at most 25% more), which, once it is freed,
    /// the next large request that fits reuses.
    fn sliced_page_size(&self, padded: u64, class: SizeClass) -> Result<u64, Shortfall> {
        let room = self.room();
        if padded > room {
            return Err(Shortfall::NoRoom);
        }
        let totals = &self.pools.totals;
        let is_held = |size: u64| totals.page_sizes.iter().any(|&(s, _)| s == size);
        let has_room_for_new_size = totals.page_sizes.len() < self.config.max_page_sizes;
        let mut candidate = match class {
            SizeClass::Large | SizeClass::Virtual => {
                self.rounded_up(padded, 8, self.max_sliced_page)
            }
            SizeClass::Small => padded
                .max(self.config.min_page_size)
                .max(
                    totals.class_reserved[SizeClass::Small.index()]
                        / self.config.page_growth_divisor,
                )
                .checked_next_power_of_two()
                .unwrap_or(u64::MAX)
                .min(self.max_sliced_page)
                .max(padded),
        };
        let mut blocked_by_sizes = false;
        loop {
            if candidate <= room {
                if has_room_for_new_size || is_held(candidate) {
                    return Ok(candidate);
                }
                blocked_by_sizes = true;
            }
            if candidate == padded {
                break;
            }
            candidate = match class {
                SizeClass::Large | SizeClass::Virtual => padded,
                SizeClass::Small => (candidate / 2).max(padded),
            };
        }
        let held = totals
            .page_sizes
            .iter()
            .map(|&(size, _)| size)
            .filter(|&size| size >= padded && size <= room)
            .min();
        match held {
            Some(size) => Ok(size),
            None if blocked_by_sizes => Err(Shortfall::SizesExhausted),
            None => Err(Shortfall::NoRoom),
        }
    }

    /// Allocates a page's storage, or none yet for a dry run.
    fn page_storage(
        &mut self,
        size: u64,
        policy: AllocationPolicy,
    ) -> Result<Option<StorageId>, Shortfall> {
        self.trim_idle_pages(size);
        if policy == AllocationPolicy::DryRun {
            return Ok(None);
        }
        let handle = self.storage.alloc(size).map_err(Shortfall::Storage)?;
        self.counters.storage_allocs += 1;
        Ok(Some(handle.id))
    }

    pub(super) fn note_reserved(&mut self) {
        let reserved = self.reserved();
        self.counters.peak_reserved = self.counters.peak_reserved.max(reserved);
    }

    /// The error for a request of `size` bytes that could not be placed.
    pub(super) fn failure(&mut self, shortfall: Shortfall, size: u64) -> IoError {
        match shortfall {
            Shortfall::NoRoom | Shortfall::Storage(IoError::OutOfMemory { .. }) => {
                self.counters.ooms += 1;
                IoError::out_of_memory(size)
            }
            Shortfall::SizesExhausted => IoError::page_sizes_exhausted(size),
            Shortfall::Forbidden => IoError::page_update_forbidden(size),
            Shortfall::Storage(error) => error,
        }
    }
}
