//! What a backend gives the memory manager: the [`Storage`] trait and its handles.
//!
//! A backend learns what it must provide from this file alone: allocate a
//! buffer, give it back, and say its alignment and its largest buffer.

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
    /// A buffer the device has no room for is `IoError::OutOfMemory`; the
    /// manager then releases what it can and retries once.
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
}
