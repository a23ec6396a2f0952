//! Shared helpers for the memory manager tests (included with `mod`).

#![allow(dead_code)]

use cistern_memory::{
    AllocationId, AllocationPolicy, BackTrace, BookkeepingStorage, IoError, MemoryConfig,
    MemoryManager, Storage, StorageHandle, StorageId, StreamId,
};

/// A kibibyte.
pub const KIB: u64 = 1 << 10;
/// A mebibyte.
pub const MIB: u64 = 1 << 20;
/// The stream most tests use.
pub const S0: StreamId = StreamId(0);
/// A second stream.
pub const S1: StreamId = StreamId(1);

/// Small pages so a test exercises many pages in few bytes.
pub fn small_config(limit: u64) -> MemoryConfig {
    MemoryConfig {
        limit,
        min_page_size: 64 * KIB,
        max_page_size: MIB,
        max_page_sizes: 8,
        page_growth_divisor: 8,
        exclusive_threshold: 512 * KIB,
        exclusive_max_waste_percent: 25,
        idle_percent: 60,
        virtual_memory: true,
        chunk_size: CHUNK,
        max_block_chunks: 4,
    }
}

/// The chunk of `small_config`'s virtual range.
pub const CHUNK: u64 = 64 * KIB;

/// A bookkeeping storage that can map at 16 KiB, so a manager with
/// `small_config` places requests in its virtual range.
pub fn mapping_storage() -> BookkeepingStorage {
    BookkeepingStorage::new(256).with_map_granularity(Some(16 * KIB))
}

/// A manager on a mapping bookkeeping storage with `small_config(limit)`.
pub fn virtual_manager(limit: u64) -> MemoryManager<BookkeepingStorage> {
    match MemoryManager::new(mapping_storage(), small_config(limit)) {
        Ok(manager) => manager,
        Err(e) => panic!("a valid config is accepted: {e}"),
    }
}

/// A manager on bookkeeping storage with `small_config(limit)`.
pub fn manager(limit: u64) -> MemoryManager<BookkeepingStorage> {
    match MemoryManager::new(BookkeepingStorage::new(256), small_config(limit)) {
        Ok(manager) => manager,
        Err(e) => panic!("a valid config is accepted: {e}"),
    }
}

/// Reserves `size` bytes on `S0`, panicking on failure.
pub fn reserve<S: Storage>(manager: &mut MemoryManager<S>, size: u64) -> AllocationId {
    reserve_on(manager, size, S0)
}

/// Reserves `size` bytes on `stream`, panicking on failure.
pub fn reserve_on<S: Storage>(
    manager: &mut MemoryManager<S>,
    size: u64,
    stream: StreamId,
) -> AllocationId {
    match manager.reserve(size, AllocationPolicy::Allow, 0, stream) {
        Ok(id) => id,
        Err(e) => panic!("reserving {size} bytes failed: {e}"),
    }
}

/// Resolves `id`, panicking on failure.
pub fn locate<S: Storage>(
    manager: &mut MemoryManager<S>,
    id: AllocationId,
) -> cistern_memory::SliceLocation {
    match manager.locate(id) {
        Ok(location) => location,
        Err(e) => panic!("locating {id:?} failed: {e}"),
    }
}

/// A storage whose allocations fail with `error` once `remaining` have
/// succeeded, and whose maps fail with it while `fail_maps` is set.
pub struct FailingStorage {
    /// The storage that does the work.
    pub inner: BookkeepingStorage,
    /// Allocations left before it fails.
    pub remaining: u64,
    /// Whether maps fail.
    pub fail_maps: bool,
    /// What it fails with.
    pub error: IoError,
}

impl FailingStorage {
    /// Fails with `OutOfMemory` after `remaining` allocations.
    pub fn failing_after(remaining: u64) -> Self {
        FailingStorage {
            inner: BookkeepingStorage::new(256),
            remaining,
            fail_maps: false,
            error: IoError::OutOfMemory {
                size: 0,
                backtrace: BackTrace::none(),
            },
        }
    }

    /// A storage that maps (like `mapping_storage`) and fails nothing yet.
    pub fn mapping() -> Self {
        FailingStorage {
            inner: mapping_storage(),
            ..FailingStorage::failing_after(u64::MAX)
        }
    }
}

impl Storage for FailingStorage {
    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        if self.remaining == 0 {
            return Err(self.error.clone());
        }
        self.remaining -= 1;
        self.inner.alloc(size)
    }

    fn dealloc(&mut self, id: StorageId) {
        self.inner.dealloc(id)
    }

    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }

    fn max_buffer_size(&self) -> u64 {
        self.inner.max_buffer_size()
    }

    fn contains(&self, id: StorageId) -> bool {
        self.inner.contains(id)
    }

    fn map_granularity(&self) -> Option<u64> {
        self.inner.map_granularity()
    }

    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        self.inner.reserve_range(size)
    }

    fn release_range(&mut self, range: StorageId) {
        self.inner.release_range(range)
    }

    fn map(
        &mut self,
        range: StorageId,
        range_offset: u64,
        buffer: StorageId,
        buffer_offset: u64,
        size: u64,
    ) -> Result<(), IoError> {
        if self.fail_maps {
            return Err(self.error.clone());
        }
        self.inner
            .map(range, range_offset, buffer, buffer_offset, size)
    }

    fn unmap(&mut self, range: StorageId, range_offset: u64, size: u64) {
        self.inner.unmap(range, range_offset, size)
    }
}
