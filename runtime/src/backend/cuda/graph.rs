//! A recorded graph's batch as a CUDA graph: on its first replay the stream
//! captures the batch (the same launches an ordinary batch issues) and
//! instantiates it; every later replay is one graph launch. Whatever cannot
//! be captured runs as ordinary launches. The decisions are written over two
//! small traits ([`GraphContext`], [`GraphStream`]) so a fake drives them in
//! tests; `device.rs` supplies the driver's side.
//!
//! The cache lives in the list's resolved form, so it goes with the list.
//! A graph is tagged with the context epoch it was made in: one from before
//! a reset died with the old context, and its handles are never touched.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::DriverError;
use cudarc::driver::sys::{CUgraph, CUgraphExec};

use super::context::CudaContext;
use super::ffi;
use super::launch::CudaSlice;
use super::status::{FaultClass, classify, code, fault};
use crate::backend::stream::{BoundLaunch, LaunchError};
use crate::backend::{Launches, ResolvedLaunch};
use crate::error::ServerError;
use crate::kernel::Kernel;
use crate::sync::Mutex;
use cistern_optim::OptimizerConfig;

/// Captures a list may have refused operation-locally before it runs as
/// ordinary launches for good.
const CAPTURE_ATTEMPTS: u32 = 3;

/// A batch's launches bound to device memory, shared by every replay of
/// its list, with the list's CUDA graph where it is a capturable graph's.
#[derive(Clone, Debug)]
pub(super) struct CudaBatch(Arc<Prepared>);

#[derive(Debug)]
struct Prepared {
    launches: Arc<[BoundLaunch<CudaSlice>]>,
    graph: Option<GraphCache<CudaContext>>,
}

impl CudaBatch {
    /// The resolved form of `launches`, made by `bind` on first use and
    /// kept beside the list; a recorded graph's capturable list gets a
    /// graph cache in `context`.
    pub(super) fn of(
        launches: &Launches,
        context: &Arc<CudaContext>,
        bind: impl FnOnce(&[ResolvedLaunch]) -> Result<Arc<[BoundLaunch<CudaSlice>]>, ServerError>,
    ) -> Result<CudaBatch, ServerError> {
        launches
            .prepared(|list| {
                let bound = bind(list)?;
                let graph = wants_graph(launches.is_recorded(), &bound)
                    .then(|| GraphCache::new(context.clone()));
                Ok(Arc::new(Prepared {
                    launches: bound,
                    graph,
                }))
            })
            .map(CudaBatch)
    }

    /// The list's graph cache, if it is run as a CUDA graph.
    pub(super) fn graph(&self) -> Option<&GraphCache<CudaContext>> {
        self.0.graph.as_ref()
    }
}

impl AsRef<[BoundLaunch<CudaSlice>]> for CudaBatch {
    fn as_ref(&self) -> &[BoundLaunch<CudaSlice>] {
        &self.0.launches
    }
}

/// Whether a batch runs as a CUDA graph: a recorded graph's own list
/// (replayed unchanged, so a capture is worth its cost) whose every launch
/// issues the same CUDA work each time.
fn wants_graph(recorded: bool, launches: &[BoundLaunch<CudaSlice>]) -> bool {
    recorded && !launches.is_empty() && launches.iter().all(|l| capturable(&l.kernel))
}

