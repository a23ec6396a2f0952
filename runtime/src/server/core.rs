//! `ServerCore`: the device server as a synchronous state machine — a
//! command in, its effects and replies out.
//!
//! It never blocks: work goes to the backend's stream queues, replies that
//! need the stream to reach a point (read, sync) travel inside the work and
//! are answered by the executor, and completions are drained from a channel
//! without waiting. The server thread is a loop around `handle`; a test or a
//! seeded scheduler can drive the same core step by step.

use cistern_memory::{AllocationId, MemoryConfig, MemoryManager, SliceLocation, StreamId};

use super::context::Context;
use super::graphs::Graphs;
use super::invalidate::Recovery;
use super::published::PublishedState;
use super::streams::Streams;
use super::validate::check_region;
use crate::backend::{Backend, Completion};
use crate::command::{Command, ServerStats};
use crate::context_state::ContextState;
use crate::error::ServerError;
use crate::fault::{FaultInjector, FaultPlan};
use crate::ids::{BufferRef, DEFAULT_STREAM, Region, ServerId};
use crate::kernel::KernelLaunch;
use crate::sync::{Receiver, Reply};

/// Whether the server keeps serving after a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Take the next command.
    Continue,
    /// The command was a shutdown: end the serve loop.
    Stop,
}

/// One device's server state, in owned parts: the device (backend, memory
/// manager, completions), the context's health, the streams and their
/// sequences, recovery, graphs and captures, fault injection, and counters.
/// Each part keeps its own invariants; the commands of `commands.rs`,
/// `capture.rs` and `invalidate.rs` combine them.
pub struct ServerCore<B: Backend> {
    pub(super) id: ServerId,
    pub(super) ordinal: usize,
    pub(super) backend: B,
    pub(super) memory: MemoryManager<B::Storage>,
    completions: Receiver<Completion>,
    pub(super) context: Context,
    pub(super) streams: Streams,
    pub(super) stats: ServerStats,
    /// The fault plan being carried out; `None` (the hot path) when none.
    pub(super) faults: Option<Box<FaultInjector>>,
    /// The invalidate in progress, if any, and its time bound.
    pub(super) recovery: Recovery,
    pub(super) graphs: Graphs,
    flushing: FlushCadence,
    /// The launches queued while the launch log is on (`None`: off, the
    /// hot path's one branch).
    pub(super) launch_log: Option<Vec<KernelLaunch>>,
}

/// Commands handled since the backend was last flushed: the core flushes
/// at least every [`FLUSH_EVERY`] commands, so work waited on through a
/// token is not held back while other clients keep the server busy.
#[derive(Debug, Default)]
struct FlushCadence(u32);

/// See [`FlushCadence`].
const FLUSH_EVERY: u32 = 64;

impl FlushCadence {
    /// Counts one command; true when a flush is due.
    fn tick(&mut self) -> bool {
        self.0 += 1;
        self.0 >= FLUSH_EVERY
    }

    fn reset(&mut self) {
        self.0 = 0;
    }
}

impl<B: Backend> ServerCore<B> {
    /// A server over `backend`, its `storage` managed under `config`, fed
    /// completions on `completions`; creates the default stream.
    pub fn new(
        id: ServerId,
        mut backend: B,
        storage: B::Storage,
        config: MemoryConfig,
        completions: Receiver<Completion>,
        faults: FaultPlan,
    ) -> Result<Self, ServerError> {
        let memory = MemoryManager::new(storage, config)?;
        backend.create_stream(DEFAULT_STREAM)?;
        let ordinal = backend.device().ordinal();
        Ok(ServerCore {
            id,
            ordinal,
            backend,
            memory,
            completions,
            context: Context::new(ordinal),
            streams: Streams::new(),
            stats: ServerStats::default(),
            faults: FaultInjector::new(faults),
            recovery: Recovery::default(),
            graphs: Graphs::default(),
            flushing: FlushCadence::default(),
            launch_log: None,
        })
    }

    /// This server's id.
    pub fn id(&self) -> ServerId {
        self.id
    }

    /// The context's state now.
    pub fn context(&self) -> &ContextState {
        self.context.state()
    }

    /// The context's published state, which clients read without a round trip.
    pub fn published(&self) -> PublishedState {
        self.context.published().clone()
    }

    /// The memory manager (read-only: diagnostics and tests).
    pub fn memory(&self) -> &MemoryManager<B::Storage> {
        &self.memory
    }

