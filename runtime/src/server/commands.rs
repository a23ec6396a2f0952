//! What each command does to the server's state, once dispatched by
//! [`ServerCore::handle`]: reservations, transfers, launches, streams,
//! events, compaction.

use std::sync::Arc;

use cistern_memory::{AllocationPolicy, BackTrace, IoError, SliceLocation, StreamId};

use super::core::{ServerCore, answer, trace_refusal};
use super::ordering::Use;
use super::validate::{check_launch, check_strided, regions_overlap};
use crate::backend::{Backend, ResolvedLaunch, StreamWork, StrideLayout};
use crate::command::{CompactionReport, Reservation, StridedCopy};
use crate::error::ServerError;
use crate::failure::{FailureToken, PendingToken};
use crate::ids::{BufferRef, DEFAULT_STREAM, EventId, Region};
use crate::kernel::{Access, KernelLaunch};
use crate::sync::{Reply, reply_channel};

impl<B: Backend> ServerCore<B> {
    pub(super) fn reserve(
        &mut self,
        size: u64,
        policy: AllocationPolicy,
        stream: StreamId,
    ) -> Result<Reservation, ServerError> {
        self.gate(stream)?;
        self.reserve_admitted(size, policy, stream)
    }

    /// A reservation on a stream the caller admitted (the gate, or the
    /// capture's recording stream).
    pub(super) fn reserve_admitted(
        &mut self,
        size: u64,
        policy: AllocationPolicy,
        stream: StreamId,
    ) -> Result<Reservation, ServerError> {
        if size == 0 {
            return Err(ServerError::InvalidArgument {
                message: "a reservation needs at least one byte".to_string(),
            });
        }
        self.inject_reservation_fault(size)?;
        let generation = self.context.generation();
        let id = self.memory.reserve(size, policy, generation, stream)?;
        Ok(Reservation {
            buffer: BufferRef {
                server: self.id,
                id,
                generation,
            },
            size,
        })
    }

    pub(super) fn free(&mut self, buffer: BufferRef) {
        // A handle of an older generation names memory already released.
        if buffer.server != self.id || buffer.generation != self.context.generation() {
            return;
        }
        if let Err(error) = self.memory.free(buffer.id) {
            trace_refusal("free", &error.into());
        }
    }

    pub(super) fn write(
        &mut self,
        stream: StreamId,
        target: Region,
        data: Arc<Vec<u8>>,
    ) -> Result<(), ServerError> {
        self.stats.writes += 1;
        self.stats.bytes_written += data.len() as u64;
        if data.len() as u64 != target.size {
            return Err(ServerError::InvalidArgument {
                message: format!(
                    "{} bytes written to a range of {} bytes",
                    data.len(),
                    target.size
                ),
            });
        }
        let location = self.locate_for(stream, &target)?;
        self.inject_transfer_fault()?;
        let work = StreamWork::Write {
            target: location,
            data,
        };
        self.submit(stream, work, &[(target.buffer.id, Access::Write)])
    }

    pub(super) fn copy(
        &mut self,
        stream: StreamId,
        source: Region,
        target: Region,
    ) -> Result<(), ServerError> {
        if source.size != target.size {
            return Err(ServerError::InvalidArgument {
                message: format!(
                    "copy of {} bytes into a range of {} bytes",
                    source.size, target.size
                ),
            });
        }
        if regions_overlap(&source, &target) {
            return Err(ServerError::InvalidArgument {
                message: "copy source and target overlap".to_string(),
            });
        }
        let from = self.locate_for(stream, &source)?;
        let to = self.locate_for(stream, &target)?;
        let work = StreamWork::Copy {
            source: from,
            target: to,
        };
        let uses = [
            (source.buffer.id, Access::Read),
            (target.buffer.id, Access::Write),
        ];
        self.submit(stream, work, &uses)
    }

    pub(super) fn strided_copy(
        &mut self,
        stream: StreamId,
        copy: Box<StridedCopy>,
    ) -> Result<(), ServerError> {
        self.gate(stream)?;
        let source_size = self.size_of(copy.source)?;
        let target_size = self.size_of(copy.target)?;
        let (source_span, target_span) = check_strided(&copy, source_size, target_size)?;
        let copy = *copy;
        let layout = StrideLayout {
            shape: copy.shape,
            source_strides: copy.source_strides,
            target_strides: copy.target_strides,
            element_size: copy.element_size,
        };
        let source = self.slice(copy.source.id, copy.source_offset, source_span)?;
        let target = self.slice(copy.target.id, copy.target_offset, target_span)?;
        if !self.backend.supports_strides(&layout, source, target) {
            return Err(IoError::UnsupportedStrides {
                backtrace: BackTrace::capture(),
            }
            .into());
        }
        let work = StreamWork::StridedCopy {
            source,
            target,
            layout: Box::new(layout),
        };
        let uses = [
            (copy.source.id, Access::Read),
            (copy.target.id, Access::Write),
        ];
        self.submit(stream, work, &uses)
    }

