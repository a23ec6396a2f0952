//! `ServerCore`: the device server as a synchronous state machine — a
//! command in, its effects and replies out.
//!
//! It never blocks: work goes to the backend's stream queues, replies that
//! need the stream to reach a point (read, sync) travel inside the work and
//! are answered by the executor, and completions are drained from a channel
//! without waiting. The server thread is a loop around `handle`; a test or a
//! seeded scheduler can drive the same core step by step.

use cistern_memory::{AllocationId, MemoryConfig, MemoryManager, SliceLocation, StreamId};

use super::context::{Context, ContextState};
use super::graphs::Graphs;
use super::invalidate::Recovery;
use super::ordering::{self, Use};
use super::validate::check_region;
use crate::backend::{Backend, Completion, Refused, StreamWork};
use crate::command::{BufferRef, Command, Region, ServerId, ServerStats};
use crate::fault::FaultInjector;
use crate::sync::{Receiver, Reply};
use crate::{Access, DEFAULT_STREAM, FaultPlan, ServerError};
use cistern_memory::IdMap;

/// Whether the server keeps serving after a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Take the next command.
    Continue,
    /// The command was a shutdown: end the serve loop.
    Stop,
}

/// One device's server state: backend, memory manager, streams, context.
pub struct ServerCore<B: Backend> {
    pub(super) id: ServerId,
    pub(super) ordinal: usize,
    pub(super) backend: B,
    pub(super) memory: MemoryManager<B::Storage>,
    pub(super) completions: Receiver<Completion>,
    pub(super) context: Context,
    /// Each stream's last sequence number handed out.
    pub(super) streams: IdMap<StreamId, u64>,
    pub(super) next_stream: u64,
    pub(super) next_event: u64,
    pub(super) stats: ServerStats,
    /// The fault plan being carried out; `None` (the hot path) when none.
    pub(super) faults: Option<Box<FaultInjector>>,
    /// The invalidate in progress, if any, and its time bound.
    pub(super) recovery: Recovery,
    /// Commands handled since the backend was last flushed.
    pub(super) unflushed: u32,
    /// The captured graphs and the capture in progress.
    pub(super) graphs: Graphs,
}