/// Whether `kernel`'s CUDA work is fixed by its arguments and bindings, so
/// one capture records what every replay would issue. LAMB reads its
/// per-segment norms (and a counted LAMB its flag) back between passes: a
/// host decision mid-batch, never captured.
fn capturable(kernel: &Kernel) -> bool {
    match kernel {
        Kernel::OptimizerStep(args) | Kernel::OptimizerStepCounted(args) => {
            !matches!(args.config, OptimizerConfig::Lamb(_))
        }
        Kernel::Map { .. }
        | Kernel::Copy
        | Kernel::Identity
        | Kernel::Empty
        | Kernel::Trap
        | Kernel::ActivationForward { .. }
        | Kernel::ActivationBackward { .. }
        | Kernel::Gemm { .. }
        | Kernel::ColumnSum { .. }
        | Kernel::MseLoss
        | Kernel::SegmentSum { .. }
        | Kernel::SegmentSumSquares { .. }
        | Kernel::AmpUnscale { .. }
        | Kernel::AmpUnscaleByDeviceScale
        | Kernel::AmpUpdateScale { .. }
        | Kernel::Softmax { .. }
        | Kernel::SoftmaxBackward { .. }
        | Kernel::ClassLoss(_)
        | Kernel::ClassLossBackward(_)
        | Kernel::BroadcastBinary(_)
        | Kernel::StridedSum(_)
        | Kernel::LayerNorm(_)
        | Kernel::LayerNormBackward(_)
        | Kernel::Embedding(_)
        | Kernel::EmbeddingBackward(_)
        | Kernel::Dropout(_)
        | Kernel::BatchGather(_)
        | Kernel::BatchedGemm(_)
        | Kernel::MaxDim(_)
        | Kernel::MaxDimBackward(_)
        | Kernel::Attention(_)
        | Kernel::AttentionBackwardQueries(_)
        | Kernel::AttentionBackwardKeys(_)
        | Kernel::DropoutCounted(_) => true,
    }
}

/// The context's side of a graph: its epoch, and destroying what it made.
pub(super) trait GraphContext: Send + Sync + 'static {
    /// How many resets the context has been through.
    fn epoch(&self) -> u64;

    /// Destroys `exec` (unless null), then `graph`, both made in the
    /// current epoch. Runs in destructors: never panics, ignores errors.
    fn destroy(&self, graph: CUgraph, exec: CUgraphExec);
}

impl GraphContext for CudaContext {
    fn epoch(&self) -> u64 {
        CudaContext::epoch(self)
    }

    fn destroy(&self, graph: CUgraph, exec: CUgraphExec) {
        if self.bind().is_err() {
            return;
        }
        if !exec.is_null() {
            let _ = ffi::graph_exec_destroy(exec);
        }
        let _ = ffi::graph_destroy(graph);
    }
}

/// One stream's side: capturing a batch and launching a graph on it.
pub(super) trait GraphStream {
    /// Starts capturing the stream's work.
    fn begin_capture(&mut self) -> Result<(), DriverError>;

    /// Issues `launches` exactly as an ordinary batch would (into the
    /// capture), stopping at the first failure with its index.
    fn issue(&mut self, launches: &[BoundLaunch<CudaSlice>]) -> Result<(), (usize, LaunchError)>;

    /// Ends the capture: the graph, or null where it was invalidated.
    fn end_capture(&mut self) -> Result<CUgraph, DriverError>;

    /// After a failed capture: makes sure no later work is issued on a
    /// stream still in capture mode (replacing the stream if it is).
    fn leave_capture(&mut self);

    /// The executable form of a captured graph.
    fn instantiate(&mut self, graph: CUgraph) -> Result<CUgraphExec, DriverError>;

    /// Queues an executable graph on the stream.
    fn launch(&mut self, exec: CUgraphExec) -> Result<(), DriverError>;
}

/// A list's CUDA graph, as far as it got. Every stream replaying the list
/// shares it and they take turns: graph handles are not synchronized.
pub(super) struct GraphCache<C: GraphContext> {
    context: Arc<C>,
    state: Mutex<GraphState>,
}

enum GraphState {
    /// Not captured yet; `refusals` captures were refused so far.
    Pending { refusals: u32 },
    /// Captured and instantiated in the context's epoch `epoch`.
    Ready {
        epoch: u64,
        graph: CUgraph,
        exec: CUgraphExec,
    },
    /// Runs as ordinary launches from now on.
    Ordinary,
}

// SAFETY: the handles are used only under the cache's lock, with the
// context bound on the using thread, and destroyed at most once.
unsafe impl Send for GraphState {}