    /// Launches one kernel, counted in `stats.launches` (the hot path: its
    /// arguments move, no vector of uses). A refusal settles the token and
    /// latches on the stream.
    pub(super) fn launch(
        &mut self,
        stream: StreamId,
        launch: KernelLaunch,
        token: Option<FailureToken>,
    ) {
        self.stats.launches += 1;
        let token = token.map(|token| PendingToken::new(token, self.ordinal));
        if let Err(error) = self.inject_busy_launch() {
            return refuse_as_busy(token, error);
        }
        let bindings = self
            .gate(stream)
            .and_then(|()| self.resolve_bindings(&launch));
        if let (Ok(_), Some(log)) = (&bindings, &mut self.launch_log) {
            log.push(launch.clone());
        }
        let KernelLaunch {
            kernel,
            bindings: bound,
        } = launch;
        let signature = kernel.signature();
        let mut work = match bindings {
            Ok(bindings) => StreamWork::Launch {
                launch: ResolvedLaunch { kernel, bindings },
                token,
            },
            Err(error) => return self.refuse_async(stream, token, error),
        };
        self.inject_launch_faults(&mut work);
        let uses = bound.iter().map(|binding| binding.buffer.id).zip(signature);
        let _ = self.submit_using(stream, work, uses.map(|(id, access)| (id, *access)));
    }

    /// Launches a batch. Nothing is queued unless every call passes; a
    /// refusal settles the token and latches on the stream. The stream
    /// runs it only if none of `requires` failed.
    pub(super) fn launch_batch(
        &mut self,
        stream: StreamId,
        launches: &[KernelLaunch],
        token: Option<FailureToken>,
        requires: Vec<FailureToken>,
    ) {
        self.stats.batches += 1;
        let token = token.map(|token| PendingToken::new(token, self.ordinal));
        if let Err(error) = self.inject_busy_batch() {
            return refuse_as_busy(token, error);
        }
        let mut uses = Vec::new();
        let resolved = self.gate(stream).and_then(|()| {
            launches
                .iter()
                .map(|launch| self.resolve_launch(launch, &mut uses))
                .collect::<Result<Vec<_>, _>>()
        });
        if let (Ok(_), Some(log)) = (&resolved, &mut self.launch_log) {
            log.extend_from_slice(launches);
        }
        let mut work = match resolved {
            Ok(launches) => StreamWork::Batch {
                launches: launches.into(),
                token,
                requires,
            },
            Err(error) => return self.refuse_async(stream, token, error),
        };
        self.inject_launch_faults(&mut work);
        let _ = self.submit(stream, work, &uses);
    }

    pub(super) fn resolve_launch(
        &mut self,
        launch: &KernelLaunch,
        uses: &mut Vec<Use>,
    ) -> Result<ResolvedLaunch, ServerError> {
        let bindings = self.resolve_bindings(launch)?;
        let ids = launch.bindings.iter().map(|binding| binding.buffer.id);
        uses.extend(ids.zip(launch.signature().iter().copied()));
        Ok(ResolvedLaunch {
            kernel: launch.kernel.clone(),
            bindings,
        })
    }

    /// Checks a kernel call and resolves its bindings to memory.
    fn resolve_bindings(
        &mut self,
        launch: &KernelLaunch,
    ) -> Result<Vec<SliceLocation>, ServerError> {
        check_launch(launch, |buffer| self.size_of(buffer))?;
        let mut bindings = Vec::with_capacity(launch.bindings.len());
        for binding in &launch.bindings {
            bindings.push(self.slice(binding.buffer.id, binding.offset, binding.size)?);
        }
        Ok(bindings)
    }

    /// Settles the token of refused asynchronous work and latches the
    /// refusal on its stream, so the owner's next sync sees it too.
    pub(super) fn refuse_async(
        &mut self,
        stream: StreamId,
        token: Option<PendingToken>,
        error: ServerError,
    ) {
        trace_refusal("launch", &error);
        if let Some(token) = token {
            token.fail(error.clone());
        }
        // A context that refuses work answers every sync itself, and a
        // latched transient refusal would outlive the state that caused it.
        if self.context.state().is_active() && self.streams.contains(stream) {
            let error = Box::new(error);
            let _ = self.submit(stream, StreamWork::Fail { error }, &[]);
        }
    }

