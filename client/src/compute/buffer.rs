//! `Buffer`: a reference-counted handle to device memory.

use std::sync::Arc;

use cistern_runtime::{Binding, BufferRef, Command, Region};

use super::client::ClientShared;

/// A device allocation. Cheap to clone; when the last clone drops, a free
/// is sent to the server (which reuses the memory once the streams that used
/// it are past their uses). Keeps its server alive.
///
/// A handle may be a view of a byte range of its allocation (the parameter
/// store hands out one per slot): its size, bindings and regions are then
/// the range's.
#[derive(Clone, Debug)]
pub struct Buffer {
    inner: Arc<BufferInner>,
    /// Where the handle's bytes start in the allocation.
    offset: u64,
    /// The handle's bytes.
    size: u64,
}

#[derive(Debug)]
struct BufferInner {
    reference: BufferRef,
    owner: Arc<ClientShared>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        // A gone server has nothing left to free.
        let _ = self.owner.server.send(Command::Free {
            buffer: self.reference,
        });
    }
}

impl Buffer {
    pub(crate) fn new(reference: BufferRef, size: u64, owner: Arc<ClientShared>) -> Self {
        Buffer {
            inner: Arc::new(BufferInner { reference, owner }),
            offset: 0,
            size,
        }
    }

    /// A handle to `size` bytes from `offset` of this one, sharing its
    /// allocation; `None` when the range does not fit.
    pub(crate) fn view(&self, offset: u64, size: u64) -> Option<Buffer> {
        let end = offset.checked_add(size)?;
        (end <= self.size).then(|| Buffer {
            inner: self.inner.clone(),
            offset: self.offset + offset,
            size,
        })
    }

    /// Its size in bytes, as reserved (a view's: its range's).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The name commands use for it (server, allocation, generation).
    pub fn reference(&self) -> BufferRef {
        self.inner.reference
    }

    /// The context generation it was reserved in: once the device's
    /// published generation differs, the buffer is stale.
    pub fn generation(&self) -> u64 {
        self.inner.reference.generation
    }

    /// A kernel binding of all its bytes.
    pub fn whole(&self) -> Binding {
        self.range(0, self.size)
    }

    /// A kernel binding of `size` bytes from `offset` (checked by the server).
    pub fn range(&self, offset: u64, size: u64) -> Binding {
        Binding {
            buffer: self.inner.reference,
            offset: self.offset.saturating_add(offset),
            size,
        }
    }

    /// A byte range of it, for transfers.
    pub fn region(&self, offset: u64, size: u64) -> Region {
        Region {
            buffer: self.inner.reference,
            offset: self.offset.saturating_add(offset),
            size,
        }
    }

    pub(crate) fn belongs_to(&self, owner: &Arc<ClientShared>) -> bool {
        Arc::ptr_eq(&self.inner.owner, owner)
    }
}
