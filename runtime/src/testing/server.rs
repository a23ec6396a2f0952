//! `TestServer`: a `ServerCore` over a test device, driven by the test on
//! one thread, with the calls every such test makes.

use std::time::{Duration, Instant};

use cistern_memory::{AllocationPolicy, BookkeepingStorage, StreamId};

use super::backend::TestBackend;
use super::device::{QueuedWork, Run, TestDevice, trap_poison};
use super::options::TestOptions;
use crate::backend::Completion;
use crate::command::Command;
use crate::context_state::ContextState;
use crate::error::ServerError;
use crate::failure::FailureToken;
use crate::fault::FaultPlan;
use crate::ids::{BufferRef, DEFAULT_STREAM, Region};
use crate::kernel::KernelLaunch;
use crate::server::ServerCore;
use crate::sync::{Answer, Reply, reply_channel};

/// A core over a [`TestBackend`] and the test's handle on its device. The
/// core only runs when the test hands it a command or a tick: a core that
/// waited on its device would hang the test.
pub struct TestServer {
    /// The server core under test.
    pub core: ServerCore<TestBackend>,
    /// The device under the core.
    pub device: TestDevice,
}

impl TestServer {
    /// A server built as `options` say.
    pub fn start(options: TestOptions) -> Result<TestServer, ServerError> {
        let (backend, device, completed) = TestBackend::new(&options);
        let core = ServerCore::new(
            options.server,
            backend,
            BookkeepingStorage::default(),
            options.memory,
            completed,
            options.faults,
        )?
        .with_drain_timeout(options.drain_timeout);
        Ok(TestServer { core, device })
    }

    /// A server with the default options.
    ///
    /// # Panics
    /// If the core does not start (it always does with the defaults).
    pub fn new() -> TestServer {
        TestServer::started(TestOptions::default())
    }

    /// A server that injects `faults`.
    ///
    /// # Panics
    /// If the core does not start.
    pub fn with_faults(faults: FaultPlan) -> TestServer {
        TestServer::started(TestOptions {
            faults,
            ..TestOptions::default()
        })
    }

    /// A server whose recoveries are bounded by `timeout`.
    ///
    /// # Panics
    /// If the core does not start.
    pub fn with_drain_timeout(timeout: Duration) -> TestServer {
        TestServer::started(TestOptions {
            drain_timeout: timeout,
            ..TestOptions::default()
        })
    }

    /// [`start`](TestServer::start), panicking on failure (for tests).
    ///
    /// # Panics
    /// If the core does not start.
    pub fn started(options: TestOptions) -> TestServer {
        match TestServer::start(options) {
            Ok(server) => server,
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
    ///
    /// # Panics
    /// If the server left it unanswered.
    pub fn call<T: std::fmt::Debug>(
        &mut self,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> Result<T, ServerError> {
        match self.send(make).try_recv() {
            Ok(result) => result,
            Err(error) => panic!("the server answered at once: {error:?}"),
        }
    }

    /// Reserves `size` bytes on the default stream.
    ///
    /// # Panics
    /// If the reservation fails.
    pub fn reserve(&mut self, size: u64) -> BufferRef {
        self.reserve_on(size, DEFAULT_STREAM)
    }

    /// Reserves `size` bytes for `stream`.
    ///
    /// # Panics
    /// If the reservation fails.
    pub fn reserve_on(&mut self, size: u64, stream: StreamId) -> BufferRef {
        let reservation = self.call(|reply| Command::Reserve {
            size,
            policy: AllocationPolicy::Allow,
            stream,
            reply,
        });
        match reservation {
            Ok(reservation) => reservation.buffer,
            Err(error) => panic!("reserve failed: {error}"),
        }
    }

    /// Creates a stream.
    ///
    /// # Panics
    /// If the server refuses.
    pub fn create_stream(&mut self) -> StreamId {
        match self.call(|reply| Command::CreateStream { reply }) {
            Ok(stream) => stream,
            Err(error) => panic!("create_stream failed: {error}"),
        }
    }

    /// Writes `data` to the start of `buffer` on the default stream.
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

    /// Sends a launch (answered through `token`, if any).
    pub fn launch(&mut self, stream: StreamId, launch: KernelLaunch, token: Option<FailureToken>) {
        self.core.handle(Command::Launch {
            stream,
            launch,
            token,
        });
    }

    /// Frees `buffer`.
    pub fn free(&mut self, buffer: BufferRef) {
        self.core.handle(Command::Free { buffer });
    }

    /// The context's state, as the query command answers it.
    ///
    /// # Panics
    /// If the query is refused (it is answered in every state).
    pub fn state(&mut self) -> ContextState {
        match self.call(|reply| Command::ContextState { reply }) {
            Ok(state) => state,
            Err(error) => panic!("the state query is answered in every state: {error}"),
        }
    }

    /// Reports a sticky fault of `generation` as an executor would.
    pub fn report_fault(&mut self, generation: u64) {
        self.device.report(Completion {
            stream: DEFAULT_STREAM,
            sequence: 0,
            fault: Some(trap_poison(generation)),
        });
    }

    /// Reports a fault of the current generation and lets the server see it.
    pub fn poison(&mut self) {
        let generation = self.state().generation();
        self.report_fault(generation);
        assert!(self.state().is_poisoned(), "a reported fault poisons");
    }

    /// Sends an invalidate naming generation `seen`.
    pub fn invalidate(&mut self, seen: u64) -> Answer<ContextState> {
        self.send(|reply| Command::Invalidate {
            seen_generation: seen,
            reply,
        })
    }

    /// How many submitted items wait to run.
    pub fn queued_len(&self) -> usize {
        self.device.queued_len()
    }

    /// Every submitted item, taken without running it.
    pub fn take_queued(&mut self) -> Vec<QueuedWork> {
        self.device.take_queued()
    }

    /// Runs everything queued (and anything that queues in turn) as `run`
    /// says, delivering completions and letting the server take its next
    /// step after each round.
    pub fn run(&mut self, run: &Run) {
        while self.device.run_queued(run) > 0 {
            self.device.deliver(usize::MAX);
            self.core.tick(Instant::now());
        }
    }

    /// Runs the queue normally until it is empty.
    pub fn run_normally(&mut self) {
        self.run(&Run::Normal);
    }
}

impl Default for TestServer {
    fn default() -> Self {
        TestServer::new()
    }
}