    pub(super) fn create_stream(&mut self) -> Result<StreamId, ServerError> {
        self.context.admit()?;
        self.backend.create_stream(self.streams.next_id())?;
        Ok(self.streams.add())
    }

    pub(super) fn destroy_stream(&mut self, stream: StreamId) -> Result<(), ServerError> {
        if stream == DEFAULT_STREAM {
            return Err(ServerError::InvalidArgument {
                message: "the default stream cannot be destroyed".to_string(),
            });
        }
        self.check_stream(stream)?;
        // Queued work still runs once the stream is gone: a marker queued
        // last lets a recovery's drain wait for it before the reset (a lost
        // context never recovers, so it needs none).
        let last_marker =
            if self.backend.stream_idle(stream) || self.context.state().is_unrecoverable() {
                None
            } else {
                let (reply, reached) = reply_channel();
                self.queue(stream, StreamWork::Sync { reply })
                    .ok()
                    .map(|_| reached)
            };
        self.backend.destroy_stream(stream);
        self.streams.remove(stream, last_marker);
        Ok(())
    }

    pub(super) fn record_event(&mut self, stream: StreamId) -> Result<EventId, ServerError> {
        self.gate(stream)?;
        let event = self.streams.next_event();
        self.submit(stream, StreamWork::RecordEvent { event }, &[])?;
        Ok(event)
    }

    pub(super) fn wait_event(
        &mut self,
        stream: StreamId,
        event: EventId,
    ) -> Result<(), ServerError> {
        self.gate(stream)?;
        self.submit(stream, StreamWork::WaitEvent { event }, &[])
    }

    /// Reads `source` on `stream`: the executor answers with the bytes.
    pub(super) fn read(&mut self, stream: StreamId, source: Region, reply: Reply<Vec<u8>>) {
        self.stats.reads += 1;
        self.stats.bytes_read += source.size;
        let located = self
            .locate_for(stream, &source)
            .and_then(|location| self.inject_transfer_fault().map(|()| location));
        match located {
            Ok(location) => {
                let work = StreamWork::Read {
                    source: location,
                    reply,
                };
                let _ = self.submit(stream, work, &[(source.buffer.id, Access::Read)]);
            }
            Err(error) => answer(reply, Err(error)),
        }
    }

    /// A sync of `stream`: answered here when the stream is idle, else by
    /// its executor once everything before the marker ran.
    pub(super) fn sync(&mut self, stream: StreamId, reply: Reply<()>) {
        self.stats.syncs += 1;
        match self.gate(stream) {
            Ok(()) if self.backend.stream_idle(stream) => {
                // Nothing in flight, nothing latched: answer here, after
                // taking the completions the stream already sent (a fault
                // among them refuses at the gate).
                self.drain_completions();
                answer(reply, self.gate(stream));
            }
            Ok(()) => {
                let _ = self.submit(stream, StreamWork::Sync { reply }, &[]);
            }
            Err(error) => answer(reply, Err(error)),
        }
    }

    /// A handle's last clone was dropped: free now, or once the graphs
    /// holding the allocation let go.
    pub(super) fn free_command(&mut self, buffer: BufferRef) {
        self.stats.frees += 1;
        if !self.defer_free(buffer) {
            self.free(buffer);
        }
    }

    /// Releases what the manager can without waiting.
    pub(super) fn reclaim(&mut self) -> Result<u64, ServerError> {
        self.context.admit()?;
        Ok(self.memory.reclaim())
    }

    pub(super) fn compact(&mut self) -> Result<CompactionReport, ServerError> {
        self.context.admit()?;
        let plan = self.memory.plan_compaction();
        let mut report = CompactionReport::default();
        for relocation in &plan.moves {
            let copied =
                self.backend
                    .relocate(self.memory.storage(), relocation.from, relocation.to);
            if let Err(error) = copied {
                self.memory.abort_compaction(plan);
                return Err(error);
            }
            report.moved += 1;
            report.bytes += relocation.from.size;
        }
        self.memory.commit_compaction(plan)?;
        Ok(report)
    }
}

/// Refuses launch work as a racing capture refuses it: the token alone,
/// nothing latched.
pub(super) fn refuse_as_busy(token: Option<PendingToken>, error: ServerError) {
    trace_refusal("launch", &error);
    if let Some(token) = token {
        token.fail(error);
    }
}
