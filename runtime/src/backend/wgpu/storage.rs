//! `WgpuStorage`: wgpu buffers as the memory manager's pages.

use cistern_memory::{BackTrace, IdMap, IoError, Storage, StorageHandle, StorageId};
use std::sync::Arc;

use super::context::GpuContext;

/// Storage buffers (usable as bindings and copy ends) of one device.
#[derive(Debug)]
pub struct WgpuStorage {
    context: Arc<GpuContext>,
    buffers: IdMap<StorageId, ::wgpu::Buffer>,
    alignment: u64,
    max_buffer_size: u64,
    next_id: u64,
}

impl WgpuStorage {
    /// The storage of `context`'s device: aligned to its storage-binding
    /// offset alignment, capped at its largest buffer.
    pub(super) fn new(context: Arc<GpuContext>) -> Self {
        let alignment = context.offset_alignment;
        let max_buffer_size = context.device.limits().max_buffer_size / alignment * alignment;
        WgpuStorage {
            context,
            buffers: IdMap::default(),
            alignment,
            max_buffer_size,
            next_id: 0,
        }
    }

    /// The buffer behind `id`; `None` once deallocated.
    pub(super) fn buffer(&self, id: StorageId) -> Option<::wgpu::Buffer> {
        self.buffers.get(&id).cloned()
    }
}

impl Storage for WgpuStorage {
    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let too_big = || IoError::BufferTooBig {
            size,
            backtrace: BackTrace::none(),
        };
        let size = size
            .max(1)
            .checked_next_multiple_of(self.alignment)
            .ok_or_else(too_big)?;
        if size > self.max_buffer_size {
            return Err(too_big());
        }
        let device = &self.context.device;
        let memory = device.push_error_scope(::wgpu::ErrorFilter::OutOfMemory);
        let validation = device.push_error_scope(::wgpu::ErrorFilter::Validation);
        let buffer = device.create_buffer(&::wgpu::BufferDescriptor {
            label: None,
            size,
            usage: ::wgpu::BufferUsages::STORAGE
                | ::wgpu::BufferUsages::COPY_SRC
                | ::wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let invalid = pollster::block_on(validation.pop());
        let exhausted = pollster::block_on(memory.pop());
        if exhausted.is_some() {
            return Err(IoError::OutOfMemory {
                size,
                backtrace: BackTrace::none(),
            });
        }
        if let Some(error) = invalid {
            return Err(IoError::allocation_failed(size, format!("wgpu: {error}")));
        }
        let id = StorageId(self.next_id);
        self.next_id += 1;
        self.buffers.insert(id, buffer);
        Ok(StorageHandle { id, size })
    }

    fn dealloc(&mut self, id: StorageId) {
        // Queued work holding the buffer keeps it alive until it has run.
        self.buffers.remove(&id);
    }

    fn alignment(&self) -> u64 {
        self.alignment
    }

    fn max_buffer_size(&self) -> u64 {
        self.max_buffer_size
    }

    fn contains(&self, id: StorageId) -> bool {
        self.buffers.contains_key(&id)
    }
}
