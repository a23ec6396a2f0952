//! The CPU backend: host memory, one executor thread per stream.

mod binding_lists;
mod event;
mod executor;
mod kernels;
mod memory;
mod strided;

pub use strided::MAX_STRIDED_RANK;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cistern_memory::{HostStorage, IoError, SliceLocation, StreamId};

use self::binding_lists::{SpareLists, binding_lists};
use self::event::{CpuEvent, EventSignal};
use self::executor::{DeviceState, Job, StreamExecutor, StreamProgress, Task};
use self::kernels::CpuLaunch;
use self::memory::HostSlice;
use super::{
    Backend, Completion, DeviceCounters, Refused, ResolvedLaunch, StreamWork, StrideLayout,
};
use crate::command::EventId;
use crate::sync::{Sender, unbounded};
use crate::{Device, ServerError};
use cistern_memory::IdMap;

/// The alignment of every host page: enough for any element type and for
/// cache-line friendly kernels.
pub const CPU_ALIGNMENT: u64 = 256;

/// A stream's queue: jobs gathered since the last flush, and the channel to
/// its executor thread.
#[derive(Debug)]
struct StreamQueue {
    jobs: Sender<Vec<Job>>,
    pending: Vec<Job>,
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
    device: Arc<DeviceState>,
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
            device: Arc::new(DeviceState::new(ordinal)),
            completions,
        };
        (backend, HostStorage::with_alignment(CPU_ALIGNMENT))
    }

    /// Resolves `work`'s locations to host memory (and its events to
    /// `events`); hands it back on failure.
    fn resolve_task(
        events: &mut IdMap<EventId, Arc<CpuEvent>>,
        lists: &mut SpareLists,
        storage: &HostStorage,
        work: StreamWork,
    ) -> Result<Task, Box<Refused>> {
        let slice = |location: SliceLocation| HostSlice::resolve(storage, location);
        let pair =
            |a: SliceLocation, b: SliceLocation| Ok::<_, ServerError>((slice(a)?, slice(b)?));
        let refused = |error: ServerError, work: StreamWork| Err(Box::new(Refused { error, work }));
        Ok(match work {
            StreamWork::Write { target, data } => match slice(target) {
                Ok(slice) => Task::Write {
                    target: slice,
                    data,
                },
                Err(error) => return refused(error, StreamWork::Write { target, data }),
            },
            StreamWork::Read { source, reply } => match slice(source) {
                Ok(slice) => Task::Read {
                    source: slice,
                    reply,
                },
                Err(error) => return refused(error, StreamWork::Read { source, reply }),
            },
            StreamWork::Copy { source, target } => match pair(source, target) {
                Ok((source, target)) => Task::Copy { source, target },
                Err(error) => return refused(error, StreamWork::Copy { source, target }),
            },
            StreamWork::StridedCopy {
                source,
                target,
                layout,
            } => match pair(source, target) {
                Ok((from, to)) => Task::Strided {
                    source: from,
                    target: to,
                    layout,
                },
                Err(error) => {
                    let work = StreamWork::StridedCopy {
                        source,
                        target,
                        layout,
                    };
                    return refused(error, work);
                }
            },
            StreamWork::Launch { launch, token } => {
                match host_slices_into(lists.take(launch.bindings.len()), storage, &launch.bindings)
                {
                    // The arguments move: no clone on the per-launch path.
                    Ok(bindings) => Task::Launch {
                        launch: CpuLaunch {
                            kernel: launch.kernel,
                            bindings,
                        },
                        token,
                    },
                    Err(error) => return refused(error, StreamWork::Launch { launch, token }),
                }
            }
            StreamWork::Batch { launches, token } => {
                // A graph's list keeps its host form across replays.
                match launches.prepared(|list| cpu_launches(storage, list)) {
                    Ok(resolved) => Task::Batch {
                        launches: resolved,
                        token,
                    },
                    Err(error) => return refused(error, StreamWork::Batch { launches, token }),
                }
            }
            StreamWork::RecordEvent { event } => {
                let cell = Arc::new(CpuEvent::default());
                events.insert(event, cell.clone());
                Task::Record(EventSignal(cell))
            }
            StreamWork::WaitEvent { event } => match events.get(&event) {
                Some(cell) => Task::Wait(cell.clone()),
                None => {
                    let error = ServerError::InvalidArgument {
                        message: format!("unknown event {}", event.0),
                    };
                    return refused(error, StreamWork::WaitEvent { event });
                }
            },
            StreamWork::Sync { reply } => Task::Sync { reply },
            StreamWork::Fail { error } => Task::Fail {
                error: Box::new(error),
            },
        })
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
        for job in unsent.into_inner() {
            job.task.refuse(error.clone());
        }
    }
}

fn cpu_launches(
    storage: &HostStorage,
    launches: &[ResolvedLaunch],
) -> Result<Arc<[CpuLaunch]>, ServerError> {
    launches
        .iter()
        .map(|launch| cpu_launch(storage, launch))
        .collect()
}

fn cpu_launch(storage: &HostStorage, launch: &ResolvedLaunch) -> Result<CpuLaunch, ServerError> {
    Ok(CpuLaunch {
        kernel: launch.kernel.clone(),
        bindings: host_slices(storage, &launch.bindings)?,
    })
}

fn host_slices(
    storage: &HostStorage,
    locations: &[SliceLocation],
) -> Result<Vec<HostSlice>, ServerError> {
    host_slices_into(Vec::with_capacity(locations.len()), storage, locations)
}

/// Resolves `locations` onto the end of `slices`.
fn host_slices_into(
    mut slices: Vec<HostSlice>,
    storage: &HostStorage,
    locations: &[SliceLocation],
) -> Result<Vec<HostSlice>, ServerError> {
    for location in locations {
        slices.push(HostSlice::resolve(storage, *location)?);
    }
    Ok(slices)
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
        let executor = StreamExecutor::new(
            stream,
            queue,
            spent,
            self.device.clone(),
            self.completions.clone(),
            progress.clone(),
        );
        std::thread::Builder::new()
            .name(format!("cistern-cpu{}-stream{}", self.ordinal, stream.0))
            .spawn(move || executor.run())
            .map_err(|e| {
                ServerError::Io(IoError::unknown(format!(
                    "could not start an executor thread: {e}"
                )))
            })?;
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
        let task = Self::resolve_task(&mut self.events, &mut queue.lists, storage, work)?;
        // A caller waits on these, perhaps for work gathered on other
        // streams (an event): send everything at once.
        let urgent = matches!(task, Task::Sync { .. } | Task::Read { .. });
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
                && !self.device.is_faulted()
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
        self.device.reset(generation);
        Ok(())
    }

    fn counters(&self) -> DeviceCounters {
        DeviceCounters {
            kernels_run: self.device.kernels_run.load(Ordering::Relaxed),
            empty_kernel_runs: self.device.empty_kernel_runs.load(Ordering::Relaxed),
        }
    }
}
