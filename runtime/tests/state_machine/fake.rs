//! A fake device for driving `ServerCore` step by step: work waits in a
//! queue until the test runs it on a simulated memory, the way the test
//! chooses (answering markers or not, failing or corrupting reads).

#![allow(dead_code)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use cistern_memory::{
    AllocationPolicy, BackTrace, BookkeepingStorage, DevicePoison, MemoryConfig, SliceLocation,
    StorageId, StreamId,
};
use cistern_runtime::backend::{
    Backend, Completion, DeviceCounters, Refused, ResolvedLaunch, StreamWork, StrideLayout,
};
use cistern_runtime::sync::{Answer, Mutex, Reply, Sender, reply_channel, unbounded};
use cistern_runtime::{
    BufferRef, Command, ContextState, DEFAULT_STREAM, Device, EventId, FaultPlan, Kernel, Region,
    ServerCore, ServerError, ServerId,
};

type Queue = Arc<Mutex<VecDeque<(StreamId, u64, StreamWork)>>>;

/// What the fake's `reset_context` does, and what it was asked.
#[derive(Default)]
pub struct Resets {
    pub generations: Vec<u64>,
    pub fail_with: Option<ServerError>,
}

/// Queues work and runs none of it until the harness says so.
pub struct FakeBackend {
    queued: Queue,
    streams: HashSet<StreamId>,
    resets: Arc<Mutex<Resets>>,
}

impl Backend for FakeBackend {
    type Storage = BookkeepingStorage;

    fn device(&self) -> Device {
        Device::Cpu(0)
    }

    fn create_stream(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.streams.insert(stream);
        Ok(())
    }

    fn destroy_stream(&mut self, stream: StreamId) {
        self.streams.remove(&stream);
    }

    fn submit(
        &mut self,
        _storage: &BookkeepingStorage,
        stream: StreamId,
        sequence: u64,
        work: StreamWork,
    ) -> Result<(), Box<Refused>> {
        self.queued.lock().push_back((stream, sequence, work));
        Ok(())
    }

    fn supports_strides(&self, _layout: &StrideLayout) -> bool {
        true
    }

    fn relocate(
        &mut self,
        _storage: &BookkeepingStorage,
        _from: SliceLocation,
        _to: SliceLocation,
    ) -> Result<(), ServerError> {
        Ok(())
    }

    fn release_event(&mut self, _event: EventId) {}

    fn counters(&self) -> DeviceCounters {
        DeviceCounters::default()
    }

