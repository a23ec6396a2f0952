//! Graph capture and replay, as the server carries them out: recording
//! launches instead of running them, turning the recording into a graph,
//! replaying it as one batch, and releasing what a graph held.
//!
//! Launches are checked and resolved to memory when recorded, so a replay
//! only hands the graph's shared list to the backend as one batch (the
//! backend resolves it to its own form once per graph): that is what makes
//! it cheaper than the launches sent one by one. The resolved locations stay
//! valid because every allocation a graph holds is pinned (see `graphs.rs`).

use cistern_memory::{AllocationPolicy, StreamId};

use super::commands::refuse_as_busy;
use super::core::{ServerCore, trace_refusal};
use super::graphs::Released;
use crate::backend::{Backend, StreamWork};
use crate::command::Reservation;
use crate::error::ServerError;
use crate::failure::{FailureToken, PendingToken};
use crate::graph::{CaptureId, GraphInfo, GraphRef};
use crate::ids::BufferRef;
use crate::kernel::{Access, KernelLaunch};

impl<B: Backend> ServerCore<B> {
    /// `Active → Capturing` on `stream`. Refused unless the context is
    /// active (a capture in progress is `CaptureInProgress`: no nesting).
    pub(super) fn begin_capture(&mut self, stream: StreamId) -> Result<CaptureId, ServerError> {
        self.gate(stream)?;
        self.graphs.renew(self.context.generation());
        if !self.context.begin_capture(stream) {
            self.context.admit()?;
        }
        Ok(self.graphs.start(stream))
    }

    /// A reservation on the recording stream, under `Forbidden`, held by the capture.
    pub(super) fn capture_reserve(
        &mut self,
        capture: CaptureId,
        size: u64,
    ) -> Result<Reservation, ServerError> {
        let stream = self.recording_stream(capture)?;
        let reservation = self.reserve_admitted(size, AllocationPolicy::Forbidden, stream)?;
        // Fresh memory: what the graph does with it is recorded as it launches.
        self.hold(reservation.buffer.id, Access::Read);
        Ok(reservation)
    }

    /// Checks and records `launches`: all or none; nothing runs.
    pub(super) fn capture_launch(
        &mut self,
        capture: CaptureId,
        launches: &[KernelLaunch],
    ) -> Result<(), ServerError> {
        self.recording_stream(capture)?;
        let mut uses = Vec::new();
        let resolved = launches
            .iter()
            .map(|launch| self.resolve_launch(launch, &mut uses))
            .collect::<Result<Vec<_>, _>>()?;
        for (id, access) in uses {
            self.hold(id, access);
        }
        self.graphs.record(resolved, launches);
        Ok(())
    }

    /// `Capturing → Active`: the recording becomes a graph.
    pub(super) fn end_capture(&mut self, capture: CaptureId) -> Result<GraphInfo, ServerError> {
        if let Err(error) = self.recording_stream(capture) {
            // A fault discarded the capture: nothing will replay it.
            if let Some(recording) = self.graphs.finish(capture) {
                let released = self.graphs.discard(recording);
                self.apply(released);
            }
            return Err(error);
        }
        let Some(recording) = self.graphs.finish(capture) else {
            return Err(ended(capture));
        };
        self.context.end_capture();
        let generation = self.context.generation();
        let (id, graph) = self.graphs.insert(recording);
        Ok(GraphInfo {
            graph: GraphRef {
                server: self.id,
                id,
                generation,
            },
            launches: graph.launches.len() as u64,
            allocations: graph.allocations.len() as u64,
        })
    }

    /// A capture guard was dropped: discards the recording and, if the
    /// capture still runs, `Capturing → Active`. Ignores a capture that ended.
    pub(super) fn abort_capture(&mut self, capture: CaptureId) {
        self.graphs.renew(self.context.generation());
        if let Some(recording) = self.graphs.finish(capture) {
            self.context.end_capture();
            let released = self.graphs.discard(recording);
            self.apply(released);
            tracing::debug!(
                device = self.ordinal,
                capture = capture.0,
                "capture discarded"
            );
        }
    }

