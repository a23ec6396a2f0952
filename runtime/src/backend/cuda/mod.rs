//! The CUDA backend (`Device::Cuda`): cudarc's driver and NVRTC layers,
//! loaded at run time, so it builds where CUDA is absent and answers
//! `DeviceUnavailable` there. One executor thread per stream runs the shared
//! stream protocol over its [`CudaStream`](device) device part; memory is
//! [`CudaStorage`], on virtual memory management where the device has it.
//!
//! - `driver.rs`: is CUDA here (probed before any other call); the devices;
//! - `status.rs`: driver results as operation-local or sticky;
//! - `ffi.rs`, `vmm.rs`: every raw driver call, each with its SAFETY reason;
//! - `context.rs`, `ptx.rs`: the primary context, its kernels, their PTX;
//! - `storage.rs`, `launch.rs`, `device.rs`, `event.rs`: memory, kernels,
//!   stream work, events;
//! - `graph.rs`: a recorded graph's batch captured into a CUDA graph;
//! - `optimizer.rs`: each optimizer step's kernel, constants and slots;
//! - `lamb.rs`, `scratch.rs`: LAMB's passes and the host's decisions
//!   between them, in device memory the stream owns;
//! - `strided.rs`: a strided copy as its kernel's arguments.

mod context;
mod device;
mod driver;
mod event;
mod ffi;
mod graph;
mod lamb;
mod launch;
mod optimizer;
mod ptx;
mod scratch;
#[cfg(test)]
mod signature;
mod status;
mod storage;
mod strided;
mod vmm;

pub use driver::{CudaDeviceInfo, CudaUnavailable, devices};
pub use status::{FaultClass, classify};
pub use storage::{CUDA_ALIGNMENT, CudaStorage};

/// The name of every CUDA kernel the backend loads.
pub fn kernel_names() -> Vec<&'static str> {
    context::functions().collect()
}

/// The kernels compiled by NVRTC, now, for compute capability
/// `major.minor`, as PTX text: needs an NVRTC library, not a GPU.
pub fn compile_kernels(major: i32, minor: i32) -> Result<String, CudaUnavailable> {
    ptx::compile(major, minor).map(|ptx| ptx.to_string_lossy().into_owned())
}

/// The virtual architectures (`compute_XY` as `XY`) the NVRTC library found
/// compiles for, and its version; `None` where there is no NVRTC.
pub fn nvrtc_supported_archs() -> Option<((i32, i32), Vec<i32>)> {
    ptx::supported_archs()
}

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cistern_memory::{IdMap, IoError, SliceLocation, StreamId};

use self::context::CudaContext;
use self::device::{CudaCounters, CudaStream};
use self::event::{CudaEvent, EventSignal};
use self::graph::CudaBatch;
use self::launch::CudaSlice;
use self::scratch::Scratch;
use super::stream::{
    DeviceHealth, Job, Resolver, StreamProgress, StreamRunner, bind_launches, gpu_supports_strides,
    refuse_all,
};
use super::{Backend, Completion, DeviceCounters, Launches, Refused, StreamWork, StrideLayout};
use crate::error::ServerError;
use crate::ids::Device;
use crate::ids::EventId;
use crate::sync::{Sender, unbounded};

/// A stream's channel to its executor thread.
#[derive(Debug)]
struct StreamQueue {
    jobs: Sender<Vec<Job<CudaStream>>>,
    pending: Vec<Job<CudaStream>>,
    last_sequence: u64,
    progress: Arc<StreamProgress>,
}

/// A stream's gathered jobs are sent at the latest when this many wait.
const FLUSH_AT: usize = 64;

/// One CUDA device as a backend.
#[derive(Debug)]
pub struct CudaBackend {
    context: Arc<CudaContext>,
    executors: IdMap<StreamId, StreamQueue>,
    events: IdMap<EventId, Arc<CudaEvent>>,
    progress: IdMap<StreamId, Arc<StreamProgress>>,
    health: Arc<DeviceHealth>,
    counters: Arc<CudaCounters>,
    completions: Sender<Completion>,
}

