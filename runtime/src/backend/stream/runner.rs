//! `StreamRunner`: one stream's executor, keeping the protocol's rules
//! around a backend's [`StreamDevice`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use cistern_memory::{DevicePoison, StreamId};

use super::fault::{KernelFault, LaunchError, ReadError, caught};
use super::health::DeviceHealth;
use super::progress::StreamProgress;
use super::work::{BoundLaunch, Job, Work};
use crate::backend::{Completion, StrideLayout};
use crate::error::ServerError;
use crate::failure::{PendingToken, first_failure};
use crate::sync::{PATIENCE, Receiver, Sender, TryRecvError, poll_patiently, recv_patiently};

/// Completions are reported at least this often while a stream stays busy.
pub const REPORT_EVERY: u64 = 64;

/// The device part of one stream: what only the backend knows how to do.
/// Every call runs on the stream's executor, in stream order; a panic
/// inside one is a sticky fault.
pub trait StreamDevice: Send + 'static {
    /// A resolved range of device memory.
    type Slice: fmt::Debug + Send + Sync;
    /// The recording side of an event; it should also fire when dropped
    /// unrun, so no stream hangs on a stream that ended.
    type Signal: fmt::Debug + Send;
    /// The waiting side of an event.
    type Event: fmt::Debug + Send;
    /// A batch's launches as the resolver made them: the bound list, or a
    /// device's own form that keeps work cached per graph beside it.
    type Batch: AsRef<[BoundLaunch<Self::Slice>]> + fmt::Debug + Send;

    /// Writes `data` (its length is the target's) to `target`.
    fn write(&mut self, target: &Self::Slice, data: &[u8]) -> Result<(), KernelFault>;

    /// The bytes of `source`; a `ReadError::Failed` answers only this read.
    fn read(&mut self, source: &Self::Slice) -> Result<Vec<u8>, ReadError>;

    /// Copies `source` to `target` (same size, not overlapping).
    fn copy(&mut self, source: &Self::Slice, target: &Self::Slice) -> Result<(), KernelFault>;

    /// A strided copy, `layout` from each slice's element zero.
    fn strided_copy(
        &mut self,
        source: &Self::Slice,
        target: &Self::Slice,
        layout: &StrideLayout,
    ) -> Result<(), KernelFault>;

    /// Runs `launches` in order, stopping at the first failure, which it
    /// answers with the failing launch's index.
    fn run(&mut self, launches: &[BoundLaunch<Self::Slice>]) -> Result<(), (usize, LaunchError)>;

    /// Runs a batch as [`run`](StreamDevice::run) runs its launches (the
    /// default): the same outcome, the same indices, the same counts.
    fn run_batch(&mut self, batch: &Self::Batch) -> Result<(), (usize, LaunchError)> {
        self.run(batch.as_ref())
    }

    /// Fires `signal`'s event: the stream has reached it.
    fn record(&mut self, signal: Self::Signal);

    /// Holds the stream until `event` has fired.
    fn wait(&mut self, event: &Self::Event);

    /// A single launch is done with (a backend may recycle its binding list).
    fn release_launch(&mut self, launch: BoundLaunch<Self::Slice>) {
        drop(launch);
    }

    /// The executor has run every item it was sent and is about to wait.
    fn idle(&mut self) {}
}

/// One stream's executor: runs its jobs in order on the calling thread.
pub struct StreamRunner<D: StreamDevice> {
    stream: StreamId,
    device: D,
    health: Arc<DeviceHealth>,
    completions: Sender<Completion>,
    progress: Arc<StreamProgress>,
    latched: Option<ServerError>,
    done: u64,
    reported: u64,
}

impl<D: StreamDevice> StreamRunner<D> {
    /// The executor of `stream` over `device`, sharing the device's
    /// `health`, reporting to `completions` and publishing to `progress`.
    pub fn new(
        stream: StreamId,
        device: D,
        health: Arc<DeviceHealth>,
        completions: Sender<Completion>,
        progress: Arc<StreamProgress>,
    ) -> Self {
        StreamRunner {
            stream,
            device,
            health,
            completions,
            progress,
            latched: None,
            done: 0,
            reported: 0,
        }
    }

    /// Runs jobs until `jobs` is closed and empty.
    pub fn run(mut self, jobs: Receiver<Vec<Job<D>>>) {
        loop {
            let batch = match jobs.try_recv() {
                Ok(batch) => batch,
                Err(TryRecvError::Empty) => {
                    // Idle: tell the server what finished before sleeping.
                    self.report(None);
                    match recv_patiently(&jobs, PATIENCE) {
                        Ok(batch) => batch,
                        Err(_) => break,
                    }
                }
                Err(TryRecvError::Disconnected) => break,
            };
            for job in batch {
                self.execute(job);
            }
            self.device.idle();
        }
        self.report(None);
    }