    /// The backend (read-only: diagnostics and tests).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// What the server has done, with the device's counters.
    pub fn stats(&self) -> ServerStats {
        let counters = self.backend.counters();
        ServerStats {
            kernels_run: counters.kernels_run,
            empty_kernel_runs: counters.empty_kernel_runs,
            kernel_device_ns: counters.kernel_device_ns,
            ..self.stats.clone()
        }
    }

    /// Feeds every completion already reported to the memory manager and
    /// the context state, without waiting.
    pub fn drain_completions(&mut self) {
        while let Ok(completion) = self.completions.try_recv() {
            self.memory
                .stream_completed(completion.stream, completion.sequence);
            if let Some(poison) = completion.fault {
                tracing::error!(
                    device = self.ordinal,
                    stream = completion.stream.0,
                    code = cistern_memory::ErrorCode::DevicePoisoned.stable_id(),
                    operation = %poison.operation,
                    status = %poison.status,
                    "sticky fault: the device is poisoned"
                );
                self.context.poison(poison);
            }
        }
    }

    /// Sends work the backend gathered to the device; call before waiting
    /// for the next command.
    pub fn flush(&mut self) {
        self.flushing.reset();
        self.backend.flush();
    }

    /// Handles one command; never waits on an executor. Work it queues may
    /// wait in the backend until [`flush`](ServerCore::flush).
    pub fn handle(&mut self, command: Command) -> Flow {
        self.drain_completions();
        if self.recovery.is_running() {
            self.poll_recovery();
        }
        self.stats.commands += 1;
        if self.flushing.tick() {
            self.flush();
        }
        if let Some(faults) = &self.faults {
            if faults.panics_at(self.stats.commands) {
                // The injected fault is a server bug: a panic on the server thread.
                panic!("injected server panic at command {}", self.stats.commands);
            }
        }
        let _span = tracing::debug_span!(
            "command",
            device = self.ordinal,
            kind = command.kind(),
            stream = command.stream().map(|stream| stream.0),
        )
        .entered();
        self.dispatch(command)
    }

    /// One call per command; the rare ones are kept out of line (in their
    /// own files), so the launch path's frame stays small.
    fn dispatch(&mut self, command: Command) -> Flow {
        match command {
            Command::Launch {
                stream,
                launch,
                token,
            } => self.launch(stream, launch, token),
            Command::Reserve {
                size,
                policy,
                stream,
                reply,
            } => answer(reply, self.reserve(size, policy, stream)),
            Command::Free { buffer } => self.free_command(buffer),
            Command::Write {
                stream,
                target,
                data,
                reply,
            } => answer(reply, self.write(stream, target, data)),
            Command::Read {
                stream,
                source,
                reply,
            } => self.read(stream, source, reply),
            Command::Copy {
                stream,
                source,
                target,
                reply,
            } => answer(reply, self.copy(stream, *source, *target)),
            Command::StridedCopy {
                stream,
                copy,
                reply,
            } => answer(reply, self.strided_copy(stream, copy)),
            Command::LaunchBatch {
                stream,
                launches,
                token,
                requires,
            } => self.launch_batch(stream, &launches, token, requires),
            Command::OptimizerStep {
                stream,
                step,
                token,
            } => self.launch(stream, (*step).into_launch(), token),
            Command::CreateStream { reply } => answer(reply, self.create_stream()),
            Command::DestroyStream { stream, reply } => {
                answer(reply, self.destroy_stream(stream));
            }
            Command::RecordEvent { stream, reply } => answer(reply, self.record_event(stream)),
            Command::WaitEvent {
                stream,
                event,
                reply,
            } => answer(reply, self.wait_event(stream, event)),
            Command::ReleaseEvent { event } => self.backend.release_event(event),
            Command::Sync { stream, reply } => self.sync(stream, reply),
            Command::MemoryStats { reply } => answer(reply, Ok(self.memory.stats())),
            Command::MemorySnapshot { reply } => answer(reply, Ok(self.memory.snapshot())),
            Command::Reclaim { reply } => answer(reply, self.reclaim()),
            Command::Compact { reply } => answer(reply, self.compact()),
            Command::ServerStats { reply } => answer(reply, Ok(self.stats())),
            Command::TakeLaunchLog {
                keep_logging,
                reply,
            } => {
                let logged = self.launch_log.take().unwrap_or_default();
                self.launch_log = keep_logging.then(Vec::new);
                answer(reply, Ok(logged));
            }
            Command::Invalidate {
                seen_generation,
                reply,
            } => self.invalidate(seen_generation, reply),
            Command::ContextState { reply } => answer(reply, Ok(self.context.state().clone())),
            Command::BeginCapture { stream, reply } => answer(reply, self.begin_capture(stream)),
            Command::CaptureReserve {
                capture,
                size,
                reply,
            } => answer(reply, self.capture_reserve(capture, size)),
            Command::CaptureLaunch {
                capture,
                launches,
                reply,
            } => answer(reply, self.capture_launch(capture, &launches)),
            Command::EndCapture { capture, reply } => answer(reply, self.end_capture(capture)),
            Command::AbortCapture { capture } => self.abort_capture(capture),
            Command::Replay {
                stream,
                graph,
                token,
            } => self.replay(stream, graph, token),
            Command::ReleaseGraph { graph } => self.release_graph(graph),
            Command::Shutdown { reply } => return shutdown(reply),
        }
        Flow::Continue
    }

