//! `CudaStorage`: device memory as raw pointers owned by the memory
//! manager (never `CudaSlice`, never managed memory). With virtual memory
//! management, every buffer is a physical allocation mapped at an address of
//! its own, and also mappable into the manager's virtual range.

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

/// A buffer: its address, size, and physical handle when made through VMM.
#[derive(Debug)]
struct Buffer {
    address: u64,
    size: u64,
    physical: Option<CUmemGenericAllocationHandle>,
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
        let physical = vmm::create(device, size)?;
        let mapped = vmm::reserve(size, granularity).and_then(|address| {
            match vmm::map(device, address, size, physical, 0) {
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
                physical: Some(physical),
            }),
            Err(error) => {
                let _ = vmm::release(physical);
                Err(error)
            }
        }
    }
}

/// A driver failure as the manager's error: out of memory may succeed after
/// a reclaim; anything else is reported.
fn io_error(size: u64, error: &DriverError) -> IoError {
    if is_out_of_memory(error) {
        IoError::OutOfMemory {
            size,
            backtrace: BackTrace::none(),
        }
    } else {
        IoError::unknown(format!(
            "CUDA allocation of {size} bytes failed: {}",
            describe(error)
        ))
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
                    physical: None,
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
        match buffer.physical {
            Some(physical) => {
                let _ = vmm::unmap(buffer.address, buffer.size);
                let _ = vmm::free_addresses(buffer.address, buffer.size);
                let _ = vmm::release(physical);
            }
            None => {
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
            IoError::unknown(format!(
                "reserving {size} bytes of addresses failed: {}",
                describe(&e)
            ))
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
        for (offset, size) in range.mapped {
            let _ = vmm::unmap(range.address + offset, size);
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
        let physical = self
            .buffers
            .get(&buffer)
            .filter(|b| {
                buffer_offset
                    .checked_add(size)
                    .is_some_and(|end| end <= b.size)
            })
            .and_then(|b| b.physical);
        let Some(physical) = physical else {
            return Err(IoError::unknown(format!(
                "buffer {} cannot back {size} bytes at {buffer_offset}",
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
        vmm::map(
            device,
            target.address + range_offset,
            size,
            physical,
            buffer_offset,
        )
        .map_err(|e| IoError::unknown(format!("mapping {size} bytes failed: {}", describe(&e))))?;
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
        let _ = vmm::unmap(target.address + range_offset, size);
    }
}
