//! `HostSlice`: a resolved range of a host buffer, kept alive by its `Arc`.

use std::sync::Arc;

use cistern_memory::{HostBuffer, HostStorage, IoError, Reason, SliceLocation};

use crate::error::ServerError;

/// Bytes of one host buffer. Holding the `Arc` keeps the memory alive while
/// queued work uses it, even if the manager releases the page meanwhile.
#[derive(Clone, Debug)]
pub(super) struct HostSlice {
    buffer: Arc<HostBuffer>,
    offset: usize,
    len: usize,
}

impl HostSlice {
    /// Resolves `location` in `storage`.
    pub(super) fn resolve(
        storage: &HostStorage,
        location: SliceLocation,
    ) -> Result<HostSlice, ServerError> {
        let buffer = storage
            .buffer(location.storage)
            .ok_or_else(|| IoError::storage_handle_not_found(Reason::StorageReleased))?;
        let offset = usize::try_from(location.offset).ok();
        let len = usize::try_from(location.size).ok();
        match (offset, len) {
            (Some(offset), Some(len))
                if offset
                    .checked_add(len)
                    .is_some_and(|end| end <= buffer.len()) =>
            {
                Ok(HostSlice {
                    buffer,
                    offset,
                    len,
                })
            }
            _ => Err(ServerError::Io(IoError::unknown(format!(
                "slice {}+{} outside its host buffer of {} bytes",
                location.offset,
                location.size,
                buffer.len()
            )))),
        }
    }

    /// Its length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The bytes, read-only.
    ///
    /// # Safety
    /// No one writes them while the slice lives: the server never binds a
    /// written range together with another overlapping range, and streams
    /// touching the same memory concurrently is the caller's race, as on any device.
    pub(super) unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: in bounds (checked in `resolve`); no writer (caller).
        unsafe { self.buffer.slice(self.offset, self.len) }
    }

    /// The bytes, writable.
    ///
    /// # Safety
    /// No one else reads or writes them while the slice lives (see [`HostSlice::bytes`]).
    #[allow(clippy::mut_from_ref)] // device-memory semantics, as `HostBuffer::slice_mut`
    pub(super) unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: in bounds (checked in `resolve`); exclusive (caller).
        unsafe { self.buffer.slice_mut(self.offset, self.len) }
    }
}
