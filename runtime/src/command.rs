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
//!
//! A command that names a stream is refused (`InvalidArgument`) when the
//! stream does not exist, and with the context's error unless the context
//! admits work. Work queued on a stream records its use of each allocation
//! it names, so a freed allocation's memory is reused only once those
//! streams ran past it.

use std::sync::Arc;

use cistern_memory::{AllocationPolicy, MemorySnapshot, MemoryStats, StreamId};
use serde::{Deserialize, Serialize};

use crate::context_state::ContextState;
use crate::failure::FailureToken;
use crate::graph::{CaptureId, GraphInfo, GraphRef};
use crate::ids::{BufferRef, EventId, Region};
use crate::kernel::{KernelLaunch, OptimizerStep};
use crate::sync::Reply;

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

/// A new allocation, as `Reserve` answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The allocation, its server and generation.
    pub buffer: BufferRef,
    /// The bytes asked for (the slice behind it may be padded larger).
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
    /// Kernels the device ran to completion, `Empty` runs included.
    pub kernels_run: u64,
    /// Runs of the `Empty` kernel the device counted.
    pub empty_kernel_runs: u64,
    /// `Replay` commands handled (accepted or refused).
    pub replays: u64,
    /// Cross-stream waits queued to order conflicting uses of memory.
    pub ordering_waits: u64,
    /// `Read` commands handled (accepted or refused): each is a caller
    /// waiting for the device.
    pub reads: u64,
    /// `Write` commands handled (accepted or refused).
    pub writes: u64,
    /// Device time of the kernels run, in nanoseconds, from timestamp
    /// queries: `None` where the device has none (the CPU; a wgpu adapter
    /// without `TIMESTAMP_QUERY`).
    pub kernel_device_ns: Option<u64>,
    /// Bytes the `Read` commands asked for (accepted or refused).
    pub bytes_read: u64,
    /// Bytes the `Write` commands carried (accepted or refused).
    pub bytes_written: u64,
}

/// What a `Compact` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionReport {
    /// Allocations moved to another page.
    pub moved: u64,
    /// Bytes copied (the moved slices' sizes).
    pub bytes: u64,
}

