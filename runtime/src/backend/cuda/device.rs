//! `CudaStream`: the device part of one stream, run by the shared
//! [`StreamRunner`](crate::backend::stream::StreamRunner) on its executor
//! thread. It issues work on its own CUDA stream and synchronizes it before
//! returning, so the runner never reports work the GPU has not finished.
//! A recorded graph's batch runs as a CUDA graph where it can (`graph.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::DriverError;
use cudarc::driver::sys::{CUgraph, CUgraphExec, CUstream};

use super::context::{CudaContext, Module};
use super::event::{CudaEvent, EventSignal};
use super::ffi;
use super::graph::{self, CudaBatch, GraphCache, GraphStream, Replay};
use super::launch::{CudaSlice, Launcher};
use super::scratch::Scratch;
use super::status::fault;
use super::strided::{self, strided_launch};
use crate::backend::StrideLayout;
use crate::backend::stream::{BoundLaunch, KernelFault, LaunchError, ReadError, StreamDevice};
use crate::kernel::Kernel;

/// What the device has run, shared by its streams.
#[derive(Debug, Default)]
pub(super) struct CudaCounters {
    pub(super) kernels_run: AtomicU64,
    pub(super) empty_kernel_runs: AtomicU64,
}

/// One stream's view of the device.
#[derive(Debug)]
pub(super) struct CudaStream {
    pub(super) context: Arc<CudaContext>,
    pub(super) counters: Arc<CudaCounters>,
    /// The CUDA stream and the context epoch it was made in.
    pub(super) stream: Option<(u64, usize)>,
    /// Device memory for launches' intermediate values (LAMB).
    pub(super) scratch: Scratch,
}

impl CudaStream {
    /// This thread bound to the context, and the CUDA stream of the
    /// current epoch (made afresh after a reset).
    fn ready(&mut self) -> Result<CUstream, DriverError> {
        self.context.bind()?;
        let epoch = self.context.epoch();
        match self.stream {
            Some((made, stream)) if made == epoch => Ok(stream as CUstream),
            _ => {
                let stream = ffi::stream_create()?;
                self.stream = Some((epoch, stream as usize));
                Ok(stream)
            }
        }
    }

    fn stream_for(&mut self, operation: &str) -> Result<CUstream, KernelFault> {
        self.ready().map_err(|e| fault(operation, &e))
    }

    /// The CUDA stream of the current epoch and its kernels, ready to issue.
    fn issuer(&mut self) -> Result<(CUstream, Arc<Module>), (usize, LaunchError)> {
        let stream = self
            .ready()
            .map_err(|e| (0, LaunchError::Fault(fault("bind", &e))))?;
        let module = self
            .context
            .module()
            .map_err(|e| (0, LaunchError::Fault(fault("load kernels", &e))))?;
        Ok((stream, module))
    }

    fn run_launches(
        &mut self,
        launches: &[BoundLaunch<CudaSlice>],
    ) -> Result<(), (usize, LaunchError)> {
        let (stream, module) = self.issuer()?;
        let mut launcher = Launcher {
            module: &module,
            stream,
            scratch: &mut self.scratch,
            epoch: self.context.epoch(),
        };
        let (queued, outcome) = issue(&mut launcher, launches);
        self.finish(stream, launches, queued, outcome)
    }

    /// A recorded graph's batch: one graph launch once captured, else (or
    /// where the graph cannot be had) the ordinary launches.
    fn run_graph(
        &mut self,
        launches: &[BoundLaunch<CudaSlice>],
        cache: &GraphCache<CudaContext>,
    ) -> Result<(), (usize, LaunchError)> {
        let (stream, module) = self.issuer()?;
        let epoch = self.context.epoch();
        let mut capture = StreamCapture {
            launcher: Launcher {
                module: &module,
                stream,
                scratch: &mut self.scratch,
                epoch,
            },
            slot: &mut self.stream,
        };
        match graph::replay(cache, &mut capture, launches) {
            // Every launch of the batch ran: counted as an ordinary batch's.
            Replay::Launched => self.finish(stream, launches, launches.len(), Ok(())),
            Replay::Ordinary => self.run_launches(launches),
            Replay::Fault(error) => Err((0, error)),
        }
    }

