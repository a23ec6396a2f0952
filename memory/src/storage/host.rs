//! `HostStorage`: aligned host memory, each buffer behind an `Arc`.

use crate::IdMap;
use std::alloc::Layout;
use std::sync::Arc;

use super::{Storage, StorageHandle, StorageId};
use crate::{BackTrace, IoError};

/// One aligned, zero-initialised host buffer.
///
/// Shared by `Arc` so an executor can keep it alive while a kernel runs even
/// if the manager deallocates the page meanwhile. Access goes through raw
/// pointers, like device memory: the caller rules out conflicting access.
#[derive(Debug)]
pub struct HostBuffer {
    ptr: std::ptr::NonNull<u8>,
    layout: Layout,
    len: usize,
}

// SAFETY: the buffer is plain bytes owned by this value; synchronising access
// to those bytes is the caller's duty, as documented on `slice`/`slice_mut`.
unsafe impl Send for HostBuffer {}
// SAFETY: as above; `&HostBuffer` only hands out raw access under `unsafe`.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    fn new(len: usize, alignment: usize) -> Option<Self> {
        // Buffers of a huge page or more start on a huge-page boundary, so
        // transparent huge pages can back them whole: at 4 KiB pages a
        // streaming kernel over several 256 MiB buffers misses the TLB on
        // every page of every stream (measured under issue 7: the history
        // of docs/benchmarks.md).
        let alignment = if len >= HUGE_PAGE {
            alignment.max(HUGE_PAGE)
        } else {
            alignment
        };
        let layout = Layout::from_size_align(len.max(1), alignment).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let ptr = std::ptr::NonNull::new(ptr)?;
        if len >= HUGE_PAGE {
            advise_huge_pages(ptr.as_ptr(), layout.size());
        }
        // Zeroed after the advice, so the first touch already faults huge pages in.
        // SAFETY: `ptr` is valid for `layout.size()` bytes, just allocated.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, layout.size()) };
        Some(HostBuffer { ptr, layout, len })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of its first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes `offset .. offset + len`.
    ///
    /// # Safety
    /// No one writes these bytes while the returned slice lives.
    ///
    /// # Panics
    /// If the range is outside the buffer (which would otherwise be undefined behaviour).
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        self.check(offset, len);
        // SAFETY: in bounds (checked above); no conflicting writes (caller).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }

    /// The bytes `offset .. offset + len`, writable.
    ///
    /// # Safety
    /// No one else reads or writes these bytes while the returned slice lives.
    ///
    /// # Panics
    /// If the range is outside the buffer (which would otherwise be undefined behaviour).
    #[allow(clippy::mut_from_ref)] // device-memory semantics: exclusivity is the caller's contract
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        self.check(offset, len);
        // SAFETY: in bounds (checked above); exclusive access (caller).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) }
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "range {offset}+{len} outside a host buffer of {} bytes",
            self.len
        );
    }
}

/// The huge-page size of x86-64 and most aarch64 Linux kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Asks Linux to back `len` bytes at `ptr` with transparent huge pages, which
/// it does only on request when THP is in `madvise` mode (the usual default).
/// Advice only: a refusal changes nothing but speed, so its result is ignored.
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    // std links the C library already; this is its `madvise(2)`.
    unsafe extern "C" {
        fn madvise(
            addr: *mut std::ffi::c_void,
            len: usize,
            advice: std::ffi::c_int,
        ) -> std::ffi::c_int;
    }
    const MADV_HUGEPAGE: std::ffi::c_int = 14;
    // SAFETY: the range is one live allocation of ours; the advice changes
    // how it is backed, never its contents or validity.
    unsafe { madvise(ptr.cast(), len, MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Aligned host memory: the CPU backend's storage.
#[derive(Debug)]
pub struct HostStorage {
    alignment: u64,
    max_buffer_size: u64,
    capacity: u64,
    buffers: IdMap<StorageId, Arc<HostBuffer>>,
    held_bytes: u64,
    next_id: u64,
}

impl HostStorage {
    /// Host storage aligned to 256 bytes, with no capacity limit of its own.
    pub fn new() -> Self {
        HostStorage::with_alignment(256)
    }

    /// Host storage aligned to `alignment` bytes (rounded up to a power of two).
    pub fn with_alignment(alignment: u64) -> Self {
        HostStorage {
            alignment: alignment.clamp(1, 1 << 30).next_power_of_two(),
            max_buffer_size: isize::MAX as u64 / 2,
            capacity: u64::MAX,
            buffers: IdMap::default(),
            held_bytes: 0,
            next_id: 0,
        }
    }

    /// The same storage, answering `OutOfMemory` once it would hold more than `bytes`.
    pub fn with_capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self
    }

    /// The buffer behind `id`, shared; `None` once deallocated.
    pub fn buffer(&self, id: StorageId) -> Option<Arc<HostBuffer>> {
        self.buffers.get(&id).cloned()
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Buffers held now.
    pub fn held_buffers(&self) -> usize {
        self.buffers.len()
    }
}

impl Default for HostStorage {
    fn default() -> Self {
        HostStorage::new()
    }
}

impl Storage for HostStorage {
    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        if size > self.max_buffer_size {
            return Err(IoError::BufferTooBig {
                size,
                backtrace: BackTrace::none(),
            });
        }
        let out_of_memory = || IoError::OutOfMemory {
            size,
            backtrace: BackTrace::none(),
        };
        if self.held_bytes.saturating_add(size) > self.capacity {
            return Err(out_of_memory());
        }
        let len = usize::try_from(size).map_err(|_| out_of_memory())?;
        let alignment = usize::try_from(self.alignment).map_err(|_| out_of_memory())?;
        let buffer = HostBuffer::new(len, alignment).ok_or_else(out_of_memory)?;
        let id = StorageId(self.next_id);
        self.next_id += 1;
        self.buffers.insert(id, Arc::new(buffer));
        self.held_bytes += size;
        Ok(StorageHandle { id, size })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(buffer) = self.buffers.remove(&id) {
            self.held_bytes -= buffer.len() as u64;
        }
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
