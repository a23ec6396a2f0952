//! `BookkeepingStorage`: ids and sizes, no memory behind them.

use std::collections::HashMap;

use super::{Storage, StorageHandle, StorageId};
use crate::{BackTrace, IoError};

/// A storage that only counts: it hands out ids and remembers sizes, with no
/// memory behind them. For tests and the allocation benchmark, where memory
/// is not the point.
#[derive(Debug)]
pub struct BookkeepingStorage {
    alignment: u64,
    max_buffer_size: u64,
    capacity: u64,
    held: HashMap<StorageId, u64>,
    held_bytes: u64,
    next_id: u64,
}

impl BookkeepingStorage {
    /// A storage with the given alignment (rounded up to a power of two) and
    /// no capacity limit.
    pub fn new(alignment: u64) -> Self {
        BookkeepingStorage {
            alignment: alignment.max(1).next_power_of_two(),
            max_buffer_size: u64::MAX / 2,
            capacity: u64::MAX,
            held: HashMap::new(),
            held_bytes: 0,
            next_id: 0,
        }
    }

    /// The same storage, refusing any single buffer above `bytes` (`max_buffer_size`).
    pub fn with_max_buffer_size(mut self, bytes: u64) -> Self {
        self.max_buffer_size = bytes;
        self
    }

    /// The same storage, answering `OutOfMemory` once it would hold more than `bytes`.
    pub fn with_capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Buffers held now.
    pub fn held_buffers(&self) -> usize {
        self.held.len()
    }
}

impl Default for BookkeepingStorage {
    fn default() -> Self {
        BookkeepingStorage::new(256)
    }
}

impl Storage for BookkeepingStorage {
    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        // Cheap errors: the manager captures its own backtrace if it gives up.
        if size > self.max_buffer_size {
            return Err(IoError::BufferTooBig {
                size,
                backtrace: BackTrace::none(),
            });
        }
        if self.held_bytes.saturating_add(size) > self.capacity {
            return Err(IoError::OutOfMemory {
                size,
                backtrace: BackTrace::none(),
            });
        }
        let id = StorageId(self.next_id);
        self.next_id += 1;
        self.held.insert(id, size);
        self.held_bytes += size;
        Ok(StorageHandle { id, size })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(size) = self.held.remove(&id) {
            self.held_bytes -= size;
        }
    }

    fn alignment(&self) -> u64 {
        self.alignment
    }

    fn max_buffer_size(&self) -> u64 {
        self.max_buffer_size
    }

    fn contains(&self, id: StorageId) -> bool {
        self.held.contains_key(&id)
    }
}
