//! CUDA virtual memory management, from cudarc's `sys` layer: physical
//! allocations (`cuMemCreate`), address ranges (`cuMemAddressReserve`), and
//! mapping one into the other (`cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`).
//! Every size and offset is a multiple of [`granularity`].

use std::mem::MaybeUninit;

use cudarc::driver::DriverError;
use cudarc::driver::sys::{self, CUdevice, CUmemGenericAllocationHandle};

use super::ffi::Driver;

/// The properties of a pinned allocation on `device`.
fn properties(device: CUdevice) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct for which all-zero is the documented default.
    let mut prop: sys::CUmemAllocationProp = unsafe { MaybeUninit::zeroed().assume_init() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop
}

/// Whether `device` supports virtual memory management.
pub(super) fn supported(device: CUdevice) -> bool {
    let attribute =
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED;
    // SAFETY: `device` came from `cuDeviceGet`.
    unsafe { cudarc::driver::result::device::get_attribute(device, attribute) }
        .is_ok_and(|value| value != 0)
}

/// The granularity of physical allocations on `device`.
pub(super) fn granularity(device: CUdevice) -> Driver<u64> {
    let prop = properties(device);
    let mut bytes = 0usize;
    let minimum = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: both pointers are valid for the call.
    unsafe { sys::cuMemGetAllocationGranularity(&mut bytes, &prop, minimum).result()? };
    Ok(bytes as u64)
}

/// A physical allocation of `size` bytes on `device`.
pub(super) fn create(device: CUdevice, size: u64) -> Driver<CUmemGenericAllocationHandle> {
    let prop = properties(device);
    let mut handle = 0;
    // SAFETY: both pointers are valid for the call; released by `release`.
    unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0).result()? };
    Ok(handle)
}

/// Releases a physical allocation (its memory goes once nothing maps it).
pub(super) fn release(handle: CUmemGenericAllocationHandle) -> Driver<()> {
    // SAFETY: each handle is released once, by its storage.
    unsafe { sys::cuMemRelease(handle).result() }
}

/// Reserves `size` bytes of device address space, mapping nothing.
pub(super) fn reserve(size: u64, alignment: u64) -> Driver<u64> {
    let mut address = 0;
    // SAFETY: the pointer is valid for the call; freed by `free_addresses`.
    unsafe {
        sys::cuMemAddressReserve(&mut address, size as usize, alignment as usize, 0, 0).result()?
    };
    Ok(address)
}

/// Gives reserved address space back (nothing may be mapped in it).
pub(super) fn free_addresses(address: u64, size: u64) -> Driver<()> {
    // SAFETY: a range from `reserve`, freed once, after its unmaps.
    unsafe { sys::cuMemAddressFree(address, size as usize).result() }
}

/// Maps each of `chunks` (physical allocations of `chunk` bytes) whole,
/// one after another from `address`, readable and writable by `device`.
/// The driver maps a physical allocation only from its start (cuMemMap's
/// offset must be 0), so a buffer the manager maps piecewise is made of
/// chunks. On failure nothing stays mapped.
pub(super) fn map_chunks(
    device: CUdevice,
    address: u64,
    chunks: &[CUmemGenericAllocationHandle],
    chunk: u64,
) -> Driver<()> {
    let span = chunk * chunks.len() as u64;
    for (index, &handle) in chunks.iter().enumerate() {
        let at = address + index as u64 * chunk;
        // SAFETY: `at..+chunk` lies in a reserved range with nothing mapped
        // there (the manager's bitsets and the storage's checks); the whole
        // of `handle` is mapped.
        let mapped = unsafe { sys::cuMemMap(at, chunk as usize, 0, handle, 0).result() };
        if let Err(error) = mapped {
            unmap_chunks(address, index as u64 * chunk, chunk);
            return Err(error);
        }
    }
    let access = sys::CUmemAccessDesc {
        location: properties(device).location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `address..+span` was mapped just above.
    let access_set = unsafe { sys::cuMemSetAccess(address, span as usize, &access, 1).result() };
    if let Err(error) = access_set {
        unmap_chunks(address, span, chunk);
        return Err(error);
    }
    Ok(())
}

/// Unmaps the chunks of `chunk` bytes that [`map_chunks`] mapped one
/// after another over `span` bytes from `address`; failures are ignored
/// (after a reset there is nothing left to unmap).
pub(super) fn unmap_chunks(address: u64, span: u64, chunk: u64) {
    for index in 0..span / chunk.max(1) {
        let _ = unmap(address + index * chunk, chunk);
    }
}

/// Releases physical allocations (each goes once nothing maps it);
/// failures are ignored, as after a reset.
pub(super) fn release_chunks(chunks: &[CUmemGenericAllocationHandle]) {
    for &chunk in chunks {
        let _ = release(chunk);
    }
}

/// The chunks of a buffer of `chunks` chunks of `chunk` bytes that hold
/// `size` bytes from `offset`; `None` unless both are whole chunks inside it.
pub(super) fn chunk_span(
    offset: u64,
    size: u64,
    chunk: u64,
    chunks: usize,
) -> Option<std::ops::Range<usize>> {
    if chunk == 0 || size == 0 || offset % chunk != 0 || size % chunk != 0 {
        return None;
    }
    let first = usize::try_from(offset / chunk).ok()?;
    let end = first.checked_add(usize::try_from(size / chunk).ok()?)?;
    (end <= chunks).then_some(first..end)
}

/// Unmaps `size` bytes at `address`.
pub(super) fn unmap(address: u64, size: u64) -> Driver<()> {
    // SAFETY: the span was mapped by `map`; no queued work uses it (the
    // manager unmaps only chunks no held slice touches).
    unsafe { sys::cuMemUnmap(address, size as usize).result() }
}

/// The error a size that does not fit the platform's `usize` gets.
pub(super) fn too_large() -> DriverError {
    DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)
}

#[cfg(test)]
mod tests {
    use super::chunk_span;

    #[test]
    fn a_span_of_whole_chunks_inside_the_buffer_names_its_chunks() {
        let mb2 = 2 << 20;
        assert_eq!(chunk_span(0, mb2, mb2, 4), Some(0..1));
        assert_eq!(chunk_span(mb2, 2 * mb2, mb2, 4), Some(1..3));
        assert_eq!(chunk_span(3 * mb2, mb2, mb2, 4), Some(3..4));
    }

    #[test]
    fn a_span_off_a_chunk_boundary_or_past_the_buffer_is_refused() {
        let mb2 = 2 << 20;
        assert_eq!(chunk_span(mb2 / 2, mb2, mb2, 4), None);
        assert_eq!(chunk_span(0, mb2 + 256, mb2, 4), None);
        assert_eq!(chunk_span(3 * mb2, 2 * mb2, mb2, 4), None);
        assert_eq!(chunk_span(0, 0, mb2, 4), None);
        assert_eq!(chunk_span(u64::MAX - mb2 + 1, mb2, mb2, 4), None);
    }
}
