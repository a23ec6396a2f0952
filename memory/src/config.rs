//! `MemoryConfig`: the manager's limits and tuning, passed in as a value.

use serde::{Deserialize, Serialize};

use crate::IoError;

const MIB: u64 = 1 << 20;

/// How a memory manager sizes pages and where it stops.
///
/// A plain value: the manager reads nothing else (no globals, no environment).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryConfig {
    /// Most bytes of pages the manager holds at once (the device budget).
    pub limit: u64,
    /// Smallest page of the sliced pool. Requests of at least this many
    /// bytes (and below `exclusive_threshold`) are large: they share pages
    /// only with each other, and a page added for one is sized to it.
    pub min_page_size: u64,
    /// Largest page of the sliced pool (also capped by the limit and by the
    /// storage's largest buffer).
    pub max_page_size: u64,
    /// Most distinct sliced-pool page sizes held at once; a request needing
    /// one more is `PageSizesExhausted`.
    pub max_page_sizes: usize,
    /// A new page for small requests is at least the bytes of small-request
    /// pages divided by this, so page sizes grow with demand (a few powers
    /// of two).
    pub page_growth_divisor: u64,
    /// Requests of at least this many bytes get an exclusive page of their own.
    pub exclusive_threshold: u64,
    /// A free exclusive page is reused for a request only if it wastes at
    /// most this percentage of the page.
    pub exclusive_max_waste_percent: u64,
    /// Empty pages (of both pools) are kept for reuse while the pages held
    /// stay within this percentage above the peak bytes in use (plus one
    /// smallest page); beyond it, a page is released as it empties if an
    /// empty page as large remains, and the largest empty pages are released
    /// before a new page is added.
    pub idle_percent: u64,
    /// Where the storage can map memory into address ranges: place every
    /// request (dry runs aside) in one address range backed chunk by chunk,
    /// so space freed anywhere serves any later request. `false`: pages only.
    pub virtual_memory: bool,
    /// Bytes of one mapped chunk: a power of two and a multiple of the
    /// storage's map granularity (else the manager uses pages only).
    pub chunk_size: u64,
    /// Most chunks in one buffer allocated to back chunks. Buffers grow with
    /// the bytes held (a sixteenth of them) from one chunk up to this many.
    pub max_block_chunks: u64,
}

impl MemoryConfig {
    /// Sensible defaults under a memory limit of `limit` bytes.
    pub fn with_limit(limit: u64) -> Self {
        MemoryConfig {
            limit,
            min_page_size: 8 * MIB,
            max_page_size: 256 * MIB,
            max_page_sizes: 32,
            page_growth_divisor: 8,
            exclusive_threshold: 256 * MIB,
            exclusive_max_waste_percent: 25,
            idle_percent: 35,
            virtual_memory: true,
            chunk_size: 2 * MIB,
            max_block_chunks: 16,
        }
    }

    /// Checks the values make sense together; the manager refuses a config that does not.
    pub fn validate(&self) -> Result<(), IoError> {
        let problem = if self.limit == 0 {
            Some("limit must be positive")
        } else if self.min_page_size == 0 || self.max_page_size < self.min_page_size {
            Some("page sizes must satisfy 0 < min_page_size <= max_page_size")
        } else if self.max_page_sizes == 0 {
            Some("max_page_sizes must be positive")
        } else if self.page_growth_divisor == 0 {
            Some("page_growth_divisor must be positive")
        } else if !self.chunk_size.is_power_of_two() || self.max_block_chunks == 0 {
            Some("chunk_size must be a power of two and max_block_chunks positive")
        } else if self.exclusive_max_waste_percent > 100 {
            Some("exclusive_max_waste_percent must be at most 100")
        } else {
            None
        };
        match problem {
            Some(message) => Err(IoError::unknown(format!(
                "invalid memory config: {message}"
            ))),
            None => Ok(()),
        }
    }
}
