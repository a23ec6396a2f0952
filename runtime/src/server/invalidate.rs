//! `invalidate(seen_generation)`: retiring a poisoned context, as steps the
//! server takes between commands — it never waits on an executor.
//!
//! 1. `Poisoned → Retiring`: a drain marker (a stream sync) is queued on
//!    every stream; the executors answer them. A destroyed stream whose
//!    work may still run has its last marker, queued when it was
//!    destroyed: the drain waits for those too.
//! 2. When every marker is answered: the old generation's completions are
//!    drained, the backend syncs and clears its sticky state, and every
//!    allocation of the old generation is released.
//! 3. The probe (see `probe.rs`), retried after an operation-local failure,
//!    three attempts in all.
//! 4. `Active(generation + 1)`, or `Unrecoverable { probe_error }` when a
//!    marker is lost, the drain or a probe outlives the time bound, the sync
//!    fails, or the probe fails for good.
//!
//! Callers arriving while it runs: other commands get the transient
//! `ContextRetiring` at once; every `invalidate` is queued and answered with
//! the shared outcome, so concurrent callers advance the generation once.

use std::time::{Duration, Instant};

use cistern_memory::StreamId;

use super::core::{ServerCore, answer};
use super::probe::{PROBE_ATTEMPTS, Probe, ProbeStatus};
use crate::backend::{Backend, StreamWork};
use crate::context_state::ContextState;
use crate::device::DEFAULT_DRAIN_TIMEOUT;
use crate::sync::{Answer, Reply, TryRecvError, reply_channel};

/// The server's recovery: its time bound and the invalidate in progress.
#[derive(Debug)]
pub(crate) struct Recovery {
    timeout: Duration,
    run: Option<Box<RecoveryRun>>,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            timeout: DEFAULT_DRAIN_TIMEOUT,
            run: None,
        }
    }
}

impl Recovery {
    /// Whether an invalidate is in progress.
    #[inline]
    pub(crate) fn is_running(&self) -> bool {
        self.run.is_some()
    }
}

/// One invalidate in progress.
#[derive(Debug)]
struct RecoveryRun {
    /// Every caller of `invalidate` since it began: all get its outcome.
    waiters: Vec<Reply<ContextState>>,
    /// When the current step (the drain, or a probe attempt) has failed.
    deadline: Instant,
    phase: Phase,
}

#[derive(Debug)]
enum Phase {
    /// Streams whose drain marker is not answered yet.
    Draining {
        pending: Vec<(StreamId, Answer<()>)>,
    },
    Probing(Probe),
}

/// What one look at the run decided.
enum Progress {
    Wait,
    Next(Phase),
    Done(Result<(), String>),
}

