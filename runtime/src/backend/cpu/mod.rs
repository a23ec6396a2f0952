//! The CPU backend: host memory, one executor thread per stream running
//! the shared stream protocol over its `CpuStream` device part.

mod binding_lists;
mod device;
mod event;
mod kernels;
mod memory;
mod strided;

pub use strided::MAX_STRIDED_RANK;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cistern_memory::{HostStorage, IdMap, IoError, SliceLocation, StreamId};

use self::binding_lists::{SpareLists, binding_lists};
use self::device::{CpuCounters, CpuStream};
use self::event::{CpuEvent, EventSignal};
use self::memory::HostSlice;
use super::stream::{
    BoundLaunch, DeviceHealth, Job, Resolver, StreamProgress, StreamRunner, bind_launches,
    refuse_all,
};
use super::{Backend, Completion, DeviceCounters, Launches, Refused, StreamWork, StrideLayout};
use crate::command::EventId;
use crate::sync::{Sender, unbounded};
use crate::{Device, ServerError};

/// The alignment of every host page: enough for any element type and for
/// cache-line friendly kernels.
pub const CPU_ALIGNMENT: u64 = 256;

/// A stream's queue: jobs gathered since the last flush, and the channel to
/// its executor thread.
#[derive(Debug)]
struct StreamQueue {
    jobs: Sender<Vec<Job<CpuStream>>>,
    pending: Vec<Job<CpuStream>>,
    /// Host-slice lists for single launches, recycled by the executor.
    lists: SpareLists,
    /// The sequence of the last job accepted for this stream.
    last_sequence: u64,
    progress: Arc<StreamProgress>,
}

/// A stream's gathered jobs are sent at the latest when this many wait, so
/// a busy server cannot hold work back for long.
const FLUSH_AT: usize = 64;

/// The host CPU as a device.
#[derive(Debug)]
pub struct CpuBackend {
    ordinal: usize,
    executors: IdMap<StreamId, StreamQueue>,
    events: IdMap<EventId, Arc<CpuEvent>>,
    /// Every stream's published progress, kept after a stream is destroyed
    /// (its queued work still runs, and others may wait on it).
    progress: IdMap<StreamId, Arc<StreamProgress>>,
    health: Arc<DeviceHealth>,
    counters: Arc<CpuCounters>,
    completions: Sender<Completion>,
}

impl CpuBackend {
    /// A CPU backend for `ordinal` whose executors report to `completions`,
    /// and the storage its memory manager carves.
    pub fn new(ordinal: usize, completions: Sender<Completion>) -> (Self, HostStorage) {
        let backend = CpuBackend {
            ordinal,
            executors: IdMap::default(),
            events: IdMap::default(),
            progress: IdMap::default(),
            health: Arc::new(DeviceHealth::new(ordinal)),
            counters: Arc::default(),
            completions,
        };
        (backend, HostStorage::with_alignment(CPU_ALIGNMENT))
    }
}

impl CpuBackend {
    fn send(&self, stream: StreamId, queue: &mut StreamQueue) {
        send_pending(self.ordinal, stream, queue);
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        // Gathered work still runs (and answers) after the server ends.
        self.flush();
    }
}

/// Sends a stream's gathered jobs to its executor in one message.
fn send_pending(ordinal: usize, stream: StreamId, queue: &mut StreamQueue) {
    let jobs = std::mem::take(&mut queue.pending);
    if let Err(unsent) = queue.jobs.send(jobs) {
        // The executor thread died (a bug outside any kernel): answer its
        // jobs here so no caller waits on them.
        let error = ServerError::ServerPanicked {
            ordinal,
            message: format!("the executor of stream {} ended", stream.0),
        };
        refuse_all(unsent.into_inner(), &error);
    }
}

/// The server-side lookups of one submit: host slices and events.
struct CpuResolver<'a> {
    storage: &'a HostStorage,
    events: &'a mut IdMap<EventId, Arc<CpuEvent>>,
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
        let cell = Arc::new(CpuEvent::default());
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

    fn wait(&mut self, event: EventId) -> Result<Arc<CpuEvent>, ServerError> {
        self.events
            .get(&event)
            .cloned()
            .ok_or_else(|| ServerError::InvalidArgument {
                message: format!("unknown event {}", event.0),
            })
    }
}

impl Backend for CpuBackend {
    type Storage = HostStorage;

    fn device(&self) -> Device {
        Device::Cpu(self.ordinal)
    }

    fn create_stream(&mut self, stream: StreamId) -> Result<(), ServerError> {
        let (jobs, queue) = unbounded();
        let (lists, spent) = binding_lists();
        let progress = Arc::new(StreamProgress::default());
        let device = CpuStream {
            lists: spent,
            counters: self.counters.clone(),
        };
        let runner = StreamRunner::new(
            stream,
            device,
            self.health.clone(),
            self.completions.clone(),
            progress.clone(),
        );
        std::thread::Builder::new()
            .name(format!("cistern-cpu{}-stream{}", self.ordinal, stream.0))
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
                lists,
                last_sequence: 0,
                progress,
            },
        );
        Ok(())
    }

    fn destroy_stream(&mut self, stream: StreamId) {
        // Dropping the sender closes the queue: the executor runs what is
        // queued, reports, and exits.
        if let Some(mut queue) = self.executors.remove(&stream) {
            self.send(stream, &mut queue);
        }
    }

    fn submit(
        &mut self,
        storage: &HostStorage,
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
        // A caller waits on these, perhaps for work gathered on other
        // streams (an event): send everything at once.
        let urgent = work.is_urgent();
        let mut resolver = CpuResolver {
            storage,
            events: &mut self.events,
            lists: &mut queue.lists,
            progress: &self.progress,
        };
        let task = work.resolve(&mut resolver)?;
        if queue.pending.len() == queue.pending.capacity() && !queue.pending.is_empty() {
            // Grow once to a whole batch, not by doubling through it.
            queue
                .pending
                .reserve_exact(FLUSH_AT.saturating_sub(queue.pending.len()).max(1));
        }
        queue.pending.push(Job { sequence, task });
        queue.last_sequence = sequence;
        if urgent {
            self.flush();
        } else if queue.pending.len() >= FLUSH_AT {
            send_pending(self.ordinal, stream, queue);
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
        let ordinal = self.ordinal;
        for (stream, queue) in self.executors.iter_mut() {
            if !queue.pending.is_empty() {
                send_pending(ordinal, *stream, queue);
            }
        }
    }

    fn supports_strides(&self, layout: &StrideLayout) -> bool {
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
        self.health.reset(generation);
        Ok(())
    }

    fn counters(&self) -> DeviceCounters {
        DeviceCounters {
            kernels_run: self.counters.kernels_run.load(Ordering::Relaxed),
            empty_kernel_runs: self.counters.empty_kernel_runs.load(Ordering::Relaxed),
        }
    }
}
