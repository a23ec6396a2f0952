//! `Backend`: what a device must provide to its server, in one trait.
//!
//! The server owns the memory manager (over the backend's [`Storage`]) and
//! decides *what* runs *where*; a backend only runs it. It owns one queue per
//! stream and runs each stream's [`StreamWork`] by the rules of [`stream`]
//! (in order, errors latched, faults sticky and reported first, replies and
//! failure tokens answered on the executor, progress as [`Completion`]s on
//! the channel it was built with). A backend writes only its device part:
//! [`stream::StreamDevice`] and [`stream::Resolver`].

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod event;
mod executors;
mod launches;
pub mod stream;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use launches::Launches;
pub use stream::{Refused, StreamWork};

use cistern_memory::{DevicePoison, SliceLocation, Storage, StreamId};

use crate::error::ServerError;
use crate::ids::Device;
use crate::ids::EventId;
use crate::kernel::Kernel;

/// A device's side of a server.
pub trait Backend: Send + 'static {
    /// The memory the manager carves into slices.
    type Storage: Storage + Send + 'static;

    /// The device this backend drives.
    fn device(&self) -> Device;

    /// Starts an empty stream, independent of the others.
    fn create_stream(&mut self, stream: StreamId) -> Result<(), ServerError>;

    /// Ends a stream once its queued work has run; queued work still runs.
    fn destroy_stream(&mut self, stream: StreamId);

    /// Queues `work` as number `sequence` of `stream` (sequences rise by one
    /// per stream) and returns without waiting for it. A backend may gather
    /// work until [`flush`](Backend::flush), but sends work with a reply
    /// (read, sync) at once. Locations were
    /// resolved and checked by the server. On refusal the work is handed
    /// back unrun, for the server to answer.
    fn submit(
        &mut self,
        storage: &Self::Storage,
        stream: StreamId,
        sequence: u64,
        work: StreamWork,
    ) -> Result<(), Box<Refused>>;

    /// Sends work gathered by `submit` to the device. The server calls it
    /// before it waits for commands; a backend that queues at once need
    /// not gather (the default does nothing).
    fn flush(&mut self) {}

    /// True when everything submitted to `stream` has run and been reported,
    /// nothing is latched on it and the device has no fault: the server may
    /// then answer a sync itself, without a marker. Reading this must never
    /// wait. The default (`false`) always sends the marker.
    fn stream_idle(&self, _stream: StreamId) -> bool {
        false
    }

    /// Whether this backend can run a strided copy of this layout between
    /// these slices (their byte offsets may rule a layout out).
    fn supports_strides(
        &self,
        layout: &StrideLayout,
        source: SliceLocation,
        target: SliceLocation,
    ) -> bool;

    /// Copies the bytes of `from` to `to` now, for a compaction; the server
    /// only moves slices that no queued work uses.
    fn relocate(
        &mut self,
        storage: &Self::Storage,
        from: SliceLocation,
        to: SliceLocation,
    ) -> Result<(), ServerError>;

    /// Forgets an event once no one can wait for it any more.
    fn release_event(&mut self, event: EventId);

    /// What the device has run.
    fn counters(&self) -> DeviceCounters;

    /// Recovery, once every stream has answered its drain marker: waits for
    /// the device to finish everything, clears its sticky fault state, and
    /// runs later work (and labels later faults) in `generation`. An error
    /// makes the context unrecoverable. A backend must report a fault's
    /// completion before it answers any later sync on that stream. The
    /// default suits a backend with no sticky state of its own.
    fn reset_context(&mut self, generation: u64) -> Result<(), ServerError> {
        let _ = generation;
        Ok(())
    }
}

/// A kernel call the server checked against its kernel's contract, its
/// bindings resolved to memory locations.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedLaunch {
    /// The kernel, with its arguments.
    pub kernel: Kernel,
    /// Each binding's bytes, in signature order; in bounds, aligned to the
    /// kernel's elements, and no written one overlaps another.
    pub bindings: Vec<SliceLocation>,
}

/// The shape of a strided copy, as [`StridedCopy`](crate::command::StridedCopy)
/// gave it, without its buffers: the server resolved each view to the slice
/// it spans, so element zero is at its slice's first byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrideLayout {
    /// Elements per dimension.
    pub shape: Vec<u64>,
    /// Source stride per dimension, in elements.
    pub source_strides: Vec<u64>,
    /// Target stride per dimension, in elements.
    pub target_strides: Vec<u64>,
    /// Bytes per element.
    pub element_size: u64,
}

/// Progress of one stream: all its work up to `sequence` has run. The
/// server then reuses freed memory the stream used up to there and, on a
/// fault, poisons the context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The stream that ran the work.
    pub stream: StreamId,
    /// Highest sequence run; everything before it on the stream ran too.
    pub sequence: u64,
    /// The sticky fault met while running it, if any; sent before the
    /// device is marked faulted.
    pub fault: Option<DevicePoison>,
}

/// What a device has run since it started, as `ServerStats` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Kernels that ran to completion, `Empty` runs included.
    pub kernels_run: u64,
    /// Runs of the `Empty` kernel (benchmarks check their launches ran).
    pub empty_kernel_runs: u64,
    /// Device time of the kernels run, in nanoseconds, where the device
    /// has timestamp queries; else `None`.
    pub kernel_device_ns: Option<u64>,
}