impl<B: Backend> ServerCore<B> {
    /// Sets how long a drain, or one probe attempt, may take before the
    /// context is declared unrecoverable.
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.recovery.timeout = timeout;
        self
    }

    /// Whether an invalidate is in progress: the server thread then wakes
    /// at least every few milliseconds to [`tick`](Self::tick).
    pub fn is_recovering(&self) -> bool {
        self.recovery.is_running()
    }

    /// Takes the steps of an invalidate in progress that are ready, and ends
    /// it as unrecoverable if its current step is past its bound at `now`.
    /// Does nothing when none is in progress; never waits.
    pub fn tick(&mut self, now: Instant) {
        if self.recovery.is_running() {
            self.drain_completions();
            self.advance_recovery(Some(now));
        }
    }

    /// Takes the ready steps of an invalidate in progress (no time bound).
    pub(super) fn poll_recovery(&mut self) {
        self.advance_recovery(None);
    }

    /// Acts only if the context is poisoned in `seen`; otherwise answers the
    /// state now (or queues the caller for the outcome of the invalidate in
    /// progress).
    pub(super) fn invalidate(&mut self, seen: u64, reply: Reply<ContextState>) {
        let state = self.context.state().clone();
        match state {
            ContextState::Poisoned { generation, .. } if generation == seen => {
                self.begin_recovery(reply);
            }
            ContextState::Retiring { .. } => match self.recovery.run.as_mut() {
                Some(run) => run.waiters.push(reply),
                None => {
                    debug_assert!(false, "a retiring context has a recovery in progress");
                    answer(reply, Ok(state));
                }
            },
            ContextState::Unrecoverable { .. } => {
                answer(reply, self.context.admit().map(|()| state));
            }
            _ => {
                tracing::debug!(
                    device = self.ordinal,
                    seen,
                    state = state.name(),
                    generation = state.generation(),
                    "invalidate changes nothing"
                );
                answer(reply, Ok(state));
            }
        }
    }

    fn begin_recovery(&mut self, reply: Reply<ContextState>) {
        if !self.context.retire() {
            debug_assert!(false, "only a poisoned context begins recovery");
            return;
        }
        let streams = self.streams.ids();
        let mut pending = Vec::with_capacity(streams.len());
        let mut refused = None;
        for stream in streams {
            let (marker, reached) = reply_channel();
            match self.submit(stream, StreamWork::Sync { reply: marker }, &[]) {
                Ok(()) => pending.push((stream, reached)),
                Err(error) => {
                    refused = Some(format!(
                        "the drain marker of stream {} was refused: {error}",
                        stream.0
                    ));
                    break;
                }
            }
        }
        // Destroyed streams' queued work runs on the old generation's
        // memory: it must be drained before the reset too.
        pending.extend(self.streams.take_destroyed());
        self.backend.flush();
        tracing::info!(
            device = self.ordinal,
            streams = pending.len(),
            "invalidate: draining every stream"
        );
        let run = RecoveryRun {
            waiters: vec![reply],
            deadline: Instant::now() + self.recovery.timeout,
            phase: Phase::Draining { pending },
        };
        match refused {
            Some(error) => self.finish_recovery(run, Err(error)),
            None => {
                self.recovery.run = Some(Box::new(run));
                self.poll_recovery();
            }
        }
    }

    fn advance_recovery(&mut self, now: Option<Instant>) {
        let Some(mut run) = self.recovery.run.take() else {
            return;
        };
        loop {
            let expired = now.is_some_and(|now| now >= run.deadline);
            let progress = match &mut run.phase {
                Phase::Draining { pending } => self.poll_drain(pending, expired),
                Phase::Probing(probe) => self.poll_probing(probe, expired),
            };
            match progress {
                Progress::Wait => {
                    self.recovery.run = Some(run);
                    return;
                }
                Progress::Next(phase) => {
                    if let Phase::Probing(old) = std::mem::replace(&mut run.phase, phase) {
                        self.release_probe(&old);
                    }
                    run.deadline = Instant::now() + self.recovery.timeout;
                }
                Progress::Done(outcome) => {
                    self.finish_recovery(*run, outcome);
                    return;
                }
            }
        }
    }

    fn poll_drain(&mut self, pending: &mut Vec<(StreamId, Answer<()>)>, expired: bool) -> Progress {
        let mut lost = None;
        // Any answer, the stream's latched error or the device's fault
        // included, means the stream reached its marker (and the executor
        // cleared its latch).
        pending.retain(|(stream, reached)| match reached.try_recv() {
            Err(TryRecvError::Empty) => true,
            Ok(_) => false,
            Err(TryRecvError::Disconnected) => {
                lost.get_or_insert(*stream);
                false
            }
        });
        if let Some(stream) = lost {
            return Progress::Done(Err(format!(
                "the drain failed: the executor of stream {} ended before its marker",
                stream.0
            )));
        }
        if !pending.is_empty() {
            if expired {
                return Progress::Done(Err(format!(
                    "the drain did not finish within {:?}: {} stream(s) still busy",
                    self.recovery.timeout,
                    pending.len()
                )));
            }
            return Progress::Wait;
        }
        // Every fault of the old generation was reported before its stream
        // answered the marker: take them now, while they poison nothing.
        self.drain_completions();
        let next = self.context.generation() + 1;
        if let Err(error) = self.backend.reset_context(next) {
            return Progress::Done(Err(format!(
                "the device sync after the drain failed: {error}"
            )));
        }
        let released = self.memory.release_all();
        // Old graphs hold (through the backend's cached launches) memory of
        // the old generation: forget them now, not at the next capture.
        self.graphs.renew(next);
        tracing::info!(
            device = self.ordinal,
            released_bytes = released,
            "invalidate: drained; the old generation's memory is released"
        );
        self.start_probing(1, None)
    }

    fn poll_probing(&mut self, probe: &Probe, expired: bool) -> Progress {
        match self.poll_probe(probe) {
            ProbeStatus::Pending if expired => Progress::Done(Err(format!(
                "probe attempt {} did not finish within {:?}",
                probe.attempt, self.recovery.timeout
            ))),
            ProbeStatus::Pending => Progress::Wait,
            ProbeStatus::Passed => Progress::Done(Ok(())),
            ProbeStatus::Failed(failure) if failure.local => {
                self.start_probing(probe.attempt + 1, Some(failure.message))
            }
            ProbeStatus::Failed(failure) => Progress::Done(Err(failure.message)),
        }
    }

    /// Starts probe attempt `attempt`, moving on past attempts that fail
    /// operation-locally before anything is queued.
    fn start_probing(&mut self, mut attempt: u32, mut last: Option<String>) -> Progress {
        let generation = self.context.generation() + 1;
        loop {
            if let Some(message) = &last {
                tracing::warn!(
                    device = self.ordinal,
                    attempt = attempt - 1,
                    error = %message,
                    "invalidate: a probe attempt failed operation-locally"
                );
            }
            if attempt > PROBE_ATTEMPTS {
                return Progress::Done(Err(format!(
                    "the probe failed {PROBE_ATTEMPTS} times; the last: {}",
                    last.unwrap_or_default()
                )));
            }
            match self.start_probe(attempt, generation) {
                Ok(probe) => return Progress::Next(Phase::Probing(probe)),
                Err(failure) if failure.local => {
                    last = Some(failure.message);
                    attempt += 1;
                }
                Err(failure) => return Progress::Done(Err(failure.message)),
            }
        }
    }

    fn finish_recovery(&mut self, run: RecoveryRun, outcome: Result<(), String>) {
        if let Phase::Probing(probe) = &run.phase {
            self.release_probe(probe);
        }
        let result = match outcome {
            Ok(()) => {
                self.context.recover();
                Ok(self.context.state().clone())
            }
            Err(probe_error) => {
                self.context.fail(probe_error);
                self.context.admit().map(|()| self.context.state().clone())
            }
        };
        for waiter in run.waiters {
            answer(waiter, result.clone());
        }
    }
}