    /// Waits for the first `queued` of `launches` (everything queued must
    /// finish or fault before the runner reports), then counts them.
    fn finish(
        &self,
        stream: CUstream,
        launches: &[BoundLaunch<CudaSlice>],
        queued: usize,
        outcome: Result<(), (usize, LaunchError)>,
    ) -> Result<(), (usize, LaunchError)> {
        let queued = queued.min(launches.len());
        if let Err(error) = ffi::stream_synchronize(stream) {
            // A stream runs its kernels one after another: where the batch
            // holds a trap, what came before it ran; else which launch
            // faulted is unknown, and none is counted.
            let (at, ran) = match first_trap(&launches[..queued]) {
                Some(trap) => (trap, trap),
                None => (queued.max(1) - 1, 0),
            };
            self.count(&launches[..ran]);
            let kernel = launches.get(at).map_or("?", |l| l.kernel.name());
            return Err((
                at,
                LaunchError::Fault(fault(&format!("sync after {kernel}"), &error)),
            ));
        }
        self.count(&launches[..queued]);
        outcome
    }

    /// Counts `ran` as run by the device.
    fn count(&self, ran: &[BoundLaunch<CudaSlice>]) {
        let empty = ran
            .iter()
            .filter(|l| matches!(l.kernel, Kernel::Empty))
            .count() as u64;
        self.counters
            .empty_kernel_runs
            .fetch_add(empty, Ordering::Relaxed);
        self.counters
            .kernels_run
            .fetch_add(ran.len() as u64, Ordering::Relaxed);
    }
}

/// The index of the first trap kernel among `launches`.
fn first_trap(launches: &[BoundLaunch<CudaSlice>]) -> Option<usize> {
    launches
        .iter()
        .position(|l| matches!(l.kernel, Kernel::Trap))
}

/// Queues `launches` in order until one fails: how many were queued, and
/// the failure with its index.
fn issue(
    launcher: &mut Launcher<'_>,
    launches: &[BoundLaunch<CudaSlice>],
) -> (usize, Result<(), (usize, LaunchError)>) {
    for (index, launch) in launches.iter().enumerate() {
        if let Err(error) = launcher.run(launch) {
            return (index, Err((index, error)));
        }
    }
    (launches.len(), Ok(()))
}

/// A stream's side of graph capture and launch, over the driver.
struct StreamCapture<'a> {
    launcher: Launcher<'a>,
    /// The stream's slot, emptied when a failed capture left it capturing.
    slot: &'a mut Option<(u64, usize)>,
}

impl GraphStream for StreamCapture<'_> {
    fn begin_capture(&mut self) -> Result<(), DriverError> {
        ffi::begin_capture(self.launcher.stream)
    }

    fn issue(&mut self, launches: &[BoundLaunch<CudaSlice>]) -> Result<(), (usize, LaunchError)> {
        issue(&mut self.launcher, launches).1
    }

    fn end_capture(&mut self) -> Result<CUgraph, DriverError> {
        ffi::end_capture(self.launcher.stream)
    }

    fn leave_capture(&mut self) {
        if !matches!(ffi::is_capturing(self.launcher.stream), Ok(false)) {
            // Never issue on it again: the next use makes a fresh stream,
            // and this one goes with the context.
            *self.slot = None;
        }
    }

    fn instantiate(&mut self, graph: CUgraph) -> Result<CUgraphExec, DriverError> {
        ffi::instantiate(graph)
    }

    fn launch(&mut self, exec: CUgraphExec) -> Result<(), DriverError> {
        ffi::graph_launch(exec, self.launcher.stream)
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        // Only this epoch's handles: a reset destroyed the older ones.
        let epoch = self.context.epoch();
        let stream = self.stream.filter(|&(made, _)| made == epoch);
        if (stream.is_some() || self.scratch.holds(epoch)) && self.context.bind().is_ok() {
            // Every launch was synchronized before `run` returned.
            self.scratch.release(epoch);
            if let Some((_, stream)) = stream {
                let _ = ffi::stream_destroy(stream as CUstream);
            }
        }
    }
}

