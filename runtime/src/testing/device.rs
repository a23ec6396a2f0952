//! `TestDevice`: the test's handle on the test device. It sees the queue of
//! submitted work, runs it on the simulated memory when told, delivers the
//! completions it holds, and records what the backend was asked.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use cistern_memory::{BackTrace, DevicePoison, StreamId};

use super::launch::{Trapped, run_launch};
use super::memory::SimulatedMemory;
use crate::backend::{Completion, DeviceCounters, ResolvedLaunch, StreamWork};
use crate::error::ServerError;
use crate::failure::PendingToken;
use crate::failure::first_failure;
use crate::kernel::Kernel;
use crate::sync::{Mutex, Reply, Sender};

/// One submitted item: its stream, its sequence on that stream, the work.
pub type QueuedWork = (StreamId, u64, StreamWork);

/// How the test device runs the work it is told to run.
#[derive(Clone, Debug, PartialEq)]
pub enum Run {
    /// As a healthy device would.
    Normal,
    /// Syncs are held unanswered (a stream that never drains); the test
    /// takes them with [`TestDevice::take_held_syncs`].
    HoldSyncs,
    /// Syncs are dropped unanswered (an executor that ended).
    LoseSyncs,
    /// Reads answer this error.
    FailReads(ServerError),
    /// Reads answer with their first byte flipped.
    CorruptReads,
}

/// The poison the test device reports for a trap in `generation`.
pub fn trap_poison(generation: u64) -> DevicePoison {
    DevicePoison {
        ordinal: 0,
        generation,
        operation: "launch trap".into(),
        status: "the kernel trapped".into(),
        backtrace: BackTrace::none(),
    }
}

/// The device's state, shared by the backend (inside the core) and the
/// test's handle.
#[derive(Default)]
pub(super) struct DeviceState {
    /// Submitted work, in submission order over all streams.
    pub(super) queue: VecDeque<QueuedWork>,
    pub(super) memory: SimulatedMemory,
    /// The sticky fault of the current context, until a reset clears it.
    pub(super) fault: Option<DevicePoison>,
    /// Completions of healthy work not delivered to the server yet.
    pub(super) undelivered: Vec<Completion>,
    /// The generation later faults are labelled with (set by each reset).
    pub(super) generation: u64,
    /// The generation of every `reset_context` call, in order.
    pub(super) reset_generations: Vec<u64>,
    /// What `reset_context` answers, when the test makes it fail.
    pub(super) reset_error: Option<ServerError>,
    pub(super) kernels_run: Vec<Kernel>,
    pub(super) counters: DeviceCounters,
    pub(super) held_syncs: Vec<Reply<()>>,
    /// The highest sequence run per stream, for cross-stream waits.
    pub(super) ran: HashMap<StreamId, u64>,
}

impl DeviceState {
    /// Whether `work` may run now: a cross-stream wait holds its stream
    /// until the stream it waits for has run that far.
    fn can_run(&self, work: &StreamWork) -> bool {
        match work {
            StreamWork::WaitStream { stream, sequence } => {
                self.ran.get(stream).is_some_and(|ran| ran >= sequence)
            }
            _ => true,
        }
    }

    /// Sends every held completion to the server, oldest first.
    fn deliver(&mut self, count: usize, completions: &Sender<Completion>) {
        let count = count.min(self.undelivered.len());
        for completion in self.undelivered.drain(..count) {
            let _ = completions.send(completion);
        }
    }

    /// Runs one item as `run` says (a trap poisons the device; a poisoned
    /// device refuses everything after) and holds its completion.
    fn execute(&mut self, item: QueuedWork, run: &Run, completions: &Sender<Completion>) {
        let (stream, sequence, work) = item;
        self.ran.insert(stream, sequence);
        let refusal = self.fault.clone().map(ServerError::ContextPoisoned);
        if matches!(work, StreamWork::Read { .. } | StreamWork::Sync { .. }) {
            // An executor reports what ran before a point before answering at it.
            self.deliver(usize::MAX, completions);
        }
        match work {
            StreamWork::Write { target, data } if refusal.is_none() => {
                self.memory.bytes_mut(target).copy_from_slice(&data);
            }
            StreamWork::Copy { source, target } if refusal.is_none() => {
                self.memory.copy(source, target);
            }
            StreamWork::StridedCopy {
                source,
                target,
                layout,
            } if refusal.is_none() => self.memory.strided_copy(source, target, &layout),
            StreamWork::Read { source, reply } => {
                let answer = match (refusal, run) {
                    (Some(error), _) => Err(error),
                    (None, Run::FailReads(error)) => Err(error.clone()),
                    (None, Run::CorruptReads) => {
                        let mut bytes = self.memory.bytes_mut(source).to_vec();
                        if let Some(first) = bytes.first_mut() {
                            *first ^= 0xFF;
                        }
                        Ok(bytes)
                    }
                    (None, _) => Ok(self.memory.bytes_mut(source).to_vec()),
                };
                let _ = reply.send(answer);
            }
            StreamWork::Launch { launch, token } => {
                let outcome = match refusal {
                    Some(error) => Err(error),
                    None => {
                        self.launches(stream, sequence, std::slice::from_ref(&launch), completions)
                    }
                };
                settle(token, outcome);
            }
            StreamWork::Batch {
                launches,
                token,
                requires,
            } => {
                let outcome = match (refusal, first_failure(&requires)) {
                    (Some(error), _) | (None, Some(error)) => Err(error),
                    (None, None) => self.launches(stream, sequence, &launches, completions),
                };
                settle(token, outcome);
            }
            StreamWork::Sync { reply } => match run {
                Run::HoldSyncs => self.held_syncs.push(reply),
                Run::LoseSyncs => drop(reply),
                _ => {
                    let _ = reply.send(refusal.map_or(Ok(()), Err));
                }
            },
            _ => {}
        }
        self.undelivered.push(Completion {
            stream,
            sequence,
            fault: None,
        });
    }

