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

/// Maps `size` bytes of `handle` from `offset` at `address`, readable and
/// writable by `device`.
pub(super) fn map(
    device: CUdevice,
    address: u64,
    size: u64,
    handle: CUmemGenericAllocationHandle,
    offset: u64,
) -> Driver<()> {
    let access = sys::CUmemAccessDesc {
        location: properties(device).location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `address..+size` lies in a reserved range with nothing mapped
    // there (the manager's bitsets and the storage's checks), and
    // `offset..+size` lies in the physical allocation.
    unsafe {
        sys::cuMemMap(address, size as usize, offset as usize, handle, 0).result()?;
        let access_set = sys::cuMemSetAccess(address, size as usize, &access, 1).result();
        if let Err(error) = access_set {
            let _ = sys::cuMemUnmap(address, size as usize).result();
            return Err(error);
        }
    }
    Ok(())
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
