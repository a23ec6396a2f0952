//! `CudaStorage`: device memory as raw pointers owned by the memory
//! manager (never `CudaSlice`, never managed memory). With virtual memory
//! management, every buffer is physical allocations of one granularity
//! each (the driver maps an allocation only whole), mapped one after
//! another at an address of their own, and also mappable, any whole run of
//! them, into the manager's virtual range.

use std::collections::BTreeMap;
use std::sync::Arc;

use cistern_memory::{BackTrace, IdMap, IoError, Storage, StorageHandle, StorageId};
use cudarc::driver::DriverError;
use cudarc::driver::sys::CUmemGenericAllocationHandle;

use super::context::CudaContext;
use super::ffi;
use super::status::{describe, is_out_of_memory};
use super::vmm;

/// The alignment of every buffer and slice.
pub const CUDA_ALIGNMENT: u64 = 256;

/// A buffer: its address, size, and physical chunks (of the storage's
/// granularity each) when made through VMM; none when made by cuMemAlloc.
#[derive(Debug)]
struct Buffer {
    address: u64,
    size: u64,
    chunks: Vec<CUmemGenericAllocationHandle>,
}

/// A reserved address range and the spans mapped in it.
#[derive(Debug)]
struct Range {
    address: u64,
    size: u64,
    /// Size of the span mapped at each offset now.
    mapped: BTreeMap<u64, u64>,
}

/// A CUDA device's memory as the manager sees it.
#[derive(Debug)]
pub struct CudaStorage {
    context: Arc<CudaContext>,
    buffers: IdMap<StorageId, Buffer>,
    ranges: IdMap<StorageId, Range>,
    next_id: u64,
    max_buffer_size: u64,
    /// The VMM granularity when the device supports it.
    granularity: Option<u64>,
}

impl CudaStorage {
    pub(super) fn new(context: Arc<CudaContext>, total_memory: u64) -> Self {
        let granularity = if vmm::supported(context.device) {
            vmm::granularity(context.device)
                .ok()
                .filter(|g| g.is_power_of_two())
        } else {
            None
        };
        CudaStorage {
            context,
            buffers: IdMap::default(),
            ranges: IdMap::default(),
            next_id: 0,
            max_buffer_size: total_memory,
            granularity,
        }
    }

    /// The device address of `offset` in buffer or range `id`, if `size`
    /// bytes from there lie inside it.
    pub(super) fn address(&self, id: StorageId, offset: u64, size: u64) -> Option<u64> {
        let (base, len) = match self.buffers.get(&id) {
            Some(buffer) => (buffer.address, buffer.size),
            None => self.ranges.get(&id).map(|r| (r.address, r.size))?,
        };
        let end = offset.checked_add(size)?;
        (end <= len).then(|| base + offset)
    }

    fn next(&mut self) -> StorageId {
        self.next_id += 1;
        StorageId(self.next_id)
    }

    fn alloc_physical(&self, size: u64, granularity: u64) -> Result<Buffer, DriverError> {
        let size = size.max(1).next_multiple_of(granularity);
        let device = self.context.device;
        let count = usize::try_from(size / granularity).map_err(|_| vmm::too_large())?;
        let mut chunks = Vec::with_capacity(count);
        for _ in 0..count {
            match vmm::create(device, granularity) {
                Ok(chunk) => chunks.push(chunk),
                Err(error) => {
                    vmm::release_chunks(&chunks);
                    return Err(error);
                }
            }
        }
        let mapped = vmm::reserve(size, granularity).and_then(|address| {
            match vmm::map_chunks(device, address, &chunks, granularity) {
                Ok(()) => Ok(address),
                Err(error) => {
                    let _ = vmm::free_addresses(address, size);
                    Err(error)
                }
            }
        });
        match mapped {
            Ok(address) => Ok(Buffer {
                address,
                size,
                chunks,
            }),
            Err(error) => {
                vmm::release_chunks(&chunks);
                Err(error)
            }
        }
    }
}

/// A driver failure as the manager's error: out of memory, or a refusal for
/// another reason (`AllocationFailed`); both may pass after a reclaim.
fn io_error(size: u64, error: &DriverError) -> IoError {
    if is_out_of_memory(error) {
        IoError::OutOfMemory {
            size,
            backtrace: BackTrace::none(),
        }
    } else {
        IoError::allocation_failed(size, format!("the CUDA driver: {}", describe(error)))
    }
}

