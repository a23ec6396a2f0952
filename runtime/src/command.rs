//! `Command`: what a client asks of a device server, and the values the
//! commands name and answer with.
//!
//! A command that answers carries its own [`Reply`]. Most are answered by
//! the server at once; `Read` and `Sync` are answered by the stream's
//! executor when the stream reaches them, so the server never waits.
//! `Launch`, `LaunchBatch`, `Replay`, `Free`, `ReleaseEvent`, `AbortCapture`
//! and `ReleaseGraph` do not answer: a launch's failure reaches its
//! [`FailureToken`] and stays latched on its stream until a `Sync` there
//! reads it.

use cistern_memory::{AllocationId, AllocationPolicy, MemorySnapshot, MemoryStats, StreamId};
use serde::{Deserialize, Serialize};

use crate::graph::{CaptureId, GraphInfo, GraphRef};
use crate::sync::Reply;
use crate::{ContextState, FailureToken, KernelLaunch, OptimizerStep};

/// Names one server instance in this process, so a handle of one server is
/// refused by another (`DeviceMismatch`) instead of naming a stranger's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServerId(pub u64);

/// Names an allocation of one server in one context generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BufferRef {
    /// The server that made it.
    pub server: ServerId,
    /// The allocation.
    pub id: AllocationId,
    /// The context generation it was made in.
    pub generation: u64,
}

/// A byte range of an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Region {
    /// The allocation.
    pub buffer: BufferRef,
    /// First byte, from the allocation's start.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

/// A copy between two strided views of `element_size`-byte elements.
///
/// Element `(i0, i1, ...)` of `shape` is read at `source_offset + Σ ik *
/// source_strides[k] * element_size` and written at the same expression over
/// the target. Strides are in elements. A backend that cannot do a pattern
/// answers `UnsupportedStrides`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StridedCopy {
    /// The allocation read.
    pub source: BufferRef,
    /// Byte offset of element zero in the source.
    pub source_offset: u64,
    /// Source stride per dimension, in elements.
    pub source_strides: Vec<u64>,
    /// The allocation written.
    pub target: BufferRef,
    /// Byte offset of element zero in the target.
    pub target_offset: u64,
    /// Target stride per dimension, in elements.
    pub target_strides: Vec<u64>,
    /// Elements per dimension.
    pub shape: Vec<u64>,
    /// Bytes per element.
    pub element_size: u64,
}

/// Names an event recorded on a stream; other streams can wait for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EventId(pub u64);

/// A new allocation, as `Reserve` answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The allocation, its server and generation.
    pub buffer: BufferRef,
    /// The bytes asked for.
    pub size: u64,
}

/// What a server has done since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStats {
    /// Commands handled (every kind, frees included; this query included).
    pub commands: u64,
    /// `Launch` commands handled (accepted or refused).
    pub launches: u64,
    /// `LaunchBatch` commands handled.
    pub batches: u64,
    /// `Sync` commands handled.
    pub syncs: u64,
    /// `Free` commands handled.
    pub frees: u64,
    /// Kernels the device ran to completion.
    pub kernels_run: u64,
    /// Runs of the `Empty` kernel the device counted.
    pub empty_kernel_runs: u64,
    /// `Replay` commands handled (accepted or refused).
    pub replays: u64,
    /// Cross-stream waits queued to order conflicting uses of memory.
    pub ordering_waits: u64,
}

/// What a `Compact` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionReport {
    /// Allocations moved.
    pub moved: u64,
    /// Bytes copied.
    pub bytes: u64,
}