    /// Runs `launches` in order, stopping at a trap, which it reports at
    /// once: after what ran before it and before any later answer.
    fn launches(
        &mut self,
        stream: StreamId,
        sequence: u64,
        launches: &[ResolvedLaunch],
        completions: &Sender<Completion>,
    ) -> Result<(), ServerError> {
        for launch in launches {
            match run_launch(&mut self.memory, &mut self.counters, launch) {
                Ok(kernel) => self.kernels_run.push(kernel),
                Err(Trapped) => {
                    let fault = trap_poison(self.generation);
                    self.deliver(usize::MAX, completions);
                    let _ = completions.send(Completion {
                        stream,
                        sequence,
                        fault: Some(fault.clone()),
                    });
                    self.fault = Some(fault.clone());
                    return Err(ServerError::ContextPoisoned(fault));
                }
            }
        }
        Ok(())
    }
}

fn settle(token: Option<PendingToken>, outcome: Result<(), ServerError>) {
    if let Some(token) = token {
        match outcome {
            Ok(()) => token.succeed(),
            Err(error) => token.fail(error),
        }
    }
}

/// The test's handle on a test device: cheap to clone, shared with the
/// [`TestBackend`](super::TestBackend) inside the core.
#[derive(Clone)]
pub struct TestDevice {
    pub(super) state: Arc<Mutex<DeviceState>>,
    pub(super) completions: Sender<Completion>,
}

impl TestDevice {
    /// How many submitted items wait to run.
    pub fn queued_len(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// The oldest submitted item, taken without running it.
    pub fn take_next(&self) -> Option<QueuedWork> {
        self.state.lock().queue.pop_front()
    }

    /// Every submitted item, in submission order, taken without running it.
    pub fn take_queued(&self) -> Vec<QueuedWork> {
        self.state.lock().queue.drain(..).collect()
    }

    /// Streams whose next queued item can run now (not held by a
    /// cross-stream wait), in ascending order.
    pub fn busy_streams(&self) -> Vec<StreamId> {
        let state = self.state.lock();
        let mut streams: Vec<StreamId> = Vec::new();
        let mut seen: Vec<StreamId> = Vec::new();
        for (stream, _, work) in &state.queue {
            if seen.contains(stream) {
                continue;
            }
            seen.push(*stream);
            if state.can_run(work) {
                streams.push(*stream);
            }
        }
        streams.sort_unstable();
        streams
    }

    /// Whether no work is queued and no completion is held.
    pub fn is_quiet(&self) -> bool {
        let state = self.state.lock();
        state.queue.is_empty() && state.undelivered.is_empty()
    }

    /// Runs the oldest queued item of `stream`, if any and if it can run
    /// now (a cross-stream wait whose stream is behind holds it), as `run` says.
    pub fn run_next(&self, stream: StreamId, run: &Run) {
        let mut state = self.state.lock();
        let Some(position) = state.queue.iter().position(|(s, ..)| *s == stream) else {
            return;
        };
        if !state
            .queue
            .get(position)
            .is_some_and(|(_, _, work)| state.can_run(work))
        {
            return;
        }
        if let Some(item) = state.queue.remove(position) {
            state.execute(item, run, &self.completions);
        }
    }

    /// Runs everything queued now, in submission order, as `run` says;
    /// returns how many items ran.
    pub fn run_queued(&self, run: &Run) -> usize {
        let mut state = self.state.lock();
        let items: Vec<QueuedWork> = state.queue.drain(..).collect();
        let count = items.len();
        for item in items {
            state.execute(item, run, &self.completions);
        }
        count
    }

    /// Delivers the oldest `count` held completions to the server.
    pub fn deliver(&self, count: usize) {
        self.state.lock().deliver(count, &self.completions);
    }

    /// Sends `completion` to the server at once, as an executor would
    /// (a fault in it poisons the context; the device itself stays healthy).
    pub fn report(&self, completion: Completion) {
        let sent = self.completions.send(completion);
        debug_assert!(sent.is_ok(), "the core holds the completion channel");
    }

    /// The generation of every `reset_context` the server made, in order.
    pub fn reset_generations(&self) -> Vec<u64> {
        self.state.lock().reset_generations.clone()
    }

    /// Makes every later `reset_context` answer `error` (`None`: succeed).
    pub fn fail_resets_with(&self, error: Option<ServerError>) {
        self.state.lock().reset_error = error;
    }

    /// The kernels that ran to completion, in order.
    pub fn kernels_run(&self) -> Vec<Kernel> {
        self.state.lock().kernels_run.clone()
    }

    /// The syncs [`Run::HoldSyncs`] held, to answer later.
    pub fn take_held_syncs(&self) -> Vec<Reply<()>> {
        std::mem::take(&mut self.state.lock().held_syncs)
    }
}

#[cfg(test)]
mod tests {
    use super::Run;
    use crate::ids::DEFAULT_STREAM;
    use crate::testing::TestServer;

    #[test]
    fn a_completion_waits_until_the_test_delivers_it() {
        let mut server = TestServer::new();
        let buffer = server.reserve(64);
        assert_eq!(server.write(buffer, vec![1; 64]), Ok(()));
        assert_eq!(server.device.busy_streams(), vec![DEFAULT_STREAM]);
        server.device.run_next(DEFAULT_STREAM, &Run::Normal);
        assert!(server.device.busy_streams().is_empty());
        assert!(!server.device.is_quiet());
        server.device.deliver(usize::MAX);
        assert!(server.device.is_quiet());
    }
}