    /// Runs one job.
    pub fn execute(&mut self, job: Job<D>) {
        let sequence = job.sequence;
        match job.task {
            Work::Sync { reply } => {
                self.done = sequence;
                // Completions first, so reuse they allow is visible to whoever syncs.
                self.report(None);
                let answer = match self.latched.take() {
                    Some(error) => Err(error),
                    None => self.refusal().map_or(Ok(()), Err),
                };
                let _ = reply.send(answer);
            }
            Work::Read { source, reply } => {
                let answer = match self.refusal() {
                    Some(error) => Err(error),
                    None => match caught(|| Ok(self.device.read(&source))) {
                        Ok(Ok(bytes)) => Ok(bytes),
                        Ok(Err(ReadError::Failed(message))) => {
                            Err(ServerError::TransferFailed { message })
                        }
                        Ok(Err(ReadError::Fault(fault))) | Err(fault) => {
                            Err(self.fault(sequence, "read", &fault))
                        }
                    },
                };
                let _ = reply.send(answer);
            }
            Work::Write { target, data } => {
                self.device_work(sequence, "write", |d| d.write(&target, &data));
            }
            Work::Copy { source, target } => {
                self.device_work(sequence, "copy", |d| d.copy(&source, &target));
            }
            Work::StridedCopy {
                source,
                target,
                layout,
            } => self.device_work(sequence, "strided copy", |d| {
                d.strided_copy(&source, &target, &layout)
            }),
            Work::Launch { launch, token } => {
                let one = std::slice::from_ref(&launch);
                self.launches(sequence, one, token, |device| device.run(one));
                self.device.release_launch(launch);
            }
            Work::Batch {
                launches,
                token,
                requires,
            } => match first_failure(&requires) {
                // Nothing of it runs and nothing latches: the owner hears
                // through the token, as from a refusal at the server.
                Some(error) => {
                    if let Some(token) = token {
                        token.fail(error);
                    }
                }
                None => {
                    let list = launches.as_ref();
                    self.launches(sequence, list, token, |device| device.run_batch(&launches));
                }
            },
            Work::RecordEvent { event } => self.device.record(event),
            Work::WaitEvent { event } => {
                if self.refusal().is_none() {
                    self.device.wait(&event);
                }
            }
            Work::WaitStream { stream, sequence } => self.wait_for(&stream, sequence),
            Work::Fail { error } => self.latch(*error),
        }
        self.done = sequence;
        if self.done - self.reported >= REPORT_EVERY {
            self.report(None);
        }
    }

    /// Holds this stream until `stream` has reported `sequence`, or the
    /// device faulted (later work is refused then anyway). Publishes this
    /// stream's own progress first: a stream waiting on this one sees every
    /// item before the wait, so waits that point at earlier work never
    /// deadlock.
    fn wait_for(&mut self, stream: &StreamProgress, sequence: u64) {
        let health = self.health.clone();
        let reached = || stream.reported() >= sequence || health.is_faulted();
        if reached() {
            return;
        }
        self.report(None);
        if poll_patiently(PATIENCE, || reached().then_some(())).is_some() {
            return;
        }
        let mut nap = Duration::from_micros(20);
        while !reached() {
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }

    /// Runs `work` unless the device is faulted; a fault is sticky.
    fn device_work(
        &mut self,
        sequence: u64,
        operation: &str,
        work: impl FnOnce(&mut D) -> Result<(), KernelFault>,
    ) {
        if let Some(error) = self.refusal() {
            self.latch(error);
        } else if let Err(fault) = caught(|| work(&mut self.device)) {
            self.fault(sequence, operation, &fault);
        }
    }

    /// Runs `launches` through `run` unless the device is faulted, and
    /// settles `token` with the outcome.
    fn launches(
        &mut self,
        sequence: u64,
        launches: &[BoundLaunch<D::Slice>],
        token: Option<PendingToken>,
        run: impl FnOnce(&mut D) -> Result<(), (usize, LaunchError)>,
    ) {
        let outcome = match self.refusal() {
            Some(error) => {
                self.latch(error.clone());
                Err(error)
            }
            None => self.run_launches(sequence, launches, run),
        };
        if let Some(token) = token {
            match outcome {
                Ok(()) => token.succeed(),
                Err(error) => token.fail(error),
            }
        }
    }

    fn run_launches(
        &mut self,
        sequence: u64,
        launches: &[BoundLaunch<D::Slice>],
        run: impl FnOnce(&mut D) -> Result<(), (usize, LaunchError)>,
    ) -> Result<(), ServerError> {
        let outcome = match caught(|| Ok(run(&mut self.device))) {
            Ok(outcome) => outcome,
            // A backend that let a panic escape: its launch is unknown.
            Err(fault) => Err((0, LaunchError::Fault(fault))),
        };
        match outcome {
            Ok(()) => Ok(()),
            // Operation-local: the kernel changed nothing; only its owner
            // and this stream's latch hear of it.
            Err((_, LaunchError::Refused(error))) => {
                self.latch(error.clone());
                Err(error)
            }
            Err((index, LaunchError::Fault(fault))) => {
                let kernel = launches
                    .get(index)
                    .map_or("?", |launch| launch.kernel.name());
                Err(self.fault(sequence, &format!("launch {kernel}"), &fault))
            }
        }
    }

    /// Makes a fault sticky and returns the error its owner gets. The
    /// server hears of it first, then every executor, then the owner, so
    /// whoever has seen the fault is causally after the server can see it.
    fn fault(&mut self, sequence: u64, operation: &str, fault: &KernelFault) -> ServerError {
        let poison = self.health.poison_for(operation, fault);
        self.done = sequence;
        self.report(Some(poison.clone()));
        self.health.mark_faulted(poison.clone());
        let error = ServerError::ContextPoisoned(poison);
        self.latch(error.clone());
        error
    }

    /// The error later work gets once the device is faulted.
    fn refusal(&self) -> Option<ServerError> {
        self.health.poison().map(ServerError::ContextPoisoned)
    }

    fn latch(&mut self, error: ServerError) {
        if self.latched.is_none() {
            self.latched = Some(error);
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

/// The answer every executor gives unsent jobs when its thread is gone.
pub(crate) fn refuse_all<D: StreamDevice>(jobs: Vec<Job<D>>, error: &ServerError) {
    for job in jobs {
        job.task.refuse(error.clone());
    }
}