    /// Queues a graph's launches on `stream` as one batch: the graph's own
    /// shared list, not a copy, so the backend's resolved form of it is
    /// reused. A refusal settles the token and latches on the stream, as a
    /// launch's does; a stale or released graph is refused before anything runs.
    pub(super) fn replay(
        &mut self,
        stream: StreamId,
        graph: GraphRef,
        token: Option<FailureToken>,
    ) {
        self.stats.replays += 1;
        let token = token.map(|token| PendingToken::new(token, self.ordinal));
        if let Err(error) = self.inject_busy_replay() {
            return refuse_as_busy(token, error);
        }
        let found = self
            .gate(stream)
            .and_then(|()| self.check_graph(graph))
            .and_then(|()| {
                self.graphs
                    .get(graph.id)
                    .map(|found| {
                        if let Some(log) = &mut self.launch_log {
                            log.extend_from_slice(&found.sources);
                        }
                        (found.launches.clone(), found.allocations.clone())
                    })
                    .ok_or_else(|| ServerError::InvalidArgument {
                        message: format!("graph {} was released", graph.id),
                    })
            });
        let (launches, uses) = match found {
            Ok(found) => found,
            Err(error) => return self.refuse_async(stream, token, error),
        };
        if launches.is_empty() {
            if let Some(token) = token {
                token.succeed();
            }
            return;
        }
        let mut work = StreamWork::Batch {
            launches,
            token,
            requires: Vec::new(),
        };
        self.inject_launch_faults(&mut work);
        let _ = self.submit(stream, work, &uses);
    }

    /// The last handle to a graph was dropped: its holds end, and the frees
    /// that waited on them happen now.
    pub(super) fn release_graph(&mut self, graph: GraphRef) {
        self.graphs.renew(self.context.generation());
        if graph.server == self.id && graph.generation == self.graphs.generation() {
            let released = self.graphs.remove(graph.id);
            self.apply(released);
        }
    }

    /// A free of `buffer` waits while a graph or the capture holds it: true
    /// when deferred.
    pub(super) fn defer_free(&mut self, buffer: BufferRef) -> bool {
        buffer.server == self.id
            && buffer.generation == self.context.generation()
            && buffer.generation == self.graphs.generation()
            && self.graphs.defer_free(buffer.id)
    }

    /// The recording stream of `capture`, or why commands through it are
    /// refused: the context's refusal, `StaleGeneration` for a capture a
    /// fault and a recovery ended, `InvalidArgument` for one that ended.
    fn recording_stream(&self, capture: CaptureId) -> Result<StreamId, ServerError> {
        match self.graphs.recording_stream(capture) {
            Some(stream) if self.context.state().is_capturing() => Ok(stream),
            _ => {
                self.context.admit()?;
                self.check_generation(self.graphs.capture_generation(capture))?;
                Err(ended(capture))
            }
        }
    }

    /// A graph of this server, of the current generation.
    fn check_graph(&self, graph: GraphRef) -> Result<(), ServerError> {
        self.check_handle(graph.server, graph.generation, "a graph")
    }

    /// The capture in progress holds `id`: pinned from its first holder on.
    fn hold(&mut self, id: cistern_memory::AllocationId, access: Access) {
        if self.graphs.hold_in_recording(id, access) {
            // Checked to exist by the caller in this same command.
            let pinned = self.memory.set_pinned(id, true);
            debug_assert!(pinned.is_ok(), "a checked allocation is pinned");
        }
    }

    fn apply(&mut self, released: Released) {
        for id in released.unpin {
            let _ = self.memory.set_pinned(id, false);
        }
        for id in released.free {
            if let Err(error) = self.memory.free(id) {
                trace_refusal("deferred free", &error.into());
            }
        }
    }
}

fn ended(capture: CaptureId) -> ServerError {
    ServerError::InvalidArgument {
        message: format!("capture {} has ended", capture.0),
    }
}
