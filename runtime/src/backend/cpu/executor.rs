//! A stream's executor: a thread that runs the stream's jobs in order.
//!
//! It answers replies directly, settles failure tokens, latches the
//! stream's first error until a sync reads it, and reports completions to
//! the server on a channel. It never calls into the server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cistern_memory::{BackTrace, DevicePoison, StreamId};

use super::binding_lists::SpentLists;
use super::event::{CpuEvent, EventSignal};
use super::kernels::{self, CpuLaunch, KernelFault, LaunchError, caught};
use super::memory::HostSlice;
use super::strided::strided_copy;
use crate::ServerError;
use crate::backend::{Completion, StrideLayout};
use crate::failure::PendingToken;
use crate::sync::{Mutex, PATIENCE, Receiver, Reply, Sender, TryRecvError, recv_patiently};

/// Completions are reported at least this often while a stream stays busy.
const REPORT_EVERY: u64 = 64;

/// State every executor of one device shares.
#[derive(Debug)]
pub(super) struct DeviceState {
    pub(super) ordinal: usize,
    pub(super) generation: AtomicU64,
    faulted: AtomicBool,
    fault: Mutex<Option<DevicePoison>>,
    pub(super) kernels_run: AtomicU64,
    pub(super) empty_kernel_runs: AtomicU64,
}

impl DeviceState {
    pub(super) fn new(ordinal: usize) -> Self {
        DeviceState {
            ordinal,
            generation: AtomicU64::new(0),
            faulted: AtomicBool::new(false),
            fault: Mutex::new(None),
            kernels_run: AtomicU64::new(0),
            empty_kernel_runs: AtomicU64::new(0),
        }
    }

    /// Whether a sticky fault is marked.
    pub(super) fn is_faulted(&self) -> bool {
        self.faulted.load(Ordering::Acquire)
    }

    fn poison(&self) -> Option<DevicePoison> {
        if self.faulted.load(Ordering::Acquire) {
            self.fault.lock().clone()
        } else {
            None
        }
    }

    /// Clears the sticky fault for a recovered context in `generation`.
    pub(super) fn reset(&self, generation: u64) {
        let mut fault = self.fault.lock();
        *fault = None;
        self.generation.store(generation, Ordering::Relaxed);
        self.faulted.store(false, Ordering::Release);
    }

    fn mark_faulted(&self, poison: DevicePoison) {
        let mut fault = self.fault.lock();
        if fault.is_none() {
            *fault = Some(poison);
        }
        self.faulted.store(true, Ordering::Release);
    }
}

/// One item of a stream's queue.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) sequence: u64,
    pub(super) task: Task,
}

/// What a job does, with its memory resolved.
#[derive(Debug)]
pub(super) enum Task {
    Write {
        target: HostSlice,
        data: Vec<u8>,
    },
    Read {
        source: HostSlice,
        reply: Reply<Vec<u8>>,
    },
    Copy {
        source: HostSlice,
        target: HostSlice,
    },
    Strided {
        source: HostSlice,
        target: HostSlice,
        layout: Box<StrideLayout>,
    },
    Launch {
        launch: CpuLaunch,
        token: Option<PendingToken>,
    },
    Batch {
        /// Shared by every replay of one graph.
        launches: Arc<[CpuLaunch]>,
        token: Option<PendingToken>,
    },
    Record(EventSignal),
    Wait(Arc<CpuEvent>),
    Sync {
        reply: Reply<()>,
    },
    Fail {
        /// Boxed: rare, and as wide as every other job would become.
        error: Box<ServerError>,
    },
}

impl Task {
    /// Answers the task's reply or token with `error` without running it.
    pub(super) fn refuse(self, error: ServerError) {
        match self {
            Task::Read { reply, .. } => drop(reply.send(Err(error))),
            Task::Sync { reply } => drop(reply.send(Err(error))),
            Task::Launch { token, .. } | Task::Batch { token, .. } => {
                if let Some(token) = token {
                    token.fail(error);
                }
            }
            _ => {}
        }
    }
}

