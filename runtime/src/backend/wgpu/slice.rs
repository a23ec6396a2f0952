//! `GpuSlice`: a resolved range of one wgpu buffer.

use cistern_memory::{IoError, Reason, SliceLocation};

use super::storage::WgpuStorage;
use crate::error::ServerError;

/// Bytes `offset..offset + size` of a buffer. The buffer handle keeps the
/// memory alive while queued work uses it, even if the manager releases
/// the page meanwhile.
#[derive(Clone, Debug)]
pub(crate) struct GpuSlice {
    pub(super) buffer: ::wgpu::Buffer,
    pub(super) offset: u64,
    pub(super) size: u64,
}

impl GpuSlice {
    /// Resolves `location` in `storage`.
    pub(super) fn resolve(
        storage: &WgpuStorage,
        location: SliceLocation,
    ) -> Result<GpuSlice, ServerError> {
        let buffer = storage
            .buffer(location.storage)
            .ok_or_else(|| IoError::storage_handle_not_found(Reason::StorageReleased))?;
        let inside = location
            .offset
            .checked_add(location.size)
            .is_some_and(|end| end <= buffer.size());
        if !inside {
            return Err(ServerError::Io(IoError::unknown(format!(
                "slice {}+{} outside its buffer of {} bytes",
                location.offset,
                location.size,
                buffer.size()
            ))));
        }
        Ok(GpuSlice {
            buffer,
            offset: location.offset,
            size: location.size,
        })
    }

    /// The same buffer, `first` bytes in, `size` bytes long.
    pub(super) fn part(&self, first: u64, size: u64) -> GpuSlice {
        GpuSlice {
            buffer: self.buffer.clone(),
            offset: self.offset + first,
            size,
        }
    }
}
