//! Compaction: plan moves of live slices off sparse pages, then commit what
//! the caller copied, or abort.

use std::collections::HashMap;

use super::MemoryManager;
use crate::pool::SliceState;
use crate::snapshot::PoolKind;
use crate::{AllocationId, CompactionPlan, IoError, Relocation, SliceLocation, Storage, StorageId};

/// A page is sparse, and worth evacuating, when at most this share of it is held.
const SPARSE_PERCENT: u64 = 50;

impl<S: Storage> MemoryManager<S> {
    /// Plans moves that empty sparse sliced pages into the free space of
    /// denser ones, reserving the destinations. Allocations that are pinned
    /// or have uses in flight never move, and neither does anything on a page
    /// that holds one. While a plan is outstanding, another plan is empty.
    pub fn plan_compaction(&mut self) -> CompactionPlan {
        let mut plan = CompactionPlan {
            moves: Vec::new(),
            ticket: 0,
            slices: Vec::new(),
            pages: Vec::new(),
        };
        if self.plan.is_some() {
            return plan;
        }
        let owners: HashMap<u32, (AllocationId, bool)> = self
            .allocations
            .iter()
            .map(|(id, allocation)| {
                let movable = !allocation.pinned && !self.streams.any_in_flight(&allocation.uses);
                (allocation.slice, (id, movable))
            })
            .collect();
        let mut sources = Vec::new();
        let mut withheld_pages = Vec::new();
        for (key, page) in self.pools.pages.iter() {
            if page.kind != PoolKind::Sliced {
                continue;
            }
            let sparse = page.held_bytes * 100 <= page.size * SPARSE_PERCENT;
            if page.held_slices == 0 || page.storage.is_none() {
                withheld_pages.push(key);
            } else if sparse && self.all_movable(key, &owners) {
                withheld_pages.push(key);
                sources.push((page.held_bytes, key));
            }
        }
        sources.sort_unstable();
        let withheld = self.pools.withhold_free(&withheld_pages);
        for (_, page) in sources {
            self.plan_page(page, &owners, &mut plan);
        }
        self.pools.restore_free(withheld);
        if !plan.slices.is_empty() {
            plan.ticket = self.next_plan;
            self.next_plan += 1;
            self.plan = Some(plan.ticket);
        }
        plan
    }

    fn all_movable(&self, page: u32, owners: &HashMap<u32, (AllocationId, bool)>) -> bool {
        self.pools
            .page_slices(page)
            .all(|(key, slice)| match slice.state {
                SliceState::Free => true,
                SliceState::Allocated => owners.get(&key).is_some_and(|&(_, movable)| movable),
                SliceState::Pending | SliceState::Target => false,
            })
    }

    /// Reserves a destination for every allocation on `page`, or none.
    fn plan_page(
        &mut self,
        page: u32,
        owners: &HashMap<u32, (AllocationId, bool)>,
        plan: &mut CompactionPlan,
    ) {
        let held: Vec<(u32, u64)> = self
            .pools
            .page_slices(page)
            .filter(|(_, slice)| slice.state == SliceState::Allocated)
            .map(|(key, slice)| (key, slice.size))
            .collect();
        let mut moves = Vec::with_capacity(held.len());
        for &(source, size) in &held {
            let class = self.pools.slices[source].class;
            match self.pools.take_sliced(size, class) {
                Some(destination) => {
                    self.pools.slices[destination].state = SliceState::Target;
                    moves.push((source, destination));
                }
                None => {
                    for (_, destination) in moves {
                        self.pools.release_sliced(destination);
                    }
                    return;
                }
            }
        }
        for (source, destination) in moves {
            let (Some(from), Some(to), Some(&(id, _))) = (
                self.location_of(source),
                self.location_of(destination),
                owners.get(&source),
            ) else {
                self.pools.release_sliced(destination);
                continue;
            };
            plan.moves.push(Relocation { id, from, to });
            plan.slices.push((source, destination));
        }
        plan.pages.push(page);
    }

    fn location_of(&self, slice: u32) -> Option<SliceLocation> {
        let record = self.pools.slices[slice];
        let storage: StorageId = self.pools.pages.get(record.page)?.storage?;
        Some(SliceLocation {
            storage,
            offset: record.offset,
            size: record.size,
        })
    }

    /// Moves every planned allocation to its destination (the caller has
    /// copied the bytes) and releases the pages it emptied. An allocation
    /// freed, pinned or used since the plan stays where it is. A plan that is
    /// not the latest outstanding one is refused with `IoError::Unknown`.
    pub fn commit_compaction(&mut self, plan: CompactionPlan) -> Result<(), IoError> {
        if plan.slices.is_empty() {
            return Ok(());
        }
        if self.plan != Some(plan.ticket) {
            return Err(IoError::unknown(
                "compaction plan is not the outstanding one (committed, aborted or invalidated)",
            ));
        }
        self.plan = None;
        for (relocation, &(source, destination)) in plan.moves.iter().zip(&plan.slices) {
            let moved = match self.allocations.get_mut(relocation.id) {
                Ok(allocation)
                    if allocation.slice == source
                        && !allocation.pinned
                        && !self.streams.any_in_flight(&allocation.uses) =>
                {
                    allocation.slice = destination;
                    true
                }
                _ => false,
            };
            if moved {
                self.pools.slices[destination].state = SliceState::Allocated;
                self.pools.release_sliced(source);
                self.counters.relocations += 1;
            } else {
                self.pools.release_sliced(destination);
            }
        }
        for page in plan.pages {
            if self.pools.is_empty_page(page) {
                self.release_page(page);
            }
        }
        self.counters.compactions += 1;
        Ok(())
    }

    /// Drops a plan: its destinations are free again and nothing moved.
    pub fn abort_compaction(&mut self, plan: CompactionPlan) {
        if plan.slices.is_empty() || self.plan != Some(plan.ticket) {
            return;
        }
        self.plan = None;
        for (_, destination) in plan.slices {
            self.pools.release_sliced(destination);
        }
    }
}