/// What a stream has reported, readable by the server without waiting: the
/// last reported sequence shifted left by one, with the low bit set while an
/// error is latched. Published after the completion it describes is sent.
#[derive(Debug, Default)]
pub(super) struct StreamProgress(AtomicU64);

impl StreamProgress {
    /// Whether everything up to `sequence` ran, was reported, and left no
    /// latched error.
    pub(super) fn is_clean_at(&self, sequence: u64) -> bool {
        self.0.load(Ordering::Acquire) == sequence << 1
    }

    fn publish(&self, reported: u64, latched: bool) {
        self.0
            .store((reported << 1) | u64::from(latched), Ordering::Release);
    }
}

/// The executor of one stream; runs on its own thread until its queue closes.
pub(super) struct StreamExecutor {
    pub(super) stream: StreamId,
    pub(super) jobs: Receiver<Vec<Job>>,
    /// Single launches' emptied host-slice lists, going back to the server.
    lists: SpentLists,
    pub(super) device: Arc<DeviceState>,
    pub(super) completions: Sender<Completion>,
    pub(super) progress: Arc<StreamProgress>,
    latched: Option<ServerError>,
    done: u64,
    reported: u64,
}

impl StreamExecutor {
    pub(super) fn new(
        stream: StreamId,
        jobs: Receiver<Vec<Job>>,
        lists: SpentLists,
        device: Arc<DeviceState>,
        completions: Sender<Completion>,
        progress: Arc<StreamProgress>,
    ) -> Self {
        StreamExecutor {
            stream,
            jobs,
            lists,
            device,
            completions,
            progress,
            latched: None,
            done: 0,
            reported: 0,
        }
    }

    /// Runs jobs until the queue is closed and empty.
    pub(super) fn run(mut self) {
        loop {
            let jobs = match self.jobs.try_recv() {
                Ok(jobs) => jobs,
                Err(TryRecvError::Empty) => {
                    // Idle: tell the server what finished before sleeping.
                    self.report(None);
                    match recv_patiently(&self.jobs, PATIENCE) {
                        Ok(jobs) => jobs,
                        Err(_) => break,
                    }
                }
                Err(TryRecvError::Disconnected) => break,
            };
            for job in jobs {
                self.execute(job);
            }
            self.lists.send();
        }
        self.report(None);
    }

    fn execute(&mut self, job: Job) {
        let sequence = job.sequence;
        match job.task {
            Task::Sync { reply } => {
                self.done = sequence;
                // Completions first, so reuse they allow is visible to whoever syncs.
                self.report(None);
                let answer = match self.latched.take() {
                    Some(error) => Err(error),
                    None => self.refusal().map_or(Ok(()), Err),
                };
                let _ = reply.send(answer);
            }
            Task::Read { source, reply } => {
                let answer = match self.refusal() {
                    Some(error) => Err(error),
                    // SAFETY: a read range is only read here; writers are stream-ordered before it.
                    None => caught(|| Ok(unsafe { source.bytes() }.to_vec()))
                        .map_err(|fault| self.fault(sequence, "read", &fault)),
                };
                let _ = reply.send(answer);
            }
            Task::Write { target, data } => self.device_work(sequence, "write", || {
                // SAFETY: the server checked the range; the stream orders its users.
                let bytes = unsafe { target.bytes_mut() };
                if bytes.len() != data.len() {
                    return Err(KernelFault::Malformed("write size differs".into()));
                }
                bytes.copy_from_slice(&data);
                Ok(())
            }),
            Task::Copy { source, target } => self.device_work(sequence, "copy", || {
                // SAFETY: the server checked the ranges do not overlap.
                let (from, to) = unsafe { (source.bytes(), target.bytes_mut()) };
                if from.len() != to.len() {
                    return Err(KernelFault::Malformed("copy sizes differ".into()));
                }
                to.copy_from_slice(from);
                Ok(())
            }),
            Task::Strided {
                source,
                target,
                layout,
            } => self.device_work(sequence, "strided copy", || {
                // SAFETY: the server checked the views do not overlap.
                let (from, to) = unsafe { (source.bytes(), target.bytes_mut()) };
                strided_copy(from, to, &layout)
            }),
            Task::Launch { launch, token } => {
                self.launches(sequence, std::slice::from_ref(&launch), token);
                self.lists.give(launch.bindings);
            }
            Task::Batch { launches, token } => self.launches(sequence, &launches, token),
            Task::Record(signal) => drop(signal),
            Task::Wait(event) => {
                if self.refusal().is_none() {
                    event.wait();
                }
            }
            Task::Fail { error } => self.latch(*error),
        }
        self.done = sequence;
        if self.done - self.reported >= REPORT_EVERY {
            self.report(None);
        }
    }