impl CudaBackend {
    /// The backend of device `ordinal` reporting to `completions`, its
    /// storage, and the device's free memory (the default limit); or why
    /// CUDA cannot be used here.
    pub fn new(
        ordinal: usize,
        completions: Sender<Completion>,
    ) -> Result<(Self, CudaStorage, u64), CudaUnavailable> {
        let context = CudaContext::open(ordinal)?;
        let (free, total) = ffi::memory_info().map_err(|e| CudaUnavailable {
            ordinal_absent: false,
            reason: format!("cuMemGetInfo: {}", status::describe(&e)),
        })?;
        let storage = CudaStorage::new(context.clone(), total as u64);
        let backend = CudaBackend {
            context,
            executors: IdMap::default(),
            events: IdMap::default(),
            progress: IdMap::default(),
            health: Arc::new(DeviceHealth::new(ordinal)),
            counters: Arc::default(),
            completions,
        };
        Ok((backend, storage, free as u64))
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        self.flush();
    }
}

fn send_pending(ordinal: usize, stream: StreamId, queue: &mut StreamQueue) {
    let jobs = std::mem::take(&mut queue.pending);
    if let Err(unsent) = queue.jobs.send(jobs) {
        let error = ServerError::ServerPanicked {
            ordinal,
            message: format!("the executor of stream {} ended", stream.0),
        };
        refuse_all(unsent.into_inner(), &error);
    }
}

fn resolve(storage: &CudaStorage, location: SliceLocation) -> Result<CudaSlice, ServerError> {
    storage
        .address(location.storage, location.offset, location.size)
        .map(|address| CudaSlice {
            address,
            len: location.size,
        })
        .ok_or_else(|| {
            ServerError::Io(IoError::unknown(format!(
                "slice {}+{} outside its CUDA buffer",
                location.offset, location.size
            )))
        })
}

struct CudaResolver<'a> {
    storage: &'a CudaStorage,
    context: &'a Arc<CudaContext>,
    events: &'a mut IdMap<EventId, Arc<CudaEvent>>,
    progress: &'a IdMap<StreamId, Arc<StreamProgress>>,
}

impl Resolver for CudaResolver<'_> {
    type Device = CudaStream;

    fn slice(&mut self, location: SliceLocation) -> Result<CudaSlice, ServerError> {
        resolve(self.storage, location)
    }

    fn batch(&mut self, launches: &Launches) -> Result<CudaBatch, ServerError> {
        let storage = self.storage;
        CudaBatch::of(launches, self.context, |list| {
            bind_launches(list, |location| resolve(storage, location))
        })
    }

    fn record(&mut self, event: EventId) -> EventSignal {
        let cell = Arc::new(CudaEvent::default());
        self.events.insert(event, cell.clone());
        EventSignal(cell)
    }

    fn progress(&mut self, stream: StreamId) -> Result<Arc<StreamProgress>, ServerError> {
        self.progress
            .get(&stream)
            .cloned()
            .ok_or_else(|| ServerError::InvalidArgument {
                message: format!("unknown stream {}", stream.0),
            })
    }

    fn wait(&mut self, event: EventId) -> Result<Arc<CudaEvent>, ServerError> {
        self.events
            .get(&event)
            .cloned()
            .ok_or_else(|| ServerError::InvalidArgument {
                message: format!("unknown event {}", event.0),
            })
    }
}

impl Backend for CudaBackend {
    type Storage = CudaStorage;

    fn device(&self) -> Device {
        Device::Cuda(self.context.ordinal)
    }

    fn create_stream(&mut self, stream: StreamId) -> Result<(), ServerError> {
        let (jobs, queue) = unbounded();
        let progress = Arc::new(StreamProgress::default());
        let device = CudaStream {
            context: self.context.clone(),
            counters: self.counters.clone(),
            stream: None,
            scratch: Scratch::default(),
        };
        let runner = StreamRunner::new(
            stream,
            device,
            self.health.clone(),
            self.completions.clone(),
            progress.clone(),
        );
        std::thread::Builder::new()
            .name(format!(
                "cistern-cuda{}-stream{}",
                self.context.ordinal, stream.0
            ))
            .spawn(move || runner.run(queue))
            .map_err(|e| {
                ServerError::Io(IoError::unknown(format!(
                    "could not start an executor thread: {e}"
                )))
            })?;
        self.progress.insert(stream, progress.clone());
        self.executors.insert(
            stream,
            StreamQueue {
                jobs,
                pending: Vec::new(),
                last_sequence: 0,
                progress,
            },
        );
        Ok(())
    }

