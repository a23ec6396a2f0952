//! The names of graph capture: a capture in progress, a captured graph, and
//! what ending a capture answers. The machinery is in `server/capture.rs`.
//!
//! A graph is a list of kernel launches recorded on one stream once and
//! replayed with one command, on any stream, any number of times (CUDA-graph
//! capture, on every backend). See `docs/state-machine.md`, "Capturing".

use serde::{Deserialize, Serialize};

use crate::ids::ServerId;

/// Names one capture of one server, from `BeginCapture` until it ends or
/// is discarded. Commands naming a capture that ended are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CaptureId(pub u64);

/// Names a captured graph of one server in one context generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GraphRef {
    /// The server that recorded it.
    pub server: ServerId,
    /// The graph, unique in its server (never reused).
    pub id: u64,
    /// The context generation it was recorded in; a replay in a later one
    /// is refused as stale.
    pub generation: u64,
}

/// A graph, as `EndCapture` answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphInfo {
    /// The handle `Replay` and `ReleaseGraph` name it by.
    pub graph: GraphRef,
    /// Kernel launches it runs per replay.
    pub launches: u64,
    /// Allocations it holds (used by its launches or made during capture).
    pub allocations: u64,
}
