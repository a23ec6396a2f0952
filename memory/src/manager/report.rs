//! What the manager reports: stats, a snapshot, a readable summary.

use std::collections::HashMap;
use std::fmt::Write;

use super::MemoryManager;
use crate::pool::SliceState;
use crate::snapshot::PoolKind;
use crate::snapshot::{MemorySnapshot, PageSnapshot, SliceSnapshot, SliceUse};
use crate::{MemoryStats, Storage};

impl<S: Storage> MemoryManager<S> {
    /// Counters and gauges now.
    pub fn stats(&self) -> MemoryStats {
        let totals = &self.pools.totals;
        let counters = &self.counters;
        let (mut inactive_split, mut empty) = (0, 0);
        for (key, page) in self.pools.pages.iter() {
            if page.kind == PoolKind::Virtual {
                // Its free space is address space; the blocks' is counted here.
                let blocks = self.space.as_ref().map_or(0, |space| space.reserved);
                let empty_blocks = self.space.as_ref().map_or(0, |s| s.empty_block_bytes());
                empty += empty_blocks;
                let held = self.pools.held_bytes(key);
                inactive_split += blocks.saturating_sub(held + empty_blocks);
            } else if page.held_slices == 0 {
                empty += page.size;
            } else {
                inactive_split += page.size - page.held_bytes;
            }
        }
        let mut page_sizes: Vec<u64> = totals.page_sizes.iter().map(|&(size, _)| size).collect();
        page_sizes.sort_unstable();
        MemoryStats {
            limit_bytes: self.config.limit,
            live_allocations: self.allocations.live(),
            in_use_bytes: counters.in_use,
            requested_bytes: counters.requested,
            padding_bytes: counters.in_use - counters.requested.min(counters.in_use),
            reserved_bytes: self.reserved(),
            unbacked_bytes: totals.unbacked,
            pending_free_bytes: self.streams.pending_bytes(),
            inactive_split_bytes: inactive_split,
            empty_page_bytes: empty,
            sliced_pages: totals.sliced_pages,
            exclusive_pages: totals.exclusive_pages,
            virtual_blocks: self.space.as_ref().map_or(0, |space| space.block_count()),
            mapped_bytes: self.space.as_ref().map_or(0, |space| space.mapped_bytes()),
            page_sizes,
            peak_in_use_bytes: counters.peak_in_use,
            peak_requested_bytes: counters.peak_requested,
            peak_reserved_bytes: counters.peak_reserved,
            reservations: counters.reservations,
            storage_allocs: counters.storage_allocs,
            storage_frees: counters.storage_frees,
            reclaims: counters.reclaims,
            reclaimed_bytes: counters.reclaimed_bytes,
            retries: counters.retries,
            ooms: counters.ooms,
            compactions: counters.compactions,
            relocations: counters.relocations,
        }
    }

    /// Every page and slice now.
    pub fn snapshot(&self) -> MemorySnapshot {
        let owners: HashMap<u32, SliceUse> = self
            .allocations
            .iter()
            .map(|(id, allocation)| {
                let use_ = SliceUse::Allocated {
                    id,
                    requested: allocation.requested,
                    pinned: allocation.pinned,
                };
                (allocation.slice, use_)
            })
            .collect();
        let pages = self
            .pools
            .pages
            .iter()
            .map(|(key, page)| PageSnapshot {
                storage: page.storage,
                pool: page.kind,
                size: page.size,
                slices: self
                    .pools
                    .page_slices(key)
                    .map(|(slice_key, slice)| SliceSnapshot {
                        offset: slice.offset,
                        size: slice.size,
                        state: match slice.state {
                            SliceState::Free => SliceUse::Free,
                            SliceState::Pending => SliceUse::PendingFree,
                            SliceState::Target => SliceUse::CompactionTarget,
                            SliceState::Allocated => {
                                owners.get(&slice_key).copied().unwrap_or(SliceUse::Free)
                            }
                        },
                    })
                    .collect(),
            })
            .collect();
        MemorySnapshot {
            alignment: self.alignment,
            pages,
        }
    }

    /// A readable table of the stats, like `torch.cuda.memory_summary()`.
    pub fn memory_summary(&self) -> String {
        let stats = self.stats();
        let mut out = String::new();
        let rule = "+----------------------+--------------+--------------+";
        let _ = writeln!(out, "{rule}");
        let _ = writeln!(
            out,
            "| {:<20} | {:>12} | {:>12} |",
            "memory", "current", "peak"
        );
        let _ = writeln!(out, "{rule}");
        let rows = [
            ("in use", stats.in_use_bytes, Some(stats.peak_in_use_bytes)),
            (
                "requested",
                stats.requested_bytes,
                Some(stats.peak_requested_bytes),
            ),
            (
                "reserved",
                stats.reserved_bytes,
                Some(stats.peak_reserved_bytes),
            ),
            ("padding", stats.padding_bytes, None),
            ("pending free", stats.pending_free_bytes, None),
            ("inactive split", stats.inactive_split_bytes, None),
            ("empty pages", stats.empty_page_bytes, None),
            ("mapped", stats.mapped_bytes, None),
            ("unbacked", stats.unbacked_bytes, None),
            ("limit", stats.limit_bytes, None),
        ];
        for (name, current, peak) in rows {
            let peak = peak.map_or_else(String::new, bytes);
            let _ = writeln!(out, "| {name:<20} | {:>12} | {peak:>12} |", bytes(current));
        }
        let _ = writeln!(out, "{rule}");
        let counts = [
            ("live allocations", stats.live_allocations),
            ("sliced pages", stats.sliced_pages),
            ("exclusive pages", stats.exclusive_pages),
            ("virtual blocks", stats.virtual_blocks),
            ("storage allocs", stats.storage_allocs),
            ("storage frees", stats.storage_frees),
            ("reclaims", stats.reclaims),
            ("retries", stats.retries),
            ("out of memory", stats.ooms),
            ("relocations", stats.relocations),
        ];
        for (name, count) in counts {
            let _ = writeln!(out, "| {name:<20} | {count:>12} | {:>12} |", "");
        }
        let _ = writeln!(out, "{rule}");
        out
    }
}

fn bytes(value: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut scaled = value as f64;
    let mut unit = 0;
    while scaled >= 1024.0 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value} B")
    } else {
        format!("{scaled:.1} {}", UNITS[unit])
    }
}
