//! `WgpuStream`: the device part of one wgpu stream, run by the shared
//! [`StreamRunner`](crate::backend::stream::StreamRunner) on its own
//! thread. Streams share the device's one queue; each call submits its
//! work and waits for the device to finish it before it returns, so the
//! progress the runner reports is work the device has done.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::context::GpuContext;
use super::dispatch::Params;
use super::kernels::{Plan, u32_of};
use super::pipelines::{Entry, Module};
use super::slice::GpuSlice;
use crate::backend::StrideLayout;
use crate::backend::event::{EventSignal, HostEvent};
use crate::backend::stream::{
    BoundLaunch, KernelFault, LaunchError, ReadError, StreamDevice, gpu_supports_strides,
};
use crate::error::ServerError;
use crate::kernel::Kernel;

const STRIDED: Entry = Entry {
    module: Module::Strided,
    name: "strided_copy",
    buffers: 2,
    table: true,
    per_invocation: 1,
};

/// What the device has run, shared by its streams.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) kernels_run: AtomicU64,
    pub(super) empty_kernel_runs: AtomicU64,
}

/// One stream's view of the device.
#[derive(Debug)]
pub(super) struct WgpuStream {
    pub(super) context: Arc<GpuContext>,
    pub(super) counters: Arc<Counters>,
}

/// Whether the strided-copy kernel runs `layout` between views starting at
/// these byte offsets: it copies whole words from word boundaries.
pub(super) fn copies_strides(
    layout: &StrideLayout,
    source_offset: u64,
    target_offset: u64,
) -> bool {
    gpu_supports_strides(layout) && source_offset % 4 == 0 && target_offset % 4 == 0
}

impl WgpuStream {
    fn launch(&self, launch: &BoundLaunch<GpuSlice>) -> Result<(), LaunchError> {
        let context = &self.context;
        context.lost()?;
        match context.plan(launch)? {
            Plan::Nothing => Ok(()),
            Plan::Copy(source, target) => Ok(context.copy(&source, &target)?),
            Plan::Dispatches(dispatches) => context.run_now(&dispatches),
            Plan::Submissions(dispatches) => dispatches
                .iter()
                .try_for_each(|dispatch| context.run_now(std::slice::from_ref(dispatch))),
            Plan::Lamb(config, args) => context.lamb(config, args, &launch.bindings),
            Plan::CountedLamb(config, args) => context.counted_lamb(config, args, &launch.bindings),
        }
    }
}

impl StreamDevice for WgpuStream {
    type Slice = GpuSlice;
    type Signal = EventSignal;
    type Event = Arc<HostEvent>;
    type Batch = Arc<[BoundLaunch<GpuSlice>]>;

    fn write(&mut self, target: &GpuSlice, data: &[u8]) -> Result<(), KernelFault> {
        self.context.write(target, data)
    }

    fn read(&mut self, source: &GpuSlice) -> Result<Vec<u8>, ReadError> {
        self.context.read(source)
    }

    fn copy(&mut self, source: &GpuSlice, target: &GpuSlice) -> Result<(), KernelFault> {
        self.context.copy(source, target)
    }

    fn strided_copy(
        &mut self,
        source: &GpuSlice,
        target: &GpuSlice,
        layout: &StrideLayout,
    ) -> Result<(), KernelFault> {
        let context = &self.context;
        let malformed = |e: ServerError| KernelFault::Malformed(e.to_string());
        // `supports_strides` declined these; never copy them wrongly.
        if !copies_strides(layout, source.offset, target.offset) {
            return Err(KernelFault::Malformed("unsupported stride layout".into()));
        }
        let elements: u64 = layout.shape.iter().product();
        if elements == 0 {
            return Ok(());
        }
        let words_per = layout.element_size / 4;
        let mut table = Vec::with_capacity(3 * layout.shape.len());
        for value in layout
            .shape
            .iter()
            .chain(&layout.source_strides)
            .chain(&layout.target_strides)
        {
            table.push(u32_of(*value).map_err(malformed)?);
        }
        let mut params = Params::new(0, &[]);
        params.u[8] = layout.shape.len() as u32;
        params.u[9] = u32_of(words_per).map_err(malformed)?;
        let windows = vec![
            context.window(source).map_err(malformed)?,
            context.window(target).map_err(malformed)?,
        ];
        let table = context.table(&table);
        let dispatch = context
            .dispatch(STRIDED, windows, Some(table), params, elements * words_per)
            .map_err(malformed)?;
        let mut encoder = context.encoder();
        context
            .encode(&mut encoder, &[dispatch])
            .map_err(malformed)?;
        context.submit_all(encoder)
    }

    fn run(&mut self, launches: &[BoundLaunch<GpuSlice>]) -> Result<(), (usize, LaunchError)> {
        let (mut empty, mut others) = (0, 0);
        let mut outcome = Ok(());
        for (index, launch) in launches.iter().enumerate() {
            if matches!(launch.kernel, Kernel::Empty) {
                empty += 1;
                continue;
            }
            // Sticky, as a hardware trap is; `plan` answers every other kernel.
            let result = if matches!(launch.kernel, Kernel::Trap) {
                Err(LaunchError::Fault(KernelFault::Trap))
            } else {
                self.launch(launch)
            };
            if let Err(error) = result {
                outcome = Err((index, error));
                break;
            }
            others += 1;
        }
        let counters = &self.counters;
        counters
            .empty_kernel_runs
            .fetch_add(empty, Ordering::Relaxed);
        counters
            .kernels_run
            .fetch_add(empty + others, Ordering::Relaxed);
        outcome
    }

    fn record(&mut self, signal: EventSignal) {
        drop(signal);
    }

    fn wait(&mut self, event: &Arc<HostEvent>) {
        event.wait();
    }
}
