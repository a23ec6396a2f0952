//! The CPU backend: host memory, one executor thread per stream running
//! the shared stream protocol over its `CpuStream` device part.

mod binding_lists;
mod device;
mod kernels;
mod memory;
mod strided;

pub use strided::MAX_STRIDED_RANK;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cistern_memory::{HostStorage, IdMap, IoError, SliceLocation, StreamId};

use self::binding_lists::{SpareLists, binding_lists};
use self::device::{CpuCounters, CpuStream};
use self::memory::HostSlice;
use super::event::{EventSignal, HostEvent, event_of, record_in};
use super::executors::{Executors, progress_of, unknown_stream};
use super::stream::{BoundLaunch, Job, Resolver, StreamProgress, bind_launches};
use super::{Backend, Completion, DeviceCounters, Launches, Refused, StreamWork, StrideLayout};
use crate::error::ServerError;
use crate::ids::Device;
use crate::ids::EventId;
use crate::sync::Sender;

/// The alignment of every host page: enough for any element type and for
/// cache-line friendly kernels.
pub const CPU_ALIGNMENT: u64 = 256;

/// The host CPU as a device.
#[derive(Debug)]
pub struct CpuBackend {
    ordinal: usize,
    /// Each stream keeps the host-slice lists of its single launches.
    executors: Executors<CpuStream, SpareLists>,
    events: IdMap<EventId, Arc<HostEvent>>,
    counters: Arc<CpuCounters>,
    /// The device's own kernel threads, or `None` for the process's pool.
    pool: Option<Arc<rayon::ThreadPool>>,
}

/// How many CPU ordinals a process may open: each is a share of the host's
/// cores, not hardware of its own.
pub const MAX_CPU_ORDINALS: usize = 64;

impl CpuBackend {
    /// A CPU backend for `ordinal` whose executors report to `completions`,
    /// and the storage its memory manager carves. With `threads`, its
    /// kernels run on a pool of that many threads of its own; a pool the
    /// host cannot start is `DeviceUnavailable`.
    pub fn new(
        ordinal: usize,
        threads: Option<usize>,
        completions: Sender<Completion>,
    ) -> Result<(Self, HostStorage), ServerError> {
        let pool = match threads {
            None => None,
            Some(threads) => Some(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads.max(1))
                    .thread_name(move |index| format!("cistern-cpu{ordinal}-{index}"))
                    .build()
                    .map_err(|error| ServerError::DeviceUnavailable {
                        device: Device::Cpu(ordinal).to_string(),
                        reason: format!("its pool of {threads} threads did not start: {error}"),
                    })?,
            )),
        };
        let backend = CpuBackend {
            ordinal,
            executors: Executors::new(ordinal, "cpu", completions),
            events: IdMap::default(),
            counters: Arc::default(),
            pool,
        };
        Ok((backend, HostStorage::with_alignment(CPU_ALIGNMENT)))
    }
}

/// The server-side lookups of one submit: host slices and events.
struct CpuResolver<'a> {
    storage: &'a HostStorage,
    events: &'a mut IdMap<EventId, Arc<HostEvent>>,
    lists: &'a mut SpareLists,
    progress: &'a IdMap<StreamId, Arc<StreamProgress>>,
}

impl Resolver for CpuResolver<'_> {
    type Device = CpuStream;

    fn slice(&mut self, location: SliceLocation) -> Result<HostSlice, ServerError> {
        HostSlice::resolve(self.storage, location)
    }

    fn binding_list(&mut self, len: usize) -> Vec<HostSlice> {
        self.lists.take(len)
    }

    fn batch(&mut self, launches: &Launches) -> Result<Arc<[BoundLaunch<HostSlice>]>, ServerError> {
        let storage = self.storage;
        launches
            .prepared(|list| bind_launches(list, |location| HostSlice::resolve(storage, location)))
    }

    fn record(&mut self, event: EventId) -> EventSignal {
        record_in(self.events, event)
    }

    fn progress(&mut self, stream: StreamId) -> Result<Arc<StreamProgress>, ServerError> {
        progress_of(self.progress, stream)
    }

    fn wait(&mut self, event: EventId) -> Result<Arc<HostEvent>, ServerError> {
        event_of(self.events, event)
    }
}

impl Backend for CpuBackend {
    type Storage = HostStorage;

    fn device(&self) -> Device {
        Device::Cpu(self.ordinal)
    }

    fn create_stream(&mut self, stream: StreamId) -> Result<(), ServerError> {
        let (lists, spent) = binding_lists();
        let device = CpuStream {
            lists: spent,
            counters: self.counters.clone(),
            pool: self.pool.clone(),
        };
        self.executors.create(stream, device, lists)
    }

    fn destroy_stream(&mut self, stream: StreamId) {
        self.executors.destroy(stream);
    }

    fn submit(
        &mut self,
        storage: &HostStorage,
        stream: StreamId,
        sequence: u64,
        work: StreamWork,
    ) -> Result<(), Box<Refused>> {
        let Some((lists, progress)) = self.executors.resolving(stream) else {
            let error = unknown_stream(stream);
            return Err(Box::new(Refused { error, work }));
        };
        // A caller waits on these, perhaps for work gathered on other
        // streams (an event): send everything at once.
        let urgent = work.is_urgent();
        let mut resolver = CpuResolver {
            storage,
            events: &mut self.events,
            lists,
            progress,
        };
        let task = work.resolve(&mut resolver)?;
        self.executors.push(stream, Job { sequence, task }, urgent);
        Ok(())
    }

    fn stream_idle(&self, stream: StreamId) -> bool {
        self.executors.is_idle(stream)
    }

    fn flush(&mut self) {
        self.executors.flush();
    }

    fn supports_strides(&self, layout: &StrideLayout, _: SliceLocation, _: SliceLocation) -> bool {
        strided::supports(layout)
    }

    fn relocate(
        &mut self,
        storage: &HostStorage,
        from: SliceLocation,
        to: SliceLocation,
    ) -> Result<(), ServerError> {
        let source = HostSlice::resolve(storage, from)?;
        let target = HostSlice::resolve(storage, to)?;
        if source.len() > target.len() {
            return Err(ServerError::Io(IoError::unknown(
                "relocation target smaller than its source",
            )));
        }
        // SAFETY: the manager only moves slices no queued work uses, and a
        // move's source and target are distinct slices.
        unsafe {
            target.bytes_mut()[..source.len()].copy_from_slice(source.bytes());
        }
        Ok(())
    }

    fn release_event(&mut self, event: EventId) {
        self.events.remove(&event);
    }

    fn reset_context(&mut self, generation: u64) -> Result<(), ServerError> {
        // Every executor answered its drain marker and is idle.
        self.executors.health.reset(generation);
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