    /// Runs `work` unless the device is faulted; a fault is sticky.
    fn device_work(
        &mut self,
        sequence: u64,
        operation: &str,
        work: impl FnOnce() -> Result<(), KernelFault>,
    ) {
        if let Some(error) = self.refusal() {
            self.latch(error);
        } else if let Err(fault) = caught(work) {
            self.fault(sequence, operation, &fault);
        }
    }

    fn launches(&mut self, sequence: u64, launches: &[CpuLaunch], token: Option<PendingToken>) {
        if let Some(error) = self.refusal() {
            self.latch(error.clone());
            if let Some(token) = token {
                token.fail(error);
            }
            return;
        }
        if let Err((index, failure)) = kernels::run_all(launches, &self.device) {
            let error = match failure {
                // Operation-local: the kernel changed nothing; only its
                // owner and this stream's latch hear of it.
                LaunchError::Refused(error) => {
                    self.latch(error.clone());
                    error
                }
                LaunchError::Fault(fault) => {
                    let kernel = launches
                        .get(index)
                        .map_or("?", |launch| launch.kernel.name());
                    self.fault(sequence, &format!("launch {kernel}"), &fault)
                }
            };
            if let Some(token) = token {
                token.fail(error);
            }
            return;
        }
        if let Some(token) = token {
            token.succeed();
        }
    }

    /// Makes a fault sticky and returns the error its owner gets. The
    /// server hears of it first, then every executor, then the owner, so
    /// whoever has seen the fault is causally after the server can see it.
    fn fault(&mut self, sequence: u64, operation: &str, fault: &KernelFault) -> ServerError {
        let poison = self.poison_for(operation, fault);
        self.done = sequence;
        self.report(Some(poison.clone()));
        self.device.mark_faulted(poison.clone());
        let error = ServerError::ContextPoisoned(poison);
        self.latch(error.clone());
        error
    }

    /// The error later work gets once the device is faulted.
    fn refusal(&self) -> Option<ServerError> {
        self.device.poison().map(ServerError::ContextPoisoned)
    }

    fn latch(&mut self, error: ServerError) {
        if self.latched.is_none() {
            self.latched = Some(error);
        }
    }

    fn poison_for(&self, operation: &str, fault: &KernelFault) -> DevicePoison {
        DevicePoison {
            ordinal: self.device.ordinal,
            generation: self.device.generation.load(Ordering::Relaxed),
            operation: operation.to_string(),
            status: fault.to_string(),
            backtrace: BackTrace::capture(),
        }
    }

    fn report(&mut self, fault: Option<DevicePoison>) {
        if self.done != self.reported || fault.is_some() {
            self.reported = self.done;
            // A gone server needs no completions.
            let _ = self.completions.send(Completion {
                stream: self.stream,
                sequence: self.done,
                fault,
            });
        }
        // After the send, so a server that sees the stream idle also finds
        // its completion in the channel.
        self.progress.publish(self.reported, self.latched.is_some());
    }
}