impl<C: GraphContext> GraphCache<C> {
    /// A cache with nothing captured yet, in `context`.
    pub(super) fn new(context: Arc<C>) -> Self {
        GraphCache {
            context,
            state: Mutex::new(GraphState::Pending { refusals: 0 }),
        }
    }
}

impl<C: GraphContext> Drop for GraphCache<C> {
    fn drop(&mut self) {
        // Dropped on the server thread, which also resets, or on an executor
        // before it answers the drain marker a reset waits for: the epoch
        // cannot change between the check and the destroy.
        let state = std::mem::replace(&mut *self.state.lock(), GraphState::Ordinary);
        if let GraphState::Ready { epoch, graph, exec } = state
            && epoch == self.context.epoch()
        {
            self.context.destroy(graph, exec);
        }
        // A graph of an older epoch died with its context: left alone.
    }
}

impl<C: GraphContext> fmt::Debug for GraphCache<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the lock: a stream may be capturing under it.
        f.write_str("GraphCache { .. }")
    }
}

/// What a graph replay came to.
#[derive(Debug)]
pub(super) enum Replay {
    /// The graph is queued: synchronize the stream and count the batch.
    Launched,
    /// Run the batch as ordinary launches.
    Ordinary,
    /// A sticky driver error before any of the batch ran.
    Fault(LaunchError),
}

/// Replays `launches` (the cache's list) on `stream`: launches the list's
/// graph, capturing it first if it has none yet.
pub(super) fn replay<C: GraphContext>(
    cache: &GraphCache<C>,
    stream: &mut impl GraphStream,
    launches: &[BoundLaunch<CudaSlice>],
) -> Replay {
    let mut state = cache.state.lock();
    let epoch = cache.context.epoch();
    if matches!(*state, GraphState::Ready { epoch: made, .. } if made != epoch) {
        // Made before a reset, which destroyed it: forget it, capture afresh.
        *state = GraphState::Pending { refusals: 0 };
    }
    if let GraphState::Pending { refusals } = *state {
        match capture(stream, &*cache.context, launches) {
            Ok((graph, exec)) => *state = GraphState::Ready { epoch, graph, exec },
            Err(Failure::Launch) => {
                // Refused or faulted at issue: the ordinary run answers it
                // exactly, and would again on every replay.
                *state = GraphState::Ordinary;
                return Replay::Ordinary;
            }
            Err(Failure::Refused) => {
                let refusals = refusals + 1;
                *state = if refusals >= CAPTURE_ATTEMPTS {
                    GraphState::Ordinary
                } else {
                    GraphState::Pending { refusals }
                };
                return Replay::Ordinary;
            }
            Err(Failure::Sticky(error)) => return Replay::Fault(error),
        }
    }
    match *state {
        GraphState::Ready { exec, .. } => match stream.launch(exec) {
            Ok(()) => Replay::Launched,
            Err(error) => match classify(code(&error)) {
                // Nothing was queued: this replay runs as launches.
                FaultClass::OperationLocal => Replay::Ordinary,
                FaultClass::Sticky => {
                    Replay::Fault(LaunchError::Fault(fault("graph launch", &error)))
                }
            },
        },
        GraphState::Pending { .. } | GraphState::Ordinary => Replay::Ordinary,
    }
}

/// Why a capture made no graph.
enum Failure {
    /// A launch failed at issue.
    Launch,
    /// The driver refused the capture operation-locally.
    Refused,
    /// A sticky driver error.
    Sticky(LaunchError),
}

fn driver_failure(operation: &str, error: &DriverError) -> Failure {
    match classify(code(error)) {
        FaultClass::OperationLocal => Failure::Refused,
        FaultClass::Sticky => Failure::Sticky(LaunchError::Fault(fault(operation, error))),
    }
}

