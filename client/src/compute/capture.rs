//! Graph capture through a client: record a training step's launches once,
//! replay them with one command.
//!
//! ```text
//! let (token, guard) = client.begin_capture(stream)?;   // device: Capturing
//! token.launch(...)?;                                   // recorded, not run
//! let graph = client.end_capture(guard)?;               // device: Active
//! client.replay(stream, &graph)?;                      // runs them, any number of times
//! ```
//!
//! While a capture records, every other call on the device (any client,
//! any stream) gets the transient `CaptureInProgress`. Calls that would
//! wait on the device through the token (sync, read, write) are refused
//! with `UnsupportedOperation` and never reach the server: a recorded graph
//! cannot contain a host round trip. Sync after `end_capture` instead.

use std::sync::Arc;

use cistern_runtime::{
    CaptureId, Command, FailureToken, GraphInfo, GraphRef, KernelLaunch, ServerError, StreamId,
};

use super::client::ClientShared;
use super::{Buffer, ComputeClient};

/// Records launches into the capture in progress. Cheap to clone; clones
/// record into the same capture. Useless once the capture ends (its calls
/// are then refused with `InvalidArgument`, or `StaleGeneration` when a
/// fault and another client's recovery ended it).
#[derive(Clone, Debug)]
pub struct CaptureToken {
    id: CaptureId,
    stream: StreamId,
    owner: Arc<ClientShared>,
}

/// Owns the capture in progress: [`ComputeClient::end_capture`] turns it
/// into a [`Graph`]; dropping it (a panic included) discards what was
/// recorded and makes the device `Active` again.
#[derive(Debug)]
pub struct CaptureGuard {
    id: CaptureId,
    owner: Arc<ClientShared>,
    /// Whether `end_capture` took over (so the drop sends nothing).
    ended: bool,
}

/// A recorded list of launches, replayed with [`ComputeClient::replay`].
///
/// Cheap to clone. It keeps every allocation its launches use, and those
/// made during its capture, alive and in place; when the last clone drops,
/// the device releases them (frees of dropped buffers happen then).
#[derive(Clone, Debug)]
pub struct Graph {
    inner: Arc<GraphInner>,
}

#[derive(Debug)]
struct GraphInner {
    info: GraphInfo,
    owner: Arc<ClientShared>,
}

impl Drop for GraphInner {
    fn drop(&mut self) {
        // A gone server has nothing left to release.
        let _ = self.owner.server.send(Command::ReleaseGraph {
            graph: self.info.graph,
        });
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self
                .owner
                .server
                .send(Command::AbortCapture { capture: self.id });
        }
    }
}

impl ComputeClient {
    /// Starts recording launches for `stream`: the device becomes
    /// `Capturing`. Refused unless the device is `Active`; a capture in
    /// progress (this client's or another's) is `CaptureInProgress`.
    pub fn begin_capture(
        &self,
        stream: StreamId,
    ) -> Result<(CaptureToken, CaptureGuard), ServerError> {
        let owner = self.shared().clone();
        let id = owner
            .server
            .call(|reply| Command::BeginCapture { stream, reply })?;
        let token = CaptureToken {
            id,
            stream,
            owner: owner.clone(),
        };
        let guard = CaptureGuard {
            id,
            owner,
            ended: false,
        };
        Ok((token, guard))
    }

    /// Ends the capture: the device is `Active` again and the recorded
    /// launches are a [`Graph`]. If a fault poisoned the device meanwhile,
    /// the recording is discarded and the poison is returned.
    pub fn end_capture(&self, mut guard: CaptureGuard) -> Result<Graph, ServerError> {
        if !Arc::ptr_eq(&guard.owner, self.shared()) {
            return Err(self.mismatch("a capture"));
        }
        guard.ended = true;
        let capture = guard.id;
        let info = self
            .server()
            .call(|reply| Command::EndCapture { capture, reply })?;
        Ok(Graph {
            inner: Arc::new(GraphInner {
                info,
                owner: guard.owner.clone(),
            }),
        })
    }