impl Storage for CudaStorage {
    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        if size > self.max_buffer_size {
            return Err(IoError::BufferTooBig {
                size,
                backtrace: BackTrace::none(),
            });
        }
        self.context.bind().map_err(|e| io_error(size, &e))?;
        let buffer = match self.granularity {
            Some(granularity) => self.alloc_physical(size, granularity),
            None => {
                let bytes = usize::try_from(size.max(1)).map_err(|_| vmm::too_large());
                bytes.and_then(ffi::alloc).map(|address| Buffer {
                    address,
                    size,
                    chunks: Vec::new(),
                })
            }
        }
        .map_err(|e| io_error(size, &e))?;
        let id = self.next();
        let handle = StorageHandle {
            id,
            size: buffer.size,
        };
        self.buffers.insert(id, buffer);
        Ok(handle)
    }

    fn dealloc(&mut self, id: StorageId) {
        let Some(buffer) = self.buffers.remove(&id) else {
            return;
        };
        // After a context reset the memory is gone already and these fail:
        // nothing to do then but forget the buffer.
        let _ = self.context.bind();
        match self.granularity {
            Some(granularity) if !buffer.chunks.is_empty() => {
                vmm::unmap_chunks(buffer.address, buffer.size, granularity);
                let _ = vmm::free_addresses(buffer.address, buffer.size);
                vmm::release_chunks(&buffer.chunks);
            }
            _ => {
                let _ = ffi::free(buffer.address);
            }
        }
    }

    fn alignment(&self) -> u64 {
        CUDA_ALIGNMENT
    }

    fn max_buffer_size(&self) -> u64 {
        self.max_buffer_size
    }

    fn contains(&self, id: StorageId) -> bool {
        self.buffers.contains_key(&id) || self.ranges.contains_key(&id)
    }

    fn map_granularity(&self) -> Option<u64> {
        self.granularity
    }

    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let Some(granularity) = self.granularity else {
            return Err(IoError::unknown("this CUDA device cannot map memory"));
        };
        let size = size.max(1).next_multiple_of(granularity);
        self.context.bind().map_err(|e| io_error(size, &e))?;
        let address = vmm::reserve(size, granularity).map_err(|e| {
            IoError::allocation_failed(size, format!("reserving addresses: {}", describe(&e)))
        })?;
        let id = self.next();
        self.ranges.insert(
            id,
            Range {
                address,
                size,
                mapped: BTreeMap::new(),
            },
        );
        Ok(StorageHandle { id, size })
    }

    fn release_range(&mut self, range: StorageId) {
        let Some(range) = self.ranges.remove(&range) else {
            return;
        };
        let _ = self.context.bind();
        let granularity = self.granularity.unwrap_or(1);
        for (offset, size) in range.mapped {
            vmm::unmap_chunks(range.address + offset, size, granularity);
        }
        let _ = vmm::free_addresses(range.address, range.size);
    }

    fn map(
        &mut self,
        range: StorageId,
        range_offset: u64,
        buffer: StorageId,
        buffer_offset: u64,
        size: u64,
    ) -> Result<(), IoError> {
        let granularity = self.granularity.unwrap_or(0);
        let chunks = self.buffers.get(&buffer).and_then(|b| {
            let span = vmm::chunk_span(buffer_offset, size, granularity, b.chunks.len())?;
            b.chunks.get(span)
        });
        let Some(chunks) = chunks else {
            return Err(IoError::unknown(format!(
                "buffer {} cannot back {size} bytes at {buffer_offset} (whole chunks of {granularity} bytes only)",
                buffer.0
            )));
        };
        let device = self.context.device;
        let Some(target) = self.ranges.get_mut(&range) else {
            return Err(IoError::unknown(format!("no address range {}", range.0)));
        };
        let end = range_offset
            .checked_add(size)
            .filter(|&end| end <= target.size);
        let before = target.mapped.range(..=range_offset).next_back();
        let after = target.mapped.range(range_offset..).next();
        let overlaps = before.is_some_and(|(&offset, &len)| offset + len > range_offset)
            || after.is_some_and(|(&offset, _)| offset < range_offset + size);
        if end.is_none() || overlaps {
            return Err(IoError::unknown(format!(
                "{size} bytes at {range_offset} of range {} are taken or outside it",
                range.0
            )));
        }
        self.context.bind().map_err(|e| io_error(size, &e))?;
        vmm::map_chunks(device, target.address + range_offset, chunks, granularity)
            .map_err(|e| IoError::allocation_failed(size, format!("mapping: {}", describe(&e))))?;
        target.mapped.insert(range_offset, size);
        Ok(())
    }

    fn unmap(&mut self, range: StorageId, range_offset: u64, size: u64) {
        let Some(target) = self.ranges.get_mut(&range) else {
            return;
        };
        if target.mapped.get(&range_offset) != Some(&size) {
            return;
        }
        target.mapped.remove(&range_offset);
        let _ = self.context.bind();
        let granularity = self.granularity.unwrap_or(1);
        vmm::unmap_chunks(target.address + range_offset, size, granularity);
    }
}