/// A request to a device server. See the module docs for who answers what.
#[derive(Debug)]
pub enum Command {
    /// Reserve `size` bytes for use on `stream` (which decides when freed
    /// memory may be reused).
    Reserve {
        /// Bytes.
        size: u64,
        /// Whether pages may be added, or added without memory until first use.
        policy: AllocationPolicy,
        /// The stream that will use it first.
        stream: StreamId,
        /// The answer.
        reply: Reply<Reservation>,
    },
    /// The last handle to an allocation was dropped; runs on no stream.
    Free {
        /// The allocation.
        buffer: BufferRef,
    },
    /// Write `data` to `target`, in order on `stream`. Answered once queued.
    Write {
        /// The stream.
        stream: StreamId,
        /// Where; `target.size == data.len()`.
        target: Region,
        /// The bytes (a boxed slice: narrower than a `Vec`, and every
        /// command is as wide as the widest).
        data: Box<[u8]>,
        /// The answer.
        reply: Reply<()>,
    },
    /// Read `source`, in order on `stream`; answered by the executor.
    Read {
        /// The stream.
        stream: StreamId,
        /// What.
        source: Region,
        /// The bytes, or the stream's failure.
        reply: Reply<Vec<u8>>,
    },
    /// Copy `source` to `target` (same size, not overlapping), in order on `stream`.
    Copy {
        /// The stream.
        stream: StreamId,
        /// Read from (boxed, as `target`: two regions would make every
        /// command, launches included, wider).
        source: Box<Region>,
        /// Written.
        target: Box<Region>,
        /// The answer, once queued.
        reply: Reply<()>,
    },
    /// A strided copy, in order on `stream`.
    StridedCopy {
        /// The stream.
        stream: StreamId,
        /// The views (boxed: a rare command should not widen every other).
        copy: Box<StridedCopy>,
        /// The answer, once queued (`UnsupportedStrides` when the backend declines).
        reply: Reply<()>,
    },
    /// Run a kernel, in order on `stream`; no answer.
    Launch {
        /// The stream.
        stream: StreamId,
        /// The kernel call.
        launch: KernelLaunch,
        /// Settled when the kernel ran or failed.
        token: Option<FailureToken>,
    },
    /// Run several kernels as one command: all are checked before any runs,
    /// and a failure stops the rest; no answer.
    LaunchBatch {
        /// The stream.
        stream: StreamId,
        /// The kernel calls, in order.
        launches: Vec<KernelLaunch>,
        /// Settled when all ran or one failed.
        token: Option<FailureToken>,
    },
    /// One fused optimizer step (one kernel), in order on `stream`; checked
    /// as a launch (config and segments first); no answer.
    OptimizerStep {
        /// The stream.
        stream: StreamId,
        /// The step (boxed: wide, and one per training step).
        step: Box<OptimizerStep>,
        /// Settled when the step ran or failed.
        token: Option<FailureToken>,
    },
    /// Create a stream, independent of the others.
    CreateStream {
        /// Its id.
        reply: Reply<StreamId>,
    },
    /// Destroy a stream once its queued work has run.
    DestroyStream {
        /// The stream (not the default stream).
        stream: StreamId,
        /// The answer.
        reply: Reply<()>,
    },
    /// Record an event on `stream`: it fires when the stream reaches it.
    RecordEvent {
        /// The stream.
        stream: StreamId,
        /// The event's id.
        reply: Reply<EventId>,
    },
    /// Make `stream` wait until `event` fires before running later work.
    WaitEvent {
        /// The waiting stream.
        stream: StreamId,
        /// The event.
        event: EventId,
        /// The answer, once queued.
        reply: Reply<()>,
    },
    /// The last handle to an event was dropped; no answer.
    ReleaseEvent {
        /// The event.
        event: EventId,
    },
    /// Answered by `stream`'s executor once all earlier work on it ran,
    /// with its latched error if any (which clears the latch).
    Sync {
        /// The stream.
        stream: StreamId,
        /// The answer.
        reply: Reply<()>,
    },
    /// The memory manager's counters.
    MemoryStats {
        /// The answer.
        reply: Reply<MemoryStats>,
    },
    /// Every page and slice.
    MemorySnapshot {
        /// The answer.
        reply: Reply<MemorySnapshot>,
    },
    /// Release every empty page; answers the bytes released.
    Reclaim {
        /// The answer.
        reply: Reply<u64>,
    },
    /// Move live slices off sparse pages (the server copies, then commits).
    Compact {
        /// The answer.
        reply: Reply<CompactionReport>,
    },
    /// What the server has done.
    ServerStats {
        /// The answer.
        reply: Reply<ServerStats>,
    },
    /// Recover a poisoned context: acts only if it is poisoned in
    /// `seen_generation`, and answers the state it ends in (`Active` with
    /// the next generation, or `ContextUnrecoverable`); otherwise answers
    /// the state now. Callers during a recovery get its outcome.
    Invalidate {
        /// The generation the caller saw poisoned.
        seen_generation: u64,
        /// The answer.
        reply: Reply<ContextState>,
    },
    /// The context's state (answered in every state).
    ContextState {
        /// The answer.
        reply: Reply<ContextState>,
    },
    /// Stop the server; later calls answer `ServerGone`.
    Shutdown {
        /// Answered before the server stops, if given.
        reply: Option<Reply<()>>,
    },
    /// `Active → Capturing`: later launches through the answered capture
    /// are recorded for `stream`, not run; every other entry point answers
    /// `CaptureInProgress` until the capture ends.
    BeginCapture {
        /// The recording stream (its reservations use `Forbidden`).
        stream: StreamId,
        /// The capture's id.
        reply: Reply<CaptureId>,
    },
    /// Reserve `size` bytes on the recording stream under `Forbidden`; the
    /// graph owns the allocation (its free waits for the graph's release).
    CaptureReserve {
        /// The capture.
        capture: CaptureId,
        /// Bytes.
        size: u64,
        /// The answer.
        reply: Reply<Reservation>,
    },
    /// Record kernel calls: all are checked before any is recorded; nothing runs.
    CaptureLaunch {
        /// The capture.
        capture: CaptureId,
        /// The kernel calls, in order.
        launches: Vec<KernelLaunch>,
        /// The answer, once recorded.
        reply: Reply<()>,
    },
    /// `Capturing → Active`: the recorded launches become a graph.
    EndCapture {
        /// The capture.
        capture: CaptureId,
        /// The graph.
        reply: Reply<GraphInfo>,
    },
    /// `Capturing → Active`, discarding what was recorded (a dropped
    /// capture guard); no answer.
    AbortCapture {
        /// The capture.
        capture: CaptureId,
    },
    /// Run a graph's launches in order on `stream`, as one batch; no answer.
    Replay {
        /// The stream.
        stream: StreamId,
        /// The graph.
        graph: GraphRef,
        /// Settled when all ran or one failed.
        token: Option<FailureToken>,
    },
    /// The last handle to a graph was dropped: its allocations are released
    /// to their owners (deferred frees happen now); no answer.
    ReleaseGraph {
        /// The graph.
        graph: GraphRef,
    },
}