    fn reset_context(&mut self, generation: u64) -> Result<(), ServerError> {
        let mut resets = self.resets.lock();
        resets.generations.push(generation);
        match resets.fail_with.clone() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

/// How the simulated device runs the queued work.
#[derive(Clone, Debug, PartialEq)]
pub enum Run {
    /// As a healthy device would.
    Normal,
    /// Syncs are left unanswered (a stream that never drains).
    HoldSyncs,
    /// Syncs are dropped unanswered (an executor that ended).
    LoseSyncs,
    /// Reads answer this error.
    FailReads(ServerError),
    /// Reads answer with one byte flipped.
    CorruptReads,
}

/// A `ServerCore` over the fake, with a simulated device memory.
pub struct Harness {
    pub core: ServerCore<FakeBackend>,
    queued: Queue,
    completions: Sender<Completion>,
    pub resets: Arc<Mutex<Resets>>,
    memory: HashMap<StorageId, Vec<u8>>,
    /// The simulated device's sticky fault, and the resets seen when it
    /// happened (a reset clears it).
    faulted: Option<(DevicePoison, usize)>,
    /// Kernels the simulated device ran to completion.
    pub kernels_run: Vec<Kernel>,
    /// Syncs held by `Run::HoldSyncs`, answerable later.
    pub held: Vec<Reply<()>>,
}

pub fn poison(generation: u64) -> DevicePoison {
    DevicePoison {
        ordinal: 0,
        generation,
        operation: "launch trap".into(),
        status: "the kernel trapped".into(),
        backtrace: BackTrace::none(),
    }
}

impl Harness {
    pub fn new() -> Self {
        Harness::with_faults(FaultPlan::none())
    }

    pub fn with_faults(faults: FaultPlan) -> Self {
        Harness::build(faults, cistern_runtime::DEFAULT_DRAIN_TIMEOUT)
    }

    pub fn with_drain_timeout(timeout: std::time::Duration) -> Self {
        Harness::build(FaultPlan::none(), timeout)
    }

    fn build(faults: FaultPlan, timeout: std::time::Duration) -> Self {
        let queued = Queue::default();
        let resets = Arc::new(Mutex::new(Resets::default()));
        let backend = FakeBackend {
            queued: queued.clone(),
            streams: HashSet::new(),
            resets: resets.clone(),
        };
        let (completions, completed) = unbounded();
        let core = ServerCore::new(
            ServerId(11),
            backend,
            BookkeepingStorage::default(),
            MemoryConfig::with_limit(64 << 20),
            completed,
            faults,
        )
        .map(|core| core.with_drain_timeout(timeout));
        match core {
            Ok(core) => Harness {
                core,
                queued,
                completions,
                resets,
                memory: HashMap::new(),
                faulted: None,
                kernels_run: Vec::new(),
                held: Vec::new(),
            },
            Err(error) => panic!("the core starts: {error}"),
        }
    }

    /// Handles the command `make` builds; returns where its answer arrives.
    pub fn send<T>(&mut self, make: impl FnOnce(Reply<T>) -> Command) -> Answer<T> {
        let (reply, answer) = reply_channel();
        self.core.handle(make(reply));
        answer
    }

    /// Handles a command the server must answer itself, at once.
    pub fn call<T: std::fmt::Debug>(
        &mut self,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, ServerError> {
        match self.send(make).try_recv() {
            Ok(result) => result,
            Err(error) => panic!("the server answered at once: {error:?}"),
        }
    }

    pub fn reserve(&mut self, size: u64) -> BufferRef {
        let reservation = self.call(|reply| Command::Reserve {
            size,
            policy: AllocationPolicy::Allow,
            stream: DEFAULT_STREAM,
            reply,
        });
        match reservation {
            Ok(reservation) => reservation.buffer,
            Err(error) => panic!("reserve failed: {error}"),
        }
    }

    pub fn create_stream(&mut self) -> StreamId {
        match self.call(|reply| Command::CreateStream { reply }) {
            Ok(stream) => stream,
            Err(error) => panic!("create_stream failed: {error}"),
        }
    }

    pub fn write(&mut self, buffer: BufferRef, data: Vec<u8>) -> Result<(), ServerError> {
        let target = Region {
            buffer,
            offset: 0,
            size: data.len() as u64,
        };
        self.call(|reply| Command::Write {
            stream: DEFAULT_STREAM,
            target,
            data: data.into(),
            reply,
        })
    }

    /// The context's state, as the query command answers it.
    pub fn state(&mut self) -> ContextState {
        match self.call(|reply| Command::ContextState { reply }) {
            Ok(state) => state,
            Err(error) => panic!("the state query is answered in every state: {error}"),
        }
    }

    /// Reports a sticky fault of `generation` as an executor would.
    pub fn report_fault(&mut self, generation: u64) {
        let sent = self.completions.send(Completion {
            stream: DEFAULT_STREAM,
            sequence: 0,
            fault: Some(poison(generation)),
        });
        assert!(sent.is_ok());
    }

    /// Reports a fault and lets the server see it.
    pub fn poison(&mut self) {
        let generation = self.state().generation();
        self.report_fault(generation);
        assert!(self.state().is_poisoned());
    }

    pub fn invalidate(&mut self, seen: u64) -> Answer<ContextState> {
        self.send(|reply| Command::Invalidate {
            seen_generation: seen,
            reply,
        })
    }

    pub fn queued_len(&self) -> usize {
        self.queued.lock().len()
    }

    /// The queued work, without running it.
    pub fn take_queued(&mut self) -> Vec<(StreamId, u64, StreamWork)> {
        self.queued.lock().drain(..).collect()
    }

    /// Runs everything queued (and anything it queues in turn) as `run`
    /// says, then lets the server take its next steps.
    pub fn run(&mut self, run: &Run) {
        loop {
            let work = self.take_queued();
            if work.is_empty() {
                break;
            }
            for (stream, sequence, work) in work {
                self.execute(stream, sequence, work, run);
            }
            self.core.tick(std::time::Instant::now());
        }
    }

    /// Runs the queue normally until it is empty.
    pub fn run_normally(&mut self) {
        self.run(&Run::Normal);
    }

    fn execute(&mut self, stream: StreamId, sequence: u64, work: StreamWork, run: &Run) {
        let resets = self.resets.lock().generations.len();
        let refusal = match &self.faulted {
            Some((poison, at)) if *at == resets => {
                Some(ServerError::ContextPoisoned(poison.clone()))
            }
            _ => None,
        };
        match work {
            StreamWork::Write { target, data } if refusal.is_none() => {
                self.bytes_mut(target).copy_from_slice(&data);
            }
            StreamWork::Read { source, reply } => {
                let answer = match (refusal, run) {
                    (Some(error), _) => Err(error),
                    (None, Run::FailReads(error)) => Err(error.clone()),
                    (None, Run::CorruptReads) => {
                        let mut bytes = self.bytes_mut(source).to_vec();
                        if let Some(first) = bytes.first_mut() {
                            *first ^= 0xFF;
                        }
                        Ok(bytes)
                    }
                    (None, _) => Ok(self.bytes_mut(source).to_vec()),
                };
                let _ = reply.send(answer);
            }
            StreamWork::Launch { launch, token } => {
                let outcome = match refusal {
                    Some(error) => Err(error),
                    None => self.launches(stream, sequence, std::slice::from_ref(&launch)),
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
                    None => self.launches(stream, sequence, &launches),
                };
                if let Some(token) = token {
                    match outcome {
                        Ok(()) => token.succeed(),
                        Err(error) => token.fail(error),
                    }
                }
            }
            StreamWork::Sync { reply } => match run {
                Run::HoldSyncs => self.held.push(reply),
                Run::LoseSyncs => drop(reply),
                _ => {
                    let _ = reply.send(refusal.map_or(Ok(()), Err));
                }
            },
            _ => {}
        }
        let _ = self.completions.send(Completion {
            stream,
            sequence,
            fault: None,
        });
    }

    fn launches(
        &mut self,
        stream: StreamId,
        sequence: u64,
        launches: &[ResolvedLaunch],
    ) -> Result<(), ServerError> {
        for launch in launches {
            match &launch.kernel {
                Kernel::Trap => {
                    let fault = poison(0);
                    let _ = self.completions.send(Completion {
                        stream,
                        sequence,
                        fault: Some(fault.clone()),
                    });
                    let resets = self.resets.lock().generations.len();
                    self.faulted = Some((fault.clone(), resets));
                    return Err(ServerError::ContextPoisoned(fault));
                }
                Kernel::Identity | Kernel::Copy => {
                    let source = self.bytes_mut(launch.bindings[0]).to_vec();
                    self.bytes_mut(launch.bindings[1]).copy_from_slice(&source);
                }
                Kernel::Fill { value } => {
                    let value = *value;
                    for chunk in self.bytes_mut(launch.bindings[0]).chunks_exact_mut(4) {
                        chunk.copy_from_slice(&value.to_ne_bytes());
                    }
                }
                _ => {}
            }
            self.kernels_run.push(launch.kernel.clone());
        }
        Ok(())
    }

    fn bytes_mut(&mut self, location: SliceLocation) -> &mut [u8] {
        let page = self.memory.entry(location.storage).or_default();
        let end = (location.offset + location.size) as usize;
        if page.len() < end {
            page.resize(end, 0);
        }
        &mut page[location.offset as usize..end]
    }
}