    /// The entry gate of work on a stream: the context admits work and the stream exists.
    pub(super) fn gate(&self, stream: StreamId) -> Result<(), ServerError> {
        self.context.admit()?;
        self.check_stream(stream)
    }

    pub(super) fn check_stream(&self, stream: StreamId) -> Result<(), ServerError> {
        if self.streams.contains(stream) {
            Ok(())
        } else {
            Err(ServerError::InvalidArgument {
                message: format!("unknown stream {}", stream.0),
            })
        }
    }

    /// The size of an allocation this command may use: of this server, of
    /// the current generation, not freed.
    pub(super) fn size_of(&self, buffer: BufferRef) -> Result<u64, ServerError> {
        self.check_handle(buffer.server, buffer.generation, "a handle")?;
        Ok(self.memory.size_of(buffer.id)?)
    }

    /// Refuses a handle (`what`, for the error) of another server
    /// (`DeviceMismatch`) or of an older generation (`StaleGeneration`).
    pub(super) fn check_handle(
        &self,
        server: ServerId,
        generation: u64,
        what: &str,
    ) -> Result<(), ServerError> {
        if server != self.id {
            return Err(ServerError::DeviceMismatch {
                expected: format!("{} (server {})", self.backend.device(), self.id.0),
                found: format!("{what} of server {}", server.0),
            });
        }
        self.check_generation(generation)
    }

    /// Refuses what was made in another generation than the current one.
    pub(super) fn check_generation(&self, generation: u64) -> Result<(), ServerError> {
        let current = self.context.generation();
        if generation != current {
            return Err(ServerError::StaleGeneration {
                ordinal: self.ordinal,
                resource_generation: generation,
                current_generation: current,
            });
        }
        Ok(())
    }

    /// Gates `stream`, checks `region` and resolves it to memory.
    pub(super) fn locate_for(
        &mut self,
        stream: StreamId,
        region: &Region,
    ) -> Result<SliceLocation, ServerError> {
        self.gate(stream)?;
        let size = self.size_of(region.buffer)?;
        check_region(region, size)?;
        self.slice(region.buffer.id, region.offset, region.size)
    }

    /// `size` bytes at `offset` of an allocation checked by the caller.
    pub(super) fn slice(
        &mut self,
        id: AllocationId,
        offset: u64,
        size: u64,
    ) -> Result<SliceLocation, ServerError> {
        let location = self.memory.locate(id)?;
        Ok(SliceLocation {
            storage: location.storage,
            offset: location.offset + offset,
            size,
        })
    }
}

/// Answers a shutdown: the serve loop ends after it.
#[inline(never)]
fn shutdown(reply: Option<Reply<()>>) -> Flow {
    if let Some(reply) = reply {
        answer(reply, Ok(()));
    }
    Flow::Stop
}

/// Sends an answer; a caller that stopped waiting is not an error.
pub(super) fn answer<T>(reply: Reply<T>, result: Result<T, ServerError>) {
    if let Err(error) = &result {
        trace_refusal("reply", error);
    }
    let _ = reply.send(result);
}

pub(super) fn trace_refusal(step: &str, error: &ServerError) {
    tracing::debug!(
        step,
        code = error.code().stable_id(),
        error = %error,
        "command refused"
    );
}
