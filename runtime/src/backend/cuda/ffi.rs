//! Every raw driver call the backend makes, each a small safe wrapper over
//! cudarc's `result` / `sys` layers with the reason it is sound. Callers
//! hold plain handles (`u64` device pointers, `CUstream`s) whose lifetimes
//! the backend tracks.
//!
//! Nothing here may run before [`super::driver::driver`] answered `Ok`: any
//! cudarc call panics when the library is missing.

use std::ffi::{CString, c_void};

use cudarc::driver::sys::{
    self, CUcontext, CUdevice, CUevent, CUfunction, CUgraph, CUgraphExec, CUmodule, CUstream,
};
use cudarc::driver::{DriverError, result};

/// A driver call's outcome.
pub(super) type Driver<T> = Result<T, DriverError>;

/// Makes `context` current on the calling thread.
pub(super) fn set_current(context: CUcontext) -> Driver<()> {
    // SAFETY: `context` is a retained primary context (see `context.rs`).
    unsafe { result::ctx::set_current(context) }
}

/// Retains the primary context of `device`.
pub(super) fn retain_primary(device: CUdevice) -> Driver<CUcontext> {
    // SAFETY: `device` came from `cuDeviceGet`; released by `release_primary`.
    unsafe { result::primary_ctx::retain(device) }
}

/// Releases one retain of the primary context of `device`.
pub(super) fn release_primary(device: CUdevice) -> Driver<()> {
    // SAFETY: paired with `retain_primary`.
    unsafe { result::primary_ctx::release(device) }
}

/// Destroys every allocation, stream and module of `device`'s primary
/// context: the only way out of a sticky fault.
pub(super) fn reset_primary(device: CUdevice) -> Driver<()> {
    // SAFETY: the backend calls this only once every stream is idle and
    // forgets every handle of the old context.
    unsafe { sys::cuDevicePrimaryCtxReset_v2(device).result() }
}

/// Waits for everything on the current context.
pub(super) fn synchronize_context() -> Driver<()> {
    result::ctx::synchronize()
}

/// `(free, total)` device memory of the current context.
pub(super) fn memory_info() -> Driver<(usize, usize)> {
    result::mem_get_info()
}

/// `bytes` of device memory (never managed memory).
pub(super) fn alloc(bytes: usize) -> Driver<u64> {
    // SAFETY: the memory is uninitialised bytes, only ever written or
    // copied into before it is read through the stream protocol.
    unsafe { result::malloc_sync(bytes) }
}

/// Frees memory from [`alloc`].
pub(super) fn free(pointer: u64) -> Driver<()> {
    // SAFETY: the storage frees each pointer once, after the manager
    // released it (no queued work uses it: frees are stream-ordered).
    unsafe { result::free_sync(pointer) }
}

/// A new non-blocking stream on the current context.
pub(super) fn stream_create() -> Driver<CUstream> {
    result::stream::create(result::stream::StreamKind::NonBlocking)
}

/// Destroys a stream once its work is done.
pub(super) fn stream_destroy(stream: CUstream) -> Driver<()> {
    // SAFETY: called once, by the stream's owner, never used after.
    unsafe { result::stream::destroy(stream) }
}

/// Waits for everything queued on `stream`.
pub(super) fn stream_synchronize(stream: CUstream) -> Driver<()> {
    // SAFETY: `stream` is live (owned by the caller).
    unsafe { result::stream::synchronize(stream) }
}

/// Copies `data` to device memory at `target` (at least as long) on
/// `stream`, then waits, so `data` may go at once.
pub(super) fn write(target: u64, data: &[u8], stream: CUstream) -> Driver<()> {
    // SAFETY: the server checked `target` spans `data.len()` bytes; the
    // synchronize keeps `data` borrowed until the copy is done.
    unsafe {
        result::memcpy_htod_async(target, data, stream)?;
        result::stream::synchronize(stream)
    }
}

/// `len` bytes of device memory at `source`, read on `stream`.
pub(super) fn read(source: u64, len: usize, stream: CUstream) -> Driver<Vec<u8>> {
    let mut bytes = vec![0u8; len];
    // SAFETY: the server checked `source` spans `len` bytes; the
    // synchronize ends the copy before `bytes` is returned.
    unsafe {
        result::memcpy_dtoh_async(&mut bytes, source, stream)?;
        result::stream::synchronize(stream)?;
    }
    Ok(bytes)
}

/// Queues a device-to-device copy of `len` bytes.
pub(super) fn copy(source: u64, target: u64, len: usize, stream: CUstream) -> Driver<()> {
    // SAFETY: the server checked both ranges and that they do not overlap.
    unsafe { result::memcpy_dtod_async(target, source, len, stream) }
}

/// A new event that records no timing.
pub(super) fn event_create() -> Driver<CUevent> {
    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
}