/// Captures `launches` on `stream` and instantiates the graph. A failed
/// capture ends it, destroys any graph it made, and leaves the stream out
/// of capture mode.
fn capture<C: GraphContext>(
    stream: &mut impl GraphStream,
    context: &C,
    launches: &[BoundLaunch<CudaSlice>],
) -> Result<(CUgraph, CUgraphExec), Failure> {
    if let Err(error) = stream.begin_capture() {
        stream.leave_capture();
        return Err(driver_failure("begin capture", &error));
    }
    let issued = stream.issue(launches);
    // Ended whatever happened: that is what leaves capture mode.
    let ended = stream.end_capture();
    let failure = match (&issued, ended) {
        (Ok(()), Ok(graph)) if !graph.is_null() => None,
        (Err(_), _) => Some(Failure::Launch),
        (Ok(()), Err(error)) => Some(driver_failure("end capture", &error)),
        // Invalidated: the driver met something it cannot capture.
        (Ok(()), Ok(_)) => Some(Failure::Refused),
    };
    let graph = ended.unwrap_or(std::ptr::null_mut());
    if let Some(failure) = failure {
        if !graph.is_null() {
            context.destroy(graph, std::ptr::null_mut());
        }
        stream.leave_capture();
        return Err(failure);
    }
    match stream.instantiate(graph) {
        Ok(exec) => Ok((graph, exec)),
        Err(error) => {
            context.destroy(graph, std::ptr::null_mut());
            Err(driver_failure("instantiate graph", &error))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use cudarc::driver::sys::CUresult;

    use super::*;
    use crate::backend::stream::KernelFault;
    use crate::optimizer::OptimizerArgs;
    use cistern_optim::{AdamConfig, LambConfig};

    const INVALIDATED: CUresult = CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    const ILLEGAL_ADDRESS: CUresult = CUresult::CUDA_ERROR_ILLEGAL_ADDRESS;
    const OUT_OF_RESOURCES: CUresult = CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;

    fn handle<T>(value: usize) -> *mut T {
        std::ptr::without_provenance_mut(value)
    }

    /// A context that counts resets and records what it destroyed.
    #[derive(Default)]
    struct FakeContext {
        epoch: AtomicU64,
        destroyed: std::sync::Mutex<Vec<(usize, usize)>>,
    }

    impl FakeContext {
        fn destroyed(&self) -> Vec<(usize, usize)> {
            self.destroyed.lock().map(|d| d.clone()).unwrap_or_default()
        }
    }

    impl GraphContext for FakeContext {
        fn epoch(&self) -> u64 {
            self.epoch.load(Ordering::Relaxed)
        }

        fn destroy(&self, graph: CUgraph, exec: CUgraphExec) {
            if let Ok(mut destroyed) = self.destroyed.lock() {
                destroyed.push((graph.addr(), exec.addr()));
            }
        }
    }

    /// A stream that answers as scripted and logs each call.
    #[derive(Default)]
    struct FakeStream {
        calls: Vec<&'static str>,
        capturing: bool,
        begin: Option<DriverError>,
        issue: Option<(usize, LaunchError)>,
        end: Option<Result<CUgraph, DriverError>>,
        instantiate: Option<DriverError>,
        launch: Option<DriverError>,
        made: usize,
    }

    impl GraphStream for FakeStream {
        fn begin_capture(&mut self) -> Result<(), DriverError> {
            self.calls.push("begin");
            match self.begin {
                Some(error) => Err(error),
                None => {
                    self.capturing = true;
                    Ok(())
                }
            }
        }

        fn issue(&mut self, _: &[BoundLaunch<CudaSlice>]) -> Result<(), (usize, LaunchError)> {
            self.calls.push("issue");
            self.issue.take().map_or(Ok(()), Err)
        }

        fn end_capture(&mut self) -> Result<CUgraph, DriverError> {
            self.calls.push("end");
            self.capturing = false;
            self.made += 1;
            self.end.unwrap_or(Ok(handle(10 * self.made)))
        }

        fn leave_capture(&mut self) {
            self.calls.push("leave");
            assert!(!self.capturing, "a failed capture is ended first");
        }

        fn instantiate(&mut self, graph: CUgraph) -> Result<CUgraphExec, DriverError> {
            self.calls.push("instantiate");
            self.instantiate.map_or(Ok(handle(graph.addr() + 1)), Err)
        }

        fn launch(&mut self, _: CUgraphExec) -> Result<(), DriverError> {
            self.calls.push("launch");
            self.launch.take().map_or(Ok(()), Err)
        }
    }

    fn cache() -> (Arc<FakeContext>, GraphCache<FakeContext>) {
        let context = Arc::new(FakeContext::default());
        (context.clone(), GraphCache::new(context))
    }

    fn calls(stream: &mut FakeStream) -> Vec<&'static str> {
        std::mem::take(&mut stream.calls)
    }

    fn bound(kernel: Kernel) -> BoundLaunch<CudaSlice> {
        BoundLaunch {
            kernel,
            bindings: Vec::new(),
        }
    }

    fn step(config: OptimizerConfig) -> OptimizerArgs {
        OptimizerArgs {
            config,
            step: 1,
            segments: Default::default(),
            found_inf: false,
        }
    }

    #[test]
    fn only_a_recorded_list_of_capturable_launches_runs_as_a_graph() {
        let fill = Kernel::map(cistern_kernels::MapOp::Fill, &[1.0]);
        let plain = [bound(fill), bound(Kernel::Empty)];
        assert!(wants_graph(true, &plain));
        assert!(!wants_graph(false, &plain), "an ordinary batch");
        assert!(!wants_graph(true, &[]));
        let adam = OptimizerConfig::Adam(AdamConfig::default());
        let lamb = OptimizerConfig::Lamb(LambConfig::default());
        let counted_adam = bound(Kernel::OptimizerStepCounted(Box::new(step(adam.clone()))));
        assert!(wants_graph(true, &[counted_adam]));
        let adam_step = bound(Kernel::OptimizerStep(Box::new(step(adam))));
        let lamb_step = bound(Kernel::OptimizerStep(Box::new(step(lamb.clone()))));
        assert!(!wants_graph(true, &[adam_step, lamb_step]));
        let counted_lamb = bound(Kernel::OptimizerStepCounted(Box::new(step(lamb))));
        assert!(!wants_graph(true, &[counted_lamb]));
    }

    #[test]
    fn a_graph_is_captured_on_the_first_replay_and_launched_on_every_one() {
        let (context, cache) = cache();
        let mut stream = FakeStream::default();
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Launched));
        assert_eq!(
            calls(&mut stream),
            ["begin", "issue", "end", "instantiate", "launch"]
        );
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Launched));
        assert_eq!(calls(&mut stream), ["launch"]);
        drop(cache);
        assert_eq!(context.destroyed(), [(10, 11)], "exec and graph, once");
    }

    #[test]
    fn a_launch_refused_in_the_capture_runs_the_list_as_launches_for_good() {
        let (context, cache) = cache();
        let refused = LaunchError::Refused(ServerError::UnsupportedOperation {
            operation: "lamb_step".into(),
        });
        let mut stream = FakeStream {
            issue: Some((1, refused)),
            ..FakeStream::default()
        };
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Ordinary));
        assert_eq!(calls(&mut stream), ["begin", "issue", "end", "leave"]);
        assert_eq!(context.destroyed(), [(10, 0)], "the partial graph");
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Ordinary));
        assert!(calls(&mut stream).is_empty(), "never captured again");
    }

    #[test]
    fn a_fault_at_issue_in_the_capture_is_left_to_the_ordinary_run() {
        let (_, cache) = cache();
        let fault = LaunchError::Fault(KernelFault::Malformed("no binding 2".into()));
        let mut stream = FakeStream {
            issue: Some((0, fault)),
            ..FakeStream::default()
        };
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Ordinary));
        assert_eq!(calls(&mut stream), ["begin", "issue", "end", "leave"]);
    }

    #[test]
    fn a_refused_capture_falls_back_and_is_tried_again_a_few_times() {
        let (context, cache) = cache();
        let mut stream = FakeStream {
            end: Some(Err(DriverError(INVALIDATED))),
            ..FakeStream::default()
        };
        for _ in 0..CAPTURE_ATTEMPTS {
            assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Ordinary));
            assert_eq!(calls(&mut stream), ["begin", "issue", "end", "leave"]);
        }
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Ordinary));
        assert!(calls(&mut stream).is_empty(), "given up");
        assert!(context.destroyed().is_empty());
    }

    #[test]
    fn an_invalidated_capture_with_no_graph_falls_back_and_may_succeed_later() {
        let (_, cache) = cache();
        let mut stream = FakeStream {
            end: Some(Ok(std::ptr::null_mut())),
            ..FakeStream::default()
        };
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Ordinary));
        assert_eq!(calls(&mut stream), ["begin", "issue", "end", "leave"]);
        stream.end = None;
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Launched));
    }

    #[test]
    fn a_refused_instantiation_destroys_the_graph_and_falls_back() {
        let (context, cache) = cache();
        let mut stream = FakeStream {
            instantiate: Some(DriverError(CUresult::CUDA_ERROR_NOT_SUPPORTED)),
            ..FakeStream::default()
        };
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Ordinary));
        assert_eq!(calls(&mut stream), ["begin", "issue", "end", "instantiate"]);
        assert_eq!(context.destroyed(), [(10, 0)]);
    }

    #[test]
    fn a_refused_begin_leaves_the_stream_out_of_capture_and_falls_back() {
        let (_, cache) = cache();
        let mut stream = FakeStream {
            begin: Some(DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)),
            ..FakeStream::default()
        };
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Ordinary));
        assert_eq!(calls(&mut stream), ["begin", "leave"]);
    }

    #[test]
    fn a_sticky_driver_error_in_the_capture_faults_the_batch() {
        let (context, cache) = cache();
        let mut stream = FakeStream {
            end: Some(Err(DriverError(ILLEGAL_ADDRESS))),
            ..FakeStream::default()
        };
        let outcome = replay(&cache, &mut stream, &[]);
        assert!(matches!(
            outcome,
            Replay::Fault(LaunchError::Fault(KernelFault::Device(_)))
        ));
        assert_eq!(calls(&mut stream), ["begin", "issue", "end", "leave"]);
        assert!(context.destroyed().is_empty());
        let mut stream = FakeStream {
            begin: Some(DriverError(ILLEGAL_ADDRESS)),
            ..FakeStream::default()
        };
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Fault(_)));
    }

    #[test]
    fn a_refused_graph_launch_runs_that_replay_as_launches_and_keeps_the_graph() {
        let (_, cache) = cache();
        let mut stream = FakeStream {
            launch: Some(DriverError(OUT_OF_RESOURCES)),
            ..FakeStream::default()
        };
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Ordinary));
        calls(&mut stream);
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Launched));
        assert_eq!(calls(&mut stream), ["launch"]);
        stream.launch = Some(DriverError(ILLEGAL_ADDRESS));
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Fault(_)));
    }

    #[test]
    fn a_graph_from_before_a_reset_is_never_destroyed_and_is_captured_afresh() {
        let (context, cache) = cache();
        let mut stream = FakeStream::default();
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Launched));
        context.epoch.store(1, Ordering::Relaxed);
        calls(&mut stream);
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Launched));
        assert_eq!(
            calls(&mut stream),
            ["begin", "issue", "end", "instantiate", "launch"]
        );
        assert!(
            context.destroyed().is_empty(),
            "the old graph died with its context"
        );
        drop(cache);
        assert_eq!(context.destroyed(), [(20, 21)], "only the new one");
    }

    #[test]
    fn a_cache_dropped_after_a_reset_leaves_its_graph_alone() {
        let (context, cache) = cache();
        let mut stream = FakeStream::default();
        assert!(matches!(replay(&cache, &mut stream, &[]), Replay::Launched));
        context.epoch.store(1, Ordering::Relaxed);
        drop(cache);
        assert!(context.destroyed().is_empty());
    }
}