    fn destroy_stream(&mut self, stream: StreamId) {
        if let Some(mut queue) = self.executors.remove(&stream) {
            send_pending(self.context.ordinal, stream, &mut queue);
        }
    }

    fn submit(
        &mut self,
        storage: &CudaStorage,
        stream: StreamId,
        sequence: u64,
        work: StreamWork,
    ) -> Result<(), Box<Refused>> {
        let Some(queue) = self.executors.get_mut(&stream) else {
            let error = ServerError::InvalidArgument {
                message: format!("unknown stream {}", stream.0),
            };
            return Err(Box::new(Refused { error, work }));
        };
        let urgent = work.is_urgent();
        let mut resolver = CudaResolver {
            storage,
            context: &self.context,
            events: &mut self.events,
            progress: &self.progress,
        };
        let task = work.resolve(&mut resolver)?;
        queue.pending.push(Job { sequence, task });
        queue.last_sequence = sequence;
        if urgent {
            self.flush();
        } else if queue.pending.len() >= FLUSH_AT {
            send_pending(self.context.ordinal, stream, queue);
        }
        Ok(())
    }

    fn stream_idle(&self, stream: StreamId) -> bool {
        self.executors.get(&stream).is_some_and(|queue| {
            queue.pending.is_empty()
                && queue.progress.is_clean_at(queue.last_sequence)
                && !self.health.is_faulted()
        })
    }

    fn flush(&mut self) {
        let ordinal = self.context.ordinal;
        for (stream, queue) in self.executors.iter_mut() {
            if !queue.pending.is_empty() {
                send_pending(ordinal, *stream, queue);
            }
        }
    }

    fn supports_strides(&self, layout: &StrideLayout, _: SliceLocation, _: SliceLocation) -> bool {
        // Views off a word boundary are copied byte by byte.
        gpu_supports_strides(layout)
    }

    fn relocate(
        &mut self,
        storage: &CudaStorage,
        from: SliceLocation,
        to: SliceLocation,
    ) -> Result<(), ServerError> {
        let source = resolve(storage, from)?;
        let target = resolve(storage, to)?;
        if source.len > target.len {
            return Err(ServerError::Io(IoError::unknown(
                "relocation target smaller than its source",
            )));
        }
        let failed = |e: cudarc::driver::DriverError| ServerError::TransferFailed {
            message: format!("relocation: {}", status::describe(&e)),
        };
        let len = usize::try_from(source.len).map_err(|_| ServerError::InvalidArgument {
            message: "relocation too long".to_string(),
        })?;
        self.context.bind().map_err(failed)?;
        // The legacy stream: the server moves only slices no queued work
        // uses. Only that stream is waited for: a context sync is refused
        // while another stream captures a graph.
        ffi::copy(source.address, target.address, len, std::ptr::null_mut())
            .and_then(|()| ffi::legacy_stream_synchronize())
            .map_err(failed)
    }

    fn release_event(&mut self, event: EventId) {
        self.events.remove(&event);
    }

    fn reset_context(&mut self, generation: u64) -> Result<(), ServerError> {
        // Every executor answered its drain marker and is idle; events of
        // the old context die with it.
        self.events.clear();
        self.context
            .reset()
            .map_err(|e| ServerError::ContextUnrecoverable {
                ordinal: self.context.ordinal,
                probe_error: format!(
                    "the CUDA driver gave no working context after the reset ({}): \
                     it keeps a sticky fault for the life of the process, so \
                     restart the process to use cuda:{} again",
                    status::describe(&e),
                    self.context.ordinal
                ),
            })?;
        self.health.reset(generation);
        Ok(())
    }

    fn counters(&self) -> DeviceCounters {
        DeviceCounters {
            kernels_run: self.counters.kernels_run.load(Ordering::Relaxed),
            empty_kernel_runs: self.counters.empty_kernel_runs.load(Ordering::Relaxed),
            kernel_device_ns: None,
        }
    }
}