impl StreamDevice for CudaStream {
    type Slice = CudaSlice;
    type Signal = EventSignal;
    type Event = Arc<CudaEvent>;
    type Batch = CudaBatch;

    fn write(&mut self, target: &CudaSlice, data: &[u8]) -> Result<(), KernelFault> {
        let stream = self.stream_for("write")?;
        ffi::write(target.address, data, stream).map_err(|e| fault("write", &e))
    }

    fn read(&mut self, source: &CudaSlice) -> Result<Vec<u8>, ReadError> {
        let stream = self.stream_for("read")?;
        let len = usize::try_from(source.len)
            .map_err(|_| KernelFault::Malformed("read too long".into()))?;
        Ok(ffi::read(source.address, len, stream).map_err(|e| fault("read", &e))?)
    }

    fn copy(&mut self, source: &CudaSlice, target: &CudaSlice) -> Result<(), KernelFault> {
        if source.len != target.len {
            return Err(KernelFault::Malformed("copy sizes differ".into()));
        }
        let stream = self.stream_for("copy")?;
        let len = usize::try_from(source.len)
            .map_err(|_| KernelFault::Malformed("copy too long".into()))?;
        ffi::copy(source.address, target.address, len, stream)
            .and_then(|()| ffi::stream_synchronize(stream))
            .map_err(|e| fault("copy", &e))
    }

    fn strided_copy(
        &mut self,
        source: &CudaSlice,
        target: &CudaSlice,
        layout: &StrideLayout,
    ) -> Result<(), KernelFault> {
        let Some(launch) = strided_launch(source, target, layout)? else {
            return Ok(());
        };
        let stream = self.stream_for("strided copy")?;
        let module = self
            .context
            .module()
            .map_err(|e| fault("load kernels", &e))?;
        let launcher = Launcher {
            module: &module,
            stream,
            scratch: &mut self.scratch,
            epoch: self.context.epoch(),
        };
        // No owner hears a refusal here: every failure is sticky, as a copy's is.
        launcher
            .stride(strided::KERNEL, launch.units, &launch.args)
            .map_err(|error| match error {
                LaunchError::Fault(fault) => fault,
                LaunchError::Refused(refusal) => KernelFault::Device(refusal.to_string()),
            })?;
        ffi::stream_synchronize(stream).map_err(|e| fault("strided copy", &e))
    }

    fn run(&mut self, launches: &[BoundLaunch<CudaSlice>]) -> Result<(), (usize, LaunchError)> {
        self.run_launches(launches)
    }

    fn run_batch(&mut self, batch: &CudaBatch) -> Result<(), (usize, LaunchError)> {
        match batch.graph() {
            Some(cache) => self.run_graph(batch.as_ref(), cache),
            None => self.run_launches(batch.as_ref()),
        }
    }

    fn record(&mut self, signal: EventSignal) {
        let recorded = self.ready().and_then(|stream| {
            let event = ffi::event_create()?;
            match ffi::event_record(event, stream) {
                Ok(()) => Ok(event),
                Err(error) => {
                    let _ = ffi::event_destroy(event);
                    Err(error)
                }
            }
        });
        // A failed record fires with no event: waiters pass at once, and
        // the failure shows as the stream's next driver error.
        signal.0.fire(recorded.ok());
    }

    fn wait(&mut self, event: &Arc<CudaEvent>) {
        if let Some(recorded) = event.recorded()
            && let Ok(stream) = self.ready()
        {
            let _ = ffi::stream_wait(stream, recorded);
        }
    }
}