    /// Runs `graph`'s launches in order on `stream` as one command, and
    /// returns before they run. A failure stops the rest and is latched on
    /// the stream, as a batch's is: the stream's next sync returns it. A
    /// graph of an older generation is `StaleGeneration`: capture it again.
    pub fn replay(&self, stream: StreamId, graph: &Graph) -> Result<(), ServerError> {
        self.send_replay(stream, graph, None)
    }

    /// [`replay`](Self::replay), with a token that settles when all the
    /// launches ran or one failed.
    pub fn replay_tracked(
        &self,
        stream: StreamId,
        graph: &Graph,
    ) -> Result<FailureToken, ServerError> {
        let token = FailureToken::new();
        self.send_replay(stream, graph, Some(token.clone()))?;
        Ok(token)
    }

    fn send_replay(
        &self,
        stream: StreamId,
        graph: &Graph,
        token: Option<FailureToken>,
    ) -> Result<(), ServerError> {
        if !Arc::ptr_eq(&graph.inner.owner, self.shared()) {
            return Err(self.mismatch("a graph"));
        }
        self.server().send(Command::Replay {
            stream,
            graph: graph.inner.info.graph,
            token,
        })
    }
}

impl CaptureToken {
    /// The capture's id.
    pub fn id(&self) -> CaptureId {
        self.id
    }

    /// The recording stream.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Reserves `size` bytes on the recording stream without adding pages
    /// (`Forbidden`): `PageUpdateForbidden` when the pools were not warmed
    /// (reserve and drop the step's buffers once before capturing). The
    /// graph owns the allocation: dropping the buffer frees it only once
    /// the graph is released.
    pub fn reserve(&self, size: u64) -> Result<Buffer, ServerError> {
        let capture = self.id;
        let reservation = self.owner.server.call(|reply| Command::CaptureReserve {
            capture,
            size,
            reply,
        })?;
        Ok(Buffer::new(
            reservation.buffer,
            reservation.size,
            self.owner.clone(),
        ))
    }

    /// Records one launch (checked now, run on replay).
    pub fn launch(&self, launch: KernelLaunch) -> Result<(), ServerError> {
        self.launch_batch(vec![launch])
    }

    /// Records launches in order: all are checked before any is recorded.
    pub fn launch_batch(&self, launches: Vec<KernelLaunch>) -> Result<(), ServerError> {
        let capture = self.id;
        self.owner.server.call(|reply| Command::CaptureLaunch {
            capture,
            launches,
            reply,
        })
    }

    /// Refused while capturing (`UnsupportedOperation`), without touching
    /// the device: sync after [`ComputeClient::end_capture`].
    pub fn sync(&self) -> Result<(), ServerError> {
        Err(refused("sync"))
    }

    /// Refused while capturing (`UnsupportedOperation`), without touching the device.
    pub fn read(&self, buffer: &Buffer, offset: u64, size: u64) -> Result<Vec<u8>, ServerError> {
        let _ = (buffer, offset, size);
        Err(refused("read"))
    }

    /// Refused while capturing (`UnsupportedOperation`), without touching
    /// the device: write inputs before the capture or between replays.
    pub fn write(&self, buffer: &Buffer, offset: u64, bytes: &[u8]) -> Result<(), ServerError> {
        let _ = (buffer, offset, bytes);
        Err(refused("write"))
    }
}

impl CaptureGuard {
    /// The capture's id.
    pub fn id(&self) -> CaptureId {
        self.id
    }
}

impl Graph {
    /// The graph's name on its server (server, id, generation).
    pub fn reference(&self) -> GraphRef {
        self.inner.info.graph
    }

    /// Kernel launches one replay runs.
    pub fn launches(&self) -> u64 {
        self.inner.info.launches
    }

    /// Allocations the graph holds.
    pub fn allocations(&self) -> u64 {
        self.inner.info.allocations
    }
}

fn refused(call: &str) -> ServerError {
    ServerError::UnsupportedOperation {
        operation: format!("{call} through a capture token while capturing"),
    }
}