/// A request to a device server. See the module docs for who answers what.
#[derive(Debug)]
pub enum Command {
    /// Reserve `size` bytes for use on `stream`.
    Reserve {
        /// At least one (`InvalidArgument` for zero); the slice behind it
        /// may be padded larger.
        size: u64,
        /// Whether pages may be added, or added without memory until first use.
        policy: AllocationPolicy,
        /// Memory freed while only this stream still uses it may be handed
        /// out at once: the stream's own order keeps the old work first.
        stream: StreamId,
        /// The allocation, answered at once; the `OutOfMemory` family may
        /// pass after handles are dropped and `Reclaim` runs.
        reply: Reply<Reservation>,
    },
    /// The last handle to an allocation was dropped; runs on no stream.
    Free {
        /// One of another server or an older generation is ignored (its
        /// memory is gone already); while a graph holds it, the free waits
        /// for the graph's release.
        buffer: BufferRef,
    },
    /// Write `data` to `target`, in order on `stream`.
    Write {
        /// Later work on it sees the bytes.
        stream: StreamId,
        /// `target.size == data.len()`, else `InvalidArgument`.
        target: Region,
        /// The bytes, shared: one host buffer may be written to several
        /// devices, or again after a failed transfer, with no copy (and an
        /// `Arc` is narrow: every command is as wide as the widest).
        data: Arc<Vec<u8>>,
        /// Answered once queued, not once written: a refusal comes here,
        /// a failure while writing is latched for the stream's next `Sync`.
        reply: Reply<()>,
    },
    /// Read `source`, in order on `stream`.
    Read {
        /// The bytes are read once every earlier item on it ran.
        stream: StreamId,
        /// Must lie inside its allocation.
        source: Region,
        /// The bytes, answered by the executor, or the poison if the device
        /// faulted (an error latched on the stream does not fail a read); a
        /// refusal at the server is answered at once.
        reply: Reply<Vec<u8>>,
    },
    /// Copy `source` to `target` (same size, not overlapping, else
    /// `InvalidArgument`), in order on `stream`.
    Copy {
        /// Later work on it sees the copied bytes.
        stream: StreamId,
        /// Read from (boxed, as `target`: two regions would make every
        /// command, launches included, wider).
        source: Box<Region>,
        /// Written.
        target: Box<Region>,
        /// Answered once queued, as a `Write`'s.
        reply: Reply<()>,
    },
    /// A strided copy, in order on `stream`.
    StridedCopy {
        /// Later work on it sees the copied bytes.
        stream: StreamId,
        /// The views (boxed: a rare command should not widen every other).
        copy: Box<StridedCopy>,
        /// Answered once queued, as a `Write`'s; `UnsupportedStrides`, with
        /// nothing queued, when the backend declines the layout.
        reply: Reply<()>,
    },
    /// Run a kernel, in order on `stream`; no answer.
    Launch {
        /// A failure is latched here too, for the stream's next `Sync`.
        stream: StreamId,
        /// Checked against its kernel's contract before anything is queued.
        launch: KernelLaunch,
        /// Settled with the outcome: by the executor once the kernel ran or
        /// failed, at once when the server refused it.
        token: Option<FailureToken>,
    },
    /// Run several kernels as one command: all are checked before any runs,
    /// and a failure stops the rest; no answer.
    LaunchBatch {
        /// A failure is latched here too, for the stream's next `Sync`.
        stream: StreamId,
        /// The kernel calls, in the order they run.
        launches: Vec<KernelLaunch>,
        /// Settled once all ran or with the first failure.
        token: Option<FailureToken>,
        /// Earlier work whose results the batch consumes: if any of it
        /// failed (seen on the stream just before the batch would run),
        /// nothing of the batch runs and `token` fails with that error.
        requires: Vec<FailureToken>,
    },
    /// One fused optimizer step (one kernel), in order on `stream`; checked
    /// as a launch (config and segments first); no answer.
    OptimizerStep {
        /// A failure is latched here too, for the stream's next `Sync`.
        stream: StreamId,
        /// Boxed: wide, and one per training step.
        step: Box<OptimizerStep>,
        /// Settled as a `Launch`'s.
        token: Option<FailureToken>,
    },
    /// Create a stream, independent of the others.
    CreateStream {
        /// The new stream's id (ids are never reused), answered at once.
        reply: Reply<StreamId>,
    },
    /// Destroy a stream; work already queued on it still runs.
    DestroyStream {
        /// Not the default stream (`InvalidArgument`).
        stream: StreamId,
        /// Answered at once, without waiting for the queued work.
        reply: Reply<()>,
    },
    /// Record an event on `stream`.
    RecordEvent {
        /// The event fires when this stream reaches it.
        stream: StreamId,
        /// The event's id, answered once its marker is queued.
        reply: Reply<EventId>,
    },
    /// Make `stream` wait until `event` fires before running later work.
    WaitEvent {
        /// It waits on its executor; the server does not wait.
        stream: StreamId,
        /// Recorded on any stream of this server; one unknown or released
        /// is refused.
        event: EventId,
        /// Answered once the wait is queued.
        reply: Reply<()>,
    },
    /// The last handle to an event was dropped; no answer.
    ReleaseEvent {
        /// Waits already queued on it still see it fire; a later
        /// `WaitEvent` naming it is refused.
        event: EventId,
    },
    /// Report what failed on `stream` since the last sync.
    Sync {
        /// When it is idle with nothing latched, the server answers itself.
        stream: StreamId,
        /// Answered once every earlier item on the stream ran: its latched
        /// error (clearing the latch), else the device's poison, else `Ok`.
        reply: Reply<()>,
    },
    /// The memory manager's counters.
    MemoryStats {
        /// Answered at once, in every context state.
        reply: Reply<MemoryStats>,
    },
    /// Every page and slice.
    MemorySnapshot {
        /// Answered at once, in every context state.
        reply: Reply<MemorySnapshot>,
    },
    /// Release every empty page.
    Reclaim {
        /// The bytes released; refused unless the context admits work.
        reply: Reply<u64>,
    },
    /// Move live slices off sparse pages (the server copies, then commits).
    Compact {
        /// What moved; refused unless the context admits work. A failed copy
        /// aborts the plan: every slice stays where it was.
        reply: Reply<CompactionReport>,
    },
    /// Starts, continues or stops the launch log: every launch the server
    /// queues from now on (sent alone, in a batch, or replayed in a graph)
    /// in order, as sent. A benchmark replays it to time the kernels alone.
    TakeLaunchLog {
        /// Whether to keep logging after this command.
        keep_logging: bool,
        /// The launches queued since the log last started or was taken
        /// (empty when it was off); answered at once.
        reply: Reply<Vec<KernelLaunch>>,
    },
    /// What the server has done.
    ServerStats {
        /// Answered at once; the device's counters are read then, so
        /// kernels still queued are not counted yet.
        reply: Reply<ServerStats>,
    },
    /// Recover a poisoned context: acts only if it is poisoned in
    /// `seen_generation`; otherwise changes nothing.
    Invalidate {
        /// The generation the caller saw poisoned: callers recovering from
        /// one fault recover once, and a late one changes nothing.
        seen_generation: u64,
        /// The state the recovery ends in (`Active` with the next
        /// generation, or `ContextUnrecoverable`), answered when it ends;
        /// callers during a recovery get its outcome; otherwise the state now.
        reply: Reply<ContextState>,
    },
    /// The context's state.
    ContextState {
        /// Answered at once, in every state.
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
        /// The capture's id; `CaptureInProgress` while another capture runs.
        reply: Reply<CaptureId>,
    },
    /// Reserve `size` bytes on the recording stream under `Forbidden`; the
    /// graph owns the allocation (its free waits for the graph's release).
    CaptureReserve {
        /// The capture in progress; one that ended is refused
        /// (`StaleGeneration` if a fault and a recovery ended it).
        capture: CaptureId,
        /// At least one; one that needs a new page is `PageUpdateForbidden`.
        size: u64,
        /// The allocation, answered at once.
        reply: Reply<Reservation>,
    },
    /// Record kernel calls: all are checked before any is recorded; nothing runs.
    CaptureLaunch {
        /// The capture in progress, as for `CaptureReserve`.
        capture: CaptureId,
        /// The kernel calls, in the order a replay runs them.
        launches: Vec<KernelLaunch>,
        /// Answered once recorded; a refused call records none of them.
        reply: Reply<()>,
    },
    /// `Capturing → Active`: the recorded launches become a graph.
    EndCapture {
        /// The capture in progress, as for `CaptureReserve`.
        capture: CaptureId,
        /// The graph; if a fault ended the capture, its error (the
        /// recording is discarded and what it held released).
        reply: Reply<GraphInfo>,
    },
    /// `Capturing → Active`, discarding what was recorded (a dropped
    /// capture guard); no answer.
    AbortCapture {
        /// One that already ended is ignored.
        capture: CaptureId,
    },
    /// Run a graph's launches in order on `stream`, as one batch; no answer.
    Replay {
        /// Any stream, not only the recording one; a failure is latched
        /// here too, for the stream's next `Sync`.
        stream: StreamId,
        /// Of this server and the current generation, not released; else
        /// refused before anything runs.
        graph: GraphRef,
        /// Settled once all ran or with the first failure.
        token: Option<FailureToken>,
    },
    /// The last handle to a graph was dropped: its allocations are released
    /// to their owners (deferred frees happen now); no answer.
    ReleaseGraph {
        /// One of another server or an older generation is ignored.
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
            Command::TakeLaunchLog { .. } => "take_launch_log",
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