/// The core flushes the backend at least this often, so work waited on
/// through a token is not held back while other clients keep the server busy.
const FLUSH_EVERY: u32 = 64;

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
            streams: IdMap::from_iter([(DEFAULT_STREAM, 0)]),
            next_stream: DEFAULT_STREAM.0 + 1,
            next_event: 0,
            stats: ServerStats::default(),
            faults: FaultInjector::new(faults),
            recovery: Recovery::default(),
            unflushed: 0,
            graphs: Graphs::default(),
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
                    code = crate::ErrorCode::DevicePoisoned.stable_id(),
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
        self.unflushed = 0;
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
        self.unflushed += 1;
        if self.unflushed >= FLUSH_EVERY {
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
        match command {
            Command::Launch {
                stream,
                launch,
                token,
            } => {
                self.launch(stream, launch, token);
                Flow::Continue
            }
            other => self.dispatch(other),
        }
    }

    /// Every command but the hot `Launch`, kept out of line so the launch
    /// path's frame stays small.
    #[inline(never)]
    fn dispatch(&mut self, command: Command) -> Flow {
        match command {
            Command::Reserve {
                size,
                policy,
                stream,
                reply,
            } => {
                let result = self.reserve(size, policy, stream);
                answer(reply, result);
            }
            Command::Free { buffer } => {
                self.stats.frees += 1;
                if !self.defer_free(buffer) {
                    self.free(buffer);
                }
            }
            Command::Write {
                stream,
                target,
                data,
                reply,
            } => {
                let result = self.write(stream, target, data);
                answer(reply, result);
            }
            Command::Read {
                stream,
                source,
                reply,
            } => match self
                .locate_for(stream, &source)
                .and_then(|location| self.inject_transfer_fault().map(|()| location))
            {
                Ok(location) => {
                    let work = StreamWork::Read {
                        source: location,
                        reply,
                    };
                    let _ = self.submit(stream, work, &[(source.buffer.id, Access::Read)]);
                }
                Err(error) => answer(reply, Err(error)),
            },
            Command::Copy {
                stream,
                source,
                target,
                reply,
            } => {
                let result = self.copy(stream, *source, *target);
                answer(reply, result);
            }
            Command::StridedCopy {
                stream,
                copy,
                reply,
            } => {
                let result = self.strided_copy(stream, copy);
                answer(reply, result);
            }
            Command::Launch {
                stream,
                launch,
                token,
            } => self.launch(stream, launch, token),
            Command::LaunchBatch {
                stream,
                launches,
                token,
            } => {
                self.stats.batches += 1;
                self.launch_batch(stream, &launches, token);
            }
            Command::OptimizerStep {
                stream,
                step,
                token,
            } => self.launch(stream, (*step).into_launch(), token),
            Command::CreateStream { reply } => {
                let result = self.create_stream();
                answer(reply, result);
            }
            Command::DestroyStream { stream, reply } => {
                let result = self.destroy_stream(stream);
                answer(reply, result);
            }
            Command::RecordEvent { stream, reply } => {
                let result = self.record_event(stream);
                answer(reply, result);
            }
            Command::WaitEvent {
                stream,
                event,
                reply,
            } => {
                let result = self
                    .gate(stream)
                    .and_then(|()| self.submit(stream, StreamWork::WaitEvent { event }, &[]));
                answer(reply, result);
            }
            Command::ReleaseEvent { event } => self.backend.release_event(event),
            Command::Sync { stream, reply } => {
                self.stats.syncs += 1;
                match self.gate(stream) {
                    Ok(()) if self.backend.stream_idle(stream) => {
                        // Nothing in flight, nothing latched: answer here,
                        // after taking the completions the stream already
                        // sent (a fault among them refuses at the gate).
                        self.drain_completions();
                        answer(reply, self.gate(stream));
                    }
                    Ok(()) => {
                        let _ = self.submit(stream, StreamWork::Sync { reply }, &[]);
                    }
                    Err(error) => answer(reply, Err(error)),
                }
            }
            Command::MemoryStats { reply } => answer(reply, Ok(self.memory.stats())),
            Command::MemorySnapshot { reply } => answer(reply, Ok(self.memory.snapshot())),
            Command::Reclaim { reply } => {
                let result = self.context.admit().map(|()| self.memory.reclaim());
                answer(reply, result);
            }
            Command::Compact { reply } => {
                let result = self.compact();
                answer(reply, result);
            }
            Command::ServerStats { reply } => answer(reply, Ok(self.stats())),
            Command::Invalidate {
                seen_generation,
                reply,
            } => self.invalidate(seen_generation, reply),
            Command::ContextState { reply } => answer(reply, Ok(self.context.state().clone())),
            Command::BeginCapture { stream, reply } => {
                let result = self.begin_capture(stream);
                answer(reply, result);
            }
            Command::CaptureReserve {
                capture,
                size,
                reply,
            } => {
                let result = self.capture_reserve(capture, size);
                answer(reply, result);
            }
            Command::CaptureLaunch {
                capture,
                launches,
                reply,
            } => {
                let result = self.capture_launch(capture, &launches);
                answer(reply, result);
            }
            Command::EndCapture { capture, reply } => {
                let result = self.end_capture(capture);
                answer(reply, result);
            }
            Command::AbortCapture { capture } => self.abort_capture(capture),
            Command::Replay {
                stream,
                graph,
                token,
            } => {
                self.stats.replays += 1;
                self.replay(stream, graph, token);
            }
            Command::ReleaseGraph { graph } => self.release_graph(graph),
            Command::Shutdown { reply } => {
                if let Some(reply) = reply {
                    answer(reply, Ok(()));
                }
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    /// The entry gate of work on a stream: the context admits work and the stream exists.
    pub(super) fn gate(&self, stream: StreamId) -> Result<(), ServerError> {
        self.context.admit()?;
        self.check_stream(stream)
    }

    pub(super) fn check_stream(&self, stream: StreamId) -> Result<(), ServerError> {
        if self.streams.contains_key(&stream) {
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

    /// Queues `work` as the stream's next item and records its uses of memory.
    pub(super) fn submit(
        &mut self,
        stream: StreamId,
        work: StreamWork,
        uses: &[Use],
    ) -> Result<(), ServerError> {
        self.submit_using(stream, work, uses.iter().copied())
    }

    /// [`submit`](Self::submit), the uses given as an iterator. Work that
    /// conflicts with another stream's work still in flight (see
    /// [`ordering`](super::ordering)) is queued behind a wait for it.
    pub(super) fn submit_using(
        &mut self,
        stream: StreamId,
        work: StreamWork,
        uses: impl Iterator<Item = Use> + Clone,
    ) -> Result<(), ServerError> {
        if !self.streams.contains_key(&stream) {
            let error = ServerError::InvalidArgument {
                message: format!("unknown stream {}", stream.0),
            };
            work.refuse(error.clone());
            return Err(error);
        }
        if self.streams.len() > 1 {
            let waits = ordering::waits(&self.memory, stream, uses.clone());
            for (other, sequence) in waits {
                self.stats.ordering_waits += 1;
                let wait = StreamWork::WaitStream {
                    stream: other,
                    sequence,
                };
                if let Err(error) = self.queue(stream, wait) {
                    // Unordered, the work could race the other stream: refuse it.
                    work.refuse(error.clone());
                    return Err(error);
                }
            }
        }
        match self.queue(stream, work) {
            Ok(sequence) => {
                for (id, access) in uses {
                    // Checked to exist by the caller in this same command.
                    let recorded = match access {
                        Access::Read => self.memory.record_use(id, stream, sequence),
                        Access::Write => self.memory.record_write(id, stream, sequence),
                    };
                    debug_assert!(recorded.is_ok(), "a checked allocation records its use");
                }
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Hands `work` to the backend as `stream`'s next item (a known
    /// stream); answers its sequence, or refuses it.
    fn queue(&mut self, stream: StreamId, work: StreamWork) -> Result<u64, ServerError> {
        let Some(last) = self.streams.get_mut(&stream) else {
            let error = ServerError::InvalidArgument {
                message: format!("unknown stream {}", stream.0),
            };
            work.refuse(error.clone());
            return Err(error);
        };
        *last += 1;
        let sequence = *last;
        match self
            .backend
            .submit(self.memory.storage(), stream, sequence, work)
        {
            Ok(()) => Ok(sequence),
            Err(refused) => {
                let Refused { error, work } = *refused;
                trace_refusal("submit", &error);
                work.refuse(error.clone());
                Err(error)
            }
        }
    }
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
