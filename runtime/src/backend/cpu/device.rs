//! `CpuStream`: the device part of one CPU stream, run by the shared
//! [`StreamRunner`](crate::backend::stream::StreamRunner) on its own thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::binding_lists::SpentLists;
use super::kernels::{self, copy_bytes};
use super::memory::HostSlice;
use super::strided::strided_copy;
use crate::backend::StrideLayout;
use crate::backend::event::{EventSignal, HostEvent};
use crate::backend::stream::{BoundLaunch, KernelFault, LaunchError, ReadError, StreamDevice};

/// What the CPU has run, shared by its streams.
#[derive(Debug, Default)]
pub(super) struct CpuCounters {
    pub(super) kernels_run: AtomicU64,
    pub(super) empty_kernel_runs: AtomicU64,
}

/// A launch's bindings as host slices.
pub(super) type CpuLaunch = BoundLaunch<HostSlice>;

/// One stream's view of the host: every call runs on its executor thread.
#[derive(Debug)]
pub(super) struct CpuStream {
    /// Single launches' emptied host-slice lists, going back to the server.
    pub(super) lists: SpentLists,
    pub(super) counters: Arc<CpuCounters>,
    /// The device's own kernel threads, or `None` for the process's pool.
    pub(super) pool: Option<Arc<rayon::ThreadPool>>,
}

impl StreamDevice for CpuStream {
    type Slice = HostSlice;
    type Signal = EventSignal;
    type Event = Arc<HostEvent>;
    type Batch = Arc<[CpuLaunch]>;

    fn write(&mut self, target: &HostSlice, data: &[u8]) -> Result<(), KernelFault> {
        // SAFETY: the server checked the range and orders every stream's
        // conflicting uses of it before this one.
        let bytes = unsafe { target.bytes_mut() };
        copy_bytes(data, bytes)
    }

    fn read(&mut self, source: &HostSlice) -> Result<Vec<u8>, ReadError> {
        // SAFETY: a read range is only read here; writers are ordered before it.
        Ok(unsafe { source.bytes() }.to_vec())
    }

    fn copy(&mut self, source: &HostSlice, target: &HostSlice) -> Result<(), KernelFault> {
        // SAFETY: the server checked the ranges do not overlap, and orders
        // other streams' writers before this.
        let (from, to) = unsafe { (source.bytes(), target.bytes_mut()) };
        copy_bytes(from, to)
    }

    fn strided_copy(
        &mut self,
        source: &HostSlice,
        target: &HostSlice,
        layout: &StrideLayout,
    ) -> Result<(), KernelFault> {
        // SAFETY: the server checked the views do not overlap.
        let (from, to) = unsafe { (source.bytes(), target.bytes_mut()) };
        strided_copy(from, to, layout)
    }

    fn run(&mut self, launches: &[CpuLaunch]) -> Result<(), (usize, LaunchError)> {
        let outcome = match &self.pool {
            Some(pool) => pool.install(|| kernels::run_all(launches)),
            None => kernels::run_all(launches),
        };
        if outcome.empty > 0 {
            let counters = &self.counters;
            counters
                .empty_kernel_runs
                .fetch_add(outcome.empty, Ordering::Relaxed);
            counters
                .kernels_run
                .fetch_add(outcome.empty, Ordering::Relaxed);
        }
        if outcome.others > 0 {
            self.counters
                .kernels_run
                .fetch_add(outcome.others, Ordering::Relaxed);
        }
        outcome.result
    }

    fn record(&mut self, signal: EventSignal) {
        drop(signal);
    }

    fn wait(&mut self, event: &Arc<HostEvent>) {
        event.wait();
    }

    fn release_launch(&mut self, launch: CpuLaunch) {
        self.lists.give(launch.bindings);
    }

    fn idle(&mut self) {
        self.lists.send();
    }
}
