//! The wgpu backend: Vulkan, Metal and DX12 adapters through WGSL.
//!
//! Each stream has an executor thread running the shared stream protocol
//! over its `WgpuStream` device part; every stream submits to the device's
//! one queue and waits for its own work before reporting it. Memory is
//! `wgpu::Buffer` pages (`WgpuStorage`); kernels are the WGSL sources of
//! `cistern-kernels`, compiled once per device on first use.

mod adapter;
mod amp;
mod context;
mod dispatch;
mod gemm;
mod kernels;
mod lamb;
mod memory;
mod optimizer;
mod pipelines;
mod slice;
mod storage;
mod stream;
mod timing;
mod transfer;

pub(crate) use adapter::{absence, list};
pub use storage::WgpuStorage;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cistern_memory::{IdMap, IoError, SliceLocation, StreamId};

use self::context::GpuContext;
use self::slice::GpuSlice;
use self::stream::{Counters, WgpuStream};
use super::event::{EventSignal, HostEvent, event_of, record_in};
use super::executors::{Executors, progress_of, unknown_stream};
use super::stream::{BoundLaunch, Job, Resolver, StreamProgress, bind_launches};
use super::{Backend, Completion, DeviceCounters, Launches, Refused, StreamWork, StrideLayout};
use crate::error::ServerError;
use crate::ids::Device;
use crate::ids::EventId;
use crate::sync::Sender;

/// A wgpu adapter as a device.
#[derive(Debug)]
pub struct WgpuBackend {
    ordinal: usize,
    context: Arc<GpuContext>,
    executors: Executors<WgpuStream, ()>,
    events: IdMap<EventId, Arc<HostEvent>>,
    counters: Arc<Counters>,
}

impl WgpuBackend {
    /// Opens adapter `ordinal` (as `list_devices` numbers them): the
    /// backend, its storage, and the memory limit of default options. An
    /// absent adapter, or one that refuses a device, is `DeviceUnavailable`.
    pub fn open(
        ordinal: usize,
        completions: Sender<Completion>,
    ) -> Result<(Self, WgpuStorage, u64), ServerError> {
        let adapter = adapter::adapter(ordinal)?;
        let (device, queue) = adapter::request_device(&adapter, ordinal)?;
        let context = Arc::new(GpuContext::new(device, queue));
        let storage = WgpuStorage::new(context.clone());
        let backend = WgpuBackend {
            ordinal,
            context,
            executors: Executors::new(ordinal, "wgpu", completions),
            events: IdMap::default(),
            counters: Arc::default(),
        };
        Ok((backend, storage, adapter::default_limit(&adapter)))
    }
}

/// The server-side lookups of one submit: buffer slices and events.
struct WgpuResolver<'a> {
    storage: &'a WgpuStorage,
    events: &'a mut IdMap<EventId, Arc<HostEvent>>,
    progress: &'a IdMap<StreamId, Arc<StreamProgress>>,
}

impl Resolver for WgpuResolver<'_> {
    type Device = WgpuStream;

    fn slice(&mut self, location: SliceLocation) -> Result<GpuSlice, ServerError> {
        GpuSlice::resolve(self.storage, location)
    }

    fn batch(&mut self, launches: &Launches) -> Result<Arc<[BoundLaunch<GpuSlice>]>, ServerError> {
        let storage = self.storage;
        launches
            .prepared(|list| bind_launches(list, |location| GpuSlice::resolve(storage, location)))
    }

    fn record(&mut self, event: EventId) -> EventSignal {
        record_in(self.events, event)
    }

    fn progress(&mut self, stream: StreamId) -> Result<Arc<StreamProgress>, ServerError> {
        progress_of(self.progress, stream)
    }

    fn wait(&mut self, event: EventId) -> Result<Arc<HostEvent>, ServerError> {
        event_of(self.events, event)
    }
}

impl Backend for WgpuBackend {
    type Storage = WgpuStorage;

    fn device(&self) -> Device {
        Device::Wgpu(self.ordinal)
    }

    fn create_stream(&mut self, stream: StreamId) -> Result<(), ServerError> {
        let device = WgpuStream {
            context: self.context.clone(),
            counters: self.counters.clone(),
        };
        self.executors.create(stream, device, ())
    }

    fn destroy_stream(&mut self, stream: StreamId) {
        self.executors.destroy(stream);
    }

    fn submit(
        &mut self,
        storage: &WgpuStorage,
        stream: StreamId,
        sequence: u64,
        work: StreamWork,
    ) -> Result<(), Box<Refused>> {
        let Some(((), progress)) = self.executors.resolving(stream) else {
            let error = unknown_stream(stream);
            return Err(Box::new(Refused { error, work }));
        };
        let urgent = work.is_urgent();
        let mut resolver = WgpuResolver {
            storage,
            events: &mut self.events,
            progress,
        };
        let task = work.resolve(&mut resolver)?;
        self.executors.push(stream, Job { sequence, task }, urgent);
        Ok(())
    }

    fn stream_idle(&self, stream: StreamId) -> bool {
        self.executors.is_idle(stream)
    }

    fn flush(&mut self) {
        self.executors.flush();
    }

    fn supports_strides(
        &self,
        layout: &StrideLayout,
        source: SliceLocation,
        target: SliceLocation,
    ) -> bool {
        stream::copies_strides(layout, source.offset, target.offset)
    }

    fn relocate(
        &mut self,
        storage: &WgpuStorage,
        from: SliceLocation,
        to: SliceLocation,
    ) -> Result<(), ServerError> {
        let source = GpuSlice::resolve(storage, from)?;
        let target = GpuSlice::resolve(storage, to)?;
        if source.size > target.size {
            return Err(ServerError::Io(IoError::unknown(
                "relocation target smaller than its source",
            )));
        }
        let target = target.part(0, source.size);
        self.context
            .copy(&source, &target)
            .map_err(|fault| ServerError::Io(IoError::unknown(format!("relocation: {fault}"))))
    }

    fn release_event(&mut self, event: EventId) {
        self.events.remove(&event);
    }

    fn reset_context(&mut self, generation: u64) -> Result<(), ServerError> {
        // A lost device stays lost: the probe after this reset finds it.
        self.executors.health.reset(generation);
        Ok(())
    }

    fn counters(&self) -> DeviceCounters {
        DeviceCounters {
            kernels_run: self.counters.kernels_run.load(Ordering::Relaxed),
            empty_kernel_runs: self.counters.empty_kernel_runs.load(Ordering::Relaxed),
            kernel_device_ns: self.context.kernel_device_ns(),
        }
    }
}