/// Records `event` on `stream`.
pub(super) fn event_record(event: CUevent, stream: CUstream) -> Driver<()> {
    // SAFETY: both are live handles of the current context.
    unsafe { result::event::record(event, stream) }
}

/// Makes `stream` wait (on the device) for `event`'s last record.
pub(super) fn stream_wait(stream: CUstream, event: CUevent) -> Driver<()> {
    // SAFETY: both are live handles of the current context.
    unsafe {
        result::stream::wait_event(
            stream,
            event,
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
}

/// Destroys an event.
pub(super) fn event_destroy(event: CUevent) -> Driver<()> {
    // SAFETY: called once by the event's owner.
    unsafe { result::event::destroy(event) }
}

/// Loads a module from PTX text (the driver JITs it for this device).
pub(super) fn module_load(ptx: &CString) -> Driver<CUmodule> {
    // SAFETY: `ptx` is NUL-terminated PTX text that outlives the call.
    unsafe { result::module::load_data(ptx.as_ptr().cast()) }
}

/// The kernel `name` of `module`.
pub(super) fn function(module: CUmodule, name: &str) -> Driver<CUfunction> {
    let name =
        CString::new(name).map_err(|_| DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE))?;
    // SAFETY: `module` is loaded in the current context.
    unsafe { result::module::get_function(module, name) }
}

/// Unloads a module.
pub(super) fn module_unload(module: CUmodule) -> Driver<()> {
    // SAFETY: called once, when no launch of it is queued (context idle).
    unsafe { result::module::unload(module) }
}

/// Queues `function` on `stream` with `params` (pointers to each argument).
///
/// # Safety
/// Each pointer of `params` points at a live value of the type the kernel
/// declares for that argument, in order, and every device pointer among
/// them spans what the kernel touches for the sizes passed.
pub(super) unsafe fn launch(
    function: CUfunction,
    grid: u32,
    block: u32,
    stream: CUstream,
    params: &mut [*mut c_void],
) -> Driver<()> {
    // SAFETY: the caller's.
    unsafe { result::launch_kernel(function, (grid, 1, 1), (block, 1, 1), 0, stream, params) }
}

/// Starts capturing `stream`'s work into a graph instead of running it.
/// Thread-local: only this thread is barred from calls unsafe during a
/// capture; the server and other streams' threads go on as before.
pub(super) fn begin_capture(stream: CUstream) -> Driver<()> {
    // SAFETY: `stream` is live and owned by the calling executor.
    unsafe {
        result::stream::begin_capture(
            stream,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    }
}

/// Ends the capture on `stream` (which leaves capture mode whatever the
/// answer): the graph, or null where the capture was invalidated. A graph
/// handed back with an error is destroyed here.
pub(super) fn end_capture(stream: CUstream) -> Driver<CUgraph> {
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: `stream` is live and capturing, begun on this thread; the
    // driver writes at most one handle to `graph`.
    let ended = unsafe { sys::cuStreamEndCapture(stream, &mut graph) }.result();
    if ended.is_err() && !graph.is_null() {
        let _ = graph_destroy(graph);
    }
    ended.map(|()| graph)
}

/// Whether `stream` is still capturing (active or invalidated).
pub(super) fn is_capturing(stream: CUstream) -> Driver<bool> {
    // SAFETY: `stream` is live.
    let status = unsafe { result::stream::is_capturing(stream) }?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// An executable graph of `graph`, with no instantiation flags.
pub(super) fn instantiate(graph: CUgraph) -> Driver<CUgraphExec> {
    // SAFETY: `graph` is a live graph from `end_capture`, used by one thread.
    unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
}

/// Queues the executable graph `exec` on `stream`.
pub(super) fn graph_launch(exec: CUgraphExec, stream: CUstream) -> Driver<()> {
    // SAFETY: both live in the current context; callers serialize uses of
    // `exec`, and every address its kernels touch is pinned by the graph.
    unsafe { result::graph::launch(exec, stream) }
}

/// Destroys an executable graph.
pub(super) fn graph_exec_destroy(exec: CUgraphExec) -> Driver<()> {
    // SAFETY: called once by its owner, no launch of it running (every
    // launch is synchronized before its stream reports).
    unsafe { result::graph::exec_destroy(exec) }
}

/// Destroys a graph.
pub(super) fn graph_destroy(graph: CUgraph) -> Driver<()> {
    // SAFETY: called once by its owner, after its executable graph.
    unsafe { result::graph::destroy(graph) }
}

/// Waits for everything queued on the legacy default stream only: unlike a
/// context sync, it is allowed while another stream captures (every stream
/// of the backend is non-blocking, so none joins the legacy stream).
pub(super) fn legacy_stream_synchronize() -> Driver<()> {
    stream_synchronize(std::ptr::null_mut())
}

/// The error a missing kernel gets.
pub(super) fn not_found() -> DriverError {
    DriverError(sys::CUresult::CUDA_ERROR_NOT_FOUND)
}
