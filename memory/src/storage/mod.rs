//! What a backend gives the memory manager: the [`Storage`] trait and its handles.
//!
//! A backend learns what it must provide from this file alone: allocate a
//! buffer, give it back, and say its alignment and its largest buffer. A
//! storage that can map memory into reserved address ranges (CUDA's virtual
//! memory management, or a bookkeeping storage) also says so, and the
//! manager then places requests in one range backed chunk by chunk.

mod bookkeeping;
mod host;

pub use bookkeeping::BookkeepingStorage;
pub use host::{HostBuffer, HostStorage};

use serde::{Deserialize, Serialize};

use crate::IoError;

/// Names one storage allocation (one page). A storage never reuses an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StorageId(pub u64);

/// A storage allocation as the storage handed it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StorageHandle {
    /// Its id, never reused by this storage.
    pub id: StorageId,
    /// Its size in bytes (at least what was asked for).
    pub size: u64,
}

/// Device memory as the memory manager sees it: whole buffers, no slicing.
pub trait Storage: Send {
    /// Allocates a buffer of at least `size` bytes, aligned to [`Storage::alignment`].
    ///
    /// A buffer the device has no room for is `IoError::OutOfMemory`, one it
    /// refuses for another reason `IoError::AllocationFailed`; for either
    /// the manager releases what it can and retries once.
    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError>;

    /// Gives a buffer back. Unknown ids are ignored.
    fn dealloc(&mut self, id: StorageId);

    /// The alignment of every buffer and the granularity of every slice (a power of two).
    fn alignment(&self) -> u64;

    /// The largest single buffer the device can hold.
    fn max_buffer_size(&self) -> u64;

    /// Whether `id` is a buffer this storage still holds. Storages that cannot
    /// tell answer `true`; the manager asks it only when resolving a slice.
    fn contains(&self, id: StorageId) -> bool {
        let _ = id;
        true
    }

    /// The granularity (a power of two) at which this storage maps buffers
    /// into address ranges, or `None` if it cannot; then the manager uses
    /// pages only and never calls the range methods below.
    fn map_granularity(&self) -> Option<u64> {
        None
    }

    /// Reserves an address range of `size` bytes with no memory behind it;
    /// slices of it are located like slices of a buffer. It holds no memory,
    /// so it counts toward no limit.
    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        Err(IoError::unknown(format!(
            "this storage cannot reserve an address range ({size} bytes)"
        )))
    }

    /// Gives a range back; whatever is still mapped in it is unmapped first.
    fn release_range(&mut self, range: StorageId) {
        let _ = range;
    }

    /// Maps `size` bytes of `buffer` at `buffer_offset` into `range` at
    /// `range_offset` (all multiples of the granularity); the bytes keep their
    /// contents and move with the mapping.
    fn map(
        &mut self,
        range: StorageId,
        range_offset: u64,
        buffer: StorageId,
        buffer_offset: u64,
        size: u64,
    ) -> Result<(), IoError> {
        let _ = (range, range_offset, buffer, buffer_offset);
        Err(IoError::unknown(format!(
            "this storage cannot map memory ({size} bytes)"
        )))
    }

    /// Unmaps `size` bytes of `range` at `range_offset`, returning them to the
    /// buffer they came from.
    fn unmap(&mut self, range: StorageId, range_offset: u64, size: u64) {
        let _ = (range, range_offset, size);
    }
}

impl<S: Storage + ?Sized> Storage for Box<S> {
    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        (**self).alloc(size)
    }

    fn dealloc(&mut self, id: StorageId) {
        (**self).dealloc(id)
    }

    fn alignment(&self) -> u64 {
        (**self).alignment()
    }

    fn max_buffer_size(&self) -> u64 {
        (**self).max_buffer_size()
    }

    fn contains(&self, id: StorageId) -> bool {
        (**self).contains(id)
    }

    fn map_granularity(&self) -> Option<u64> {
        (**self).map_granularity()
    }

    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        (**self).reserve_range(size)
    }

    fn release_range(&mut self, range: StorageId) {
        (**self).release_range(range)
    }

    fn map(
        &mut self,
        range: StorageId,
        range_offset: u64,
        buffer: StorageId,
        buffer_offset: u64,
        size: u64,
    ) -> Result<(), IoError> {
        (**self).map(range, range_offset, buffer, buffer_offset, size)
    }

    fn unmap(&mut self, range: StorageId, range_offset: u64, size: u64) {
        (**self).unmap(range, range_offset, size)
    }
}
