//! A simulated device under `ServerCore`: work waits in per-stream queues
//! until the scheduler runs it, on a byte-accurate simulated memory, and
//! the completions of healthy work wait until the scheduler delivers them.
//!
//! Adapted from `runtime/tests/state_machine/fake.rs`; it differs where the
//! simulation needs it: it runs copies and relocations (so compaction and the
//! copy command are checked against data), lets the scheduler choose which
//! stream advances, and holds completions back.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use cistern::memory::{
    BackTrace, BookkeepingStorage, DevicePoison, MemoryConfig, SliceLocation, StorageId, StreamId,
};
use cistern::runtime::backend::{
    Backend, Completion, DeviceCounters, Refused, ResolvedLaunch, StreamWork, StrideLayout,
};
use cistern::runtime::sync::{Mutex, Sender, unbounded};
use cistern::runtime::{Device, EventId, FaultPlan, Kernel, ServerCore, ServerError, ServerId};

/// The simulated device's state, shared by the backend (inside the core)
/// and the scheduler.
#[derive(Default)]
pub struct DeviceState {
    /// Submitted work per stream, in submission order.
    queues: HashMap<StreamId, VecDeque<(u64, StreamWork)>>,
    /// Device memory, per storage buffer.
    memory: HashMap<StorageId, Vec<u8>>,
    /// The sticky fault of the current context, until a reset clears it.
    fault: Option<DevicePoison>,
    /// Completions of healthy work not delivered to the server yet.
    undelivered: Vec<Completion>,
    /// Contexts reset so far.
    pub resets: u64,
    /// The context generation the device runs in (set by each reset).
    generation: u64,
}

impl DeviceState {
    fn bytes_mut(&mut self, location: SliceLocation) -> &mut [u8] {
        let page = self.memory.entry(location.storage).or_default();
        let end = (location.offset + location.size) as usize;
        if page.len() < end {
            page.resize(end, 0);
        }
        &mut page[location.offset as usize..end]
    }

    fn copy(&mut self, from: SliceLocation, to: SliceLocation) {
        let bytes = self.bytes_mut(from).to_vec();
        self.bytes_mut(to).copy_from_slice(&bytes);
    }
}

/// The backend half: queues work, never runs it.
pub struct SimBackend {
    state: Arc<Mutex<DeviceState>>,
}

impl Backend for SimBackend {
    type Storage = BookkeepingStorage;

    fn device(&self) -> Device {
        Device::Cpu(0)
    }

    fn create_stream(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.state.lock().queues.entry(stream).or_default();
        Ok(())
    }

    fn destroy_stream(&mut self, stream: StreamId) {
        self.state.lock().queues.remove(&stream);
    }

    fn submit(
        &mut self,
        _storage: &BookkeepingStorage,
        stream: StreamId,
        sequence: u64,
        work: StreamWork,
    ) -> Result<(), Box<Refused>> {
        self.state
            .lock()
            .queues
            .entry(stream)
            .or_default()
            .push_back((sequence, work));
        Ok(())
    }

    fn stream_idle(&self, stream: StreamId) -> bool {
        let state = self.state.lock();
        state.fault.is_none()
            && state.queues.get(&stream).is_none_or(VecDeque::is_empty)
            && !state.undelivered.iter().any(|done| done.stream == stream)
    }

    fn supports_strides(&self, _layout: &StrideLayout) -> bool {
        false
    }

    fn relocate(
        &mut self,
        _storage: &BookkeepingStorage,
        from: SliceLocation,
        to: SliceLocation,
    ) -> Result<(), ServerError> {
        self.state.lock().copy(from, to);
        Ok(())
    }

    fn release_event(&mut self, _event: EventId) {}

    fn counters(&self) -> DeviceCounters {
        DeviceCounters::default()
    }

    fn reset_context(&mut self, generation: u64) -> Result<(), ServerError> {
        let mut state = self.state.lock();
        state.fault = None;
        state.generation = generation;
        state.resets += 1;
        Ok(())
    }
}

/// The scheduler's half: runs queued work and delivers completions.
pub struct SimDevice {
    state: Arc<Mutex<DeviceState>>,
    completions: Sender<Completion>,
}

/// A core over a fresh simulated device with a 64 MiB limit and small pages.
pub fn build(faults: FaultPlan) -> Result<(ServerCore<SimBackend>, SimDevice), ServerError> {
    let state = Arc::new(Mutex::new(DeviceState::default()));
    let (completions, completed) = unbounded();
    let backend = SimBackend {
        state: state.clone(),
    };
    let core = ServerCore::new(
        ServerId(7),
        backend,
        BookkeepingStorage::default(),
        // Small pages, so several exist and compaction finds sparse ones.
        MemoryConfig {
            min_page_size: 32 << 10,
            max_page_size: 1 << 20,
            exclusive_threshold: 256 << 10,
            ..MemoryConfig::with_limit(64 << 20)
        },
        completed,
        faults,
    )?
    // The simulation has no clock: a recovery is never cut short by time.
    .with_drain_timeout(std::time::Duration::from_secs(3600));
    Ok((core, SimDevice { state, completions }))
}

