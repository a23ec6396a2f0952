//! `MemoryStats`: counters and gauges in the spirit of `torch.cuda.memory_stats`.

use serde::{Deserialize, Serialize};

/// What the manager holds and has done. Bytes are bytes; counts are counts since creation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStats {
    /// The configured limit.
    pub limit_bytes: u64,
    /// Live allocations.
    pub live_allocations: u64,
    /// Bytes of the slices of live allocations.
    pub in_use_bytes: u64,
    /// Bytes the caller asked for, over live allocations.
    pub requested_bytes: u64,
    /// `in_use_bytes - requested_bytes`: alignment and reuse rounding.
    pub padding_bytes: u64,
    /// Bytes of all pages held (backed or not) and of the buffers backing
    /// the virtual range.
    pub reserved_bytes: u64,
    /// Bytes of pages whose memory is not allocated yet (dry-run pages).
    pub unbacked_bytes: u64,
    /// Bytes of freed slices still waiting for streams to complete.
    pub pending_free_bytes: u64,
    /// Free bytes in pages that also hold slices, and in virtual-range
    /// buffers some of whose chunks are mapped (cannot be released as is).
    pub inactive_split_bytes: u64,
    /// Free bytes in pages that hold nothing and in virtual-range buffers
    /// none of whose chunks is mapped (released by `reclaim`).
    pub empty_page_bytes: u64,
    /// Pages of the sliced pool.
    pub sliced_pages: u64,
    /// Pages of the exclusive pool.
    pub exclusive_pages: u64,
    /// Buffers backing the virtual range (counted in `reserved_bytes`).
    pub virtual_blocks: u64,
    /// Bytes of those buffers mapped into the range now.
    pub mapped_bytes: u64,
    /// Distinct sliced page sizes held now.
    pub page_sizes: Vec<u64>,
    /// Highest `in_use_bytes` seen.
    pub peak_in_use_bytes: u64,
    /// Highest `requested_bytes` seen.
    pub peak_requested_bytes: u64,
    /// Highest `reserved_bytes` seen.
    pub peak_reserved_bytes: u64,
    /// Successful reservations.
    pub reservations: u64,
    /// Storage allocations made (pages added or backed).
    pub storage_allocs: u64,
    /// Storage deallocations made.
    pub storage_frees: u64,
    /// Calls of `reclaim`.
    pub reclaims: u64,
    /// Bytes released by reclaims, retries and compactions.
    pub reclaimed_bytes: u64,
    /// Requests that did not fit, released what could be released and retried.
    pub retries: u64,
    /// Requests answered `OutOfMemory`.
    pub ooms: u64,
    /// Committed compactions.
    pub compactions: u64,
    /// Allocations moved by committed compactions.
    pub relocations: u64,
}
