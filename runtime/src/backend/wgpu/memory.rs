//! How much memory an adapter has, where its driver says: wgpu reports no
//! device memory, so this asks the Vulkan driver beneath it for its heaps.

/// The size of the adapter's largest device-local memory heap, from Vulkan's
/// `vkGetPhysicalDeviceMemoryProperties`; `None` on other backends.
pub(super) fn device_local_bytes(adapter: &::wgpu::Adapter) -> Option<u64> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        vulkan_device_local_bytes(adapter)
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = adapter;
        None
    }
}

#[cfg(not(target_arch = "wasm32"))]
/// The largest device-local heap of a Vulkan adapter; `None` for others.
fn vulkan_device_local_bytes(adapter: &::wgpu::Adapter) -> Option<u64> {
    use ash::vk::MemoryHeapFlags;
    // SAFETY: the hal adapter is only read (its instance and physical
    // device), never used to create or destroy anything, and the guard is
    // dropped before this function returns.
    let hal = unsafe { adapter.as_hal::<::wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: the physical device belongs to this instance, which the guard
    // keeps alive; the query has no other precondition.
    let properties =
        unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    properties
        .memory_heaps_as_slice()
        .iter()
        .filter(|heap| heap.flags.contains(MemoryHeapFlags::DEVICE_LOCAL))
        .map(|heap| heap.size)
        .max()
        .filter(|&size| size > 0)
}