fn poison(operation: &str, generation: u64) -> DevicePoison {
    DevicePoison {
        ordinal: 0,
        generation,
        operation: operation.into(),
        status: "the kernel trapped".into(),
        backtrace: BackTrace::none(),
    }
}

impl SimDevice {
    /// Streams with queued work, in a stable order.
    pub fn busy_streams(&self) -> Vec<StreamId> {
        let state = self.state.lock();
        let mut streams: Vec<StreamId> = state
            .queues
            .iter()
            .filter(|(_, queue)| !queue.is_empty())
            .map(|(stream, _)| *stream)
            .collect();
        streams.sort_unstable();
        streams
    }

    /// Whether any work is queued or any completion undelivered.
    pub fn is_quiet(&self) -> bool {
        let state = self.state.lock();
        state.undelivered.is_empty() && state.queues.values().all(VecDeque::is_empty)
    }

    /// Contexts reset so far.
    pub fn resets(&self) -> u64 {
        self.state.lock().resets
    }

    /// Delivers the oldest `count` held completions to the server.
    pub fn deliver(&self, count: usize) {
        let mut state = self.state.lock();
        let count = count.min(state.undelivered.len());
        for completion in state.undelivered.drain(..count) {
            let _ = self.completions.send(completion);
        }
    }

    /// Runs the next item of `stream`, if any, as a healthy device would
    /// (a trap poisons it; a poisoned device refuses everything after).
    pub fn run_next(&self, stream: StreamId) {
        let mut state = self.state.lock();
        let Some((sequence, work)) = state.queues.get_mut(&stream).and_then(VecDeque::pop_front)
        else {
            return;
        };
        let refusal = state.fault.clone().map(ServerError::ContextPoisoned);
        let answers = matches!(work, StreamWork::Read { .. } | StreamWork::Sync { .. });
        if answers {
            // An executor reports what ran before a point before answering at it.
            for completion in state.undelivered.drain(..) {
                let _ = self.completions.send(completion);
            }
        }
        match work {
            StreamWork::Write { target, data } if refusal.is_none() => {
                state.bytes_mut(target).copy_from_slice(&data);
            }
            StreamWork::Copy { source, target } if refusal.is_none() => {
                state.copy(source, target);
            }
            StreamWork::Read { source, reply } => {
                let answer = match refusal {
                    Some(error) => Err(error),
                    None => Ok(state.bytes_mut(source).to_vec()),
                };
                let _ = reply.send(answer);
            }
            StreamWork::Launch { launch, token } => {
                let outcome = match refusal {
                    Some(error) => Err(error),
                    None => self.launches(&mut state, stream, sequence, &[launch]),
                };
                if let Some(token) = token {
                    match outcome {
                        Ok(()) => token.succeed(),
                        Err(error) => token.fail(error),
                    }
                }
            }
            StreamWork::Batch { launches, token } => {
                let outcome = match refusal {
                    Some(error) => Err(error),
                    None => self.launches(&mut state, stream, sequence, &launches),
                };
                if let Some(token) = token {
                    match outcome {
                        Ok(()) => token.succeed(),
                        Err(error) => token.fail(error),
                    }
                }
            }
            StreamWork::Sync { reply } => {
                let _ = reply.send(refusal.map_or(Ok(()), Err));
            }
            _ => {}
        }
        state.undelivered.push(Completion {
            stream,
            sequence,
            fault: None,
        });
    }

    fn launches(
        &self,
        state: &mut DeviceState,
        stream: StreamId,
        sequence: u64,
        launches: &[ResolvedLaunch],
    ) -> Result<(), ServerError> {
        for launch in launches {
            match &launch.kernel {
                Kernel::Trap => {
                    let fault = poison("launch trap", state.generation);
                    // A sticky fault is reported at once, after what ran
                    // before it and before any later answer.
                    for completion in state.undelivered.drain(..) {
                        let _ = self.completions.send(completion);
                    }
                    let _ = self.completions.send(Completion {
                        stream,
                        sequence,
                        fault: Some(fault.clone()),
                    });
                    state.fault = Some(fault.clone());
                    return Err(ServerError::ContextPoisoned(fault));
                }
                Kernel::Identity | Kernel::Copy => {
                    state.copy(launch.bindings[0], launch.bindings[1]);
                }
                Kernel::Fill { value } => {
                    let value = *value;
                    for chunk in state.bytes_mut(launch.bindings[0]).chunks_exact_mut(4) {
                        chunk.copy_from_slice(&value.to_ne_bytes());
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}