impl Command {
    /// The command's kind, as traces name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::Reserve { .. } => "reserve",
            Command::Free { .. } => "free",
            Command::Write { .. } => "write",
            Command::Read { .. } => "read",
            Command::Copy { .. } => "copy",
            Command::StridedCopy { .. } => "strided_copy",
            Command::Launch { .. } => "launch",
            Command::LaunchBatch { .. } => "launch_batch",
            Command::OptimizerStep { .. } => "optimizer_step",
            Command::CreateStream { .. } => "create_stream",
            Command::DestroyStream { .. } => "destroy_stream",
            Command::RecordEvent { .. } => "record_event",
            Command::WaitEvent { .. } => "wait_event",
            Command::ReleaseEvent { .. } => "release_event",
            Command::Sync { .. } => "sync",
            Command::MemoryStats { .. } => "memory_stats",
            Command::MemorySnapshot { .. } => "memory_snapshot",
            Command::Reclaim { .. } => "reclaim",
            Command::Compact { .. } => "compact",
            Command::ServerStats { .. } => "server_stats",
            Command::Invalidate { .. } => "invalidate",
            Command::ContextState { .. } => "context_state",
            Command::Shutdown { .. } => "shutdown",
            Command::BeginCapture { .. } => "begin_capture",
            Command::CaptureReserve { .. } => "capture_reserve",
            Command::CaptureLaunch { .. } => "capture_launch",
            Command::EndCapture { .. } => "end_capture",
            Command::AbortCapture { .. } => "abort_capture",
            Command::Replay { .. } => "replay",
            Command::ReleaseGraph { .. } => "release_graph",
        }
    }

    /// The stream the command runs on, if it runs on one.
    pub fn stream(&self) -> Option<StreamId> {
        match self {
            Command::Reserve { stream, .. }
            | Command::Write { stream, .. }
            | Command::Read { stream, .. }
            | Command::Copy { stream, .. }
            | Command::StridedCopy { stream, .. }
            | Command::Launch { stream, .. }
            | Command::LaunchBatch { stream, .. }
            | Command::OptimizerStep { stream, .. }
            | Command::DestroyStream { stream, .. }
            | Command::RecordEvent { stream, .. }
            | Command::WaitEvent { stream, .. }
            | Command::Sync { stream, .. }
            | Command::BeginCapture { stream, .. }
            | Command::Replay { stream, .. } => Some(*stream),
            _ => None,
        }
    }
}
