//! `Dispatch`: one compute dispatch with its bindings and parameters, and
//! the rules every launch follows to make them: a binding starts at an
//! aligned offset with its first element `base` elements in, no binding is
//! larger than the device's largest storage binding (element-wise work is
//! cut into chunks of bindings), and a 1D grid past the per-dimension limit
//! is folded into two dimensions.

use std::num::NonZeroU64;

use ::wgpu::util::DeviceExt;

use super::context::GpuContext;
use super::pipelines::{Entry, TABLE_BINDING};
use super::slice::GpuSlice;
use super::timing::Span;
use crate::backend::stream::LaunchError;
use crate::error::ServerError;

/// Invocations per workgroup of every 1D entry point.
pub(super) const WORKGROUP: u64 = 256;

/// Items (elements, or vec4s) each invocation of a streaming entry point
/// handles: `PER_INVOCATION` in common.wgsl, which must match.
pub(super) const PER_INVOCATION: u32 = 8;

/// The parameters of one dispatch, as the prelude's `Params` reads them:
/// `u[0]` the elements, `u[1..=6]` each binding's base, `u[7]` an op code.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Params {
    pub(super) u: [u32; 16],
    pub(super) f: [f32; 16],
}

impl Params {
    /// Parameters with op code `op` and the floats `floats` from `f[0]`.
    pub(super) fn new(op: u32, floats: &[f32]) -> Self {
        let mut params = Params::default();
        params.u[7] = op;
        for (slot, value) in params.f.iter_mut().zip(floats) {
            *slot = *value;
        }
        params
    }

    fn bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(128);
        self.u.iter().for_each(|u| bytes.extend(u.to_le_bytes()));
        self.f.iter().for_each(|f| bytes.extend(f.to_le_bytes()));
        bytes
    }
}

/// A bound range: the buffer from an aligned offset.
#[derive(Clone, Debug)]
pub(super) struct Window {
    buffer: ::wgpu::Buffer,
    offset: u64,
    size: u64,
    /// Elements from the bound offset to the slice's first one.
    base: u32,
}

impl Window {
    /// Whether a vec4 module may bind this window: it starts at a 16-byte
    /// offset, a multiple of 4 elements before the slice, and its length is
    /// a multiple of 16 bytes.
    pub(super) fn vec4_aligned(&self) -> bool {
        self.offset % 16 == 0 && self.base % 4 == 0 && self.size % 16 == 0
    }
}

/// One compute dispatch, ready to encode.
#[derive(Debug)]
pub(super) struct Dispatch {
    pub(super) entry: Entry,
    pub(super) windows: Vec<Window>,
    pub(super) table: Option<::wgpu::Buffer>,
    pub(super) params: Params,
    pub(super) groups: [u32; 3],
}

/// A launch that cannot run here: refused, nothing ran.
pub(super) fn unsupported(what: impl Into<String>) -> ServerError {
    ServerError::UnsupportedOperation {
        operation: what.into(),
    }
}

impl GpuContext {
    /// The window binding all of `slice`, if it fits one binding.
    pub(super) fn window(&self, slice: &GpuSlice) -> Result<Window, ServerError> {
        let window = self.window_of(slice);
        if window.size > self.max_binding {
            return Err(unsupported(format!(
                "a binding of {} bytes on a device whose largest storage binding is {} bytes",
                slice.size, self.max_binding
            )));
        }
        Ok(window)
    }

    fn window_of(&self, slice: &GpuSlice) -> Window {
        if slice.size == 0 {
            return self.zero_window();
        }
        let offset = slice.offset & !(self.offset_alignment - 1);
        let lead = slice.offset - offset;
        let size = (lead + slice.size).next_multiple_of(4);
        Window {
            buffer: slice.buffer.clone(),
            offset,
            size,
            base: (lead / 4) as u32,
        }
    }

    /// The window of an absent buffer: zeros, never written.
    pub(super) fn zero_window(&self) -> Window {
        Window {
            buffer: self.zero.clone(),
            offset: 0,
            size: 16,
            base: 0,
        }
    }

    /// Elements per chunk of element-wise work: one binding's worth.
    pub(super) fn chunk_elements(&self) -> u64 {
        let usable = self.max_binding.saturating_sub(self.offset_alignment) / 4;
        (usable / WORKGROUP * WORKGROUP).max(WORKGROUP)
    }

    /// Workgroups for `items` work items of a 1D entry point, folded into
    /// two dimensions past the per-dimension limit.
    pub(super) fn groups_for(&self, items: u64) -> Result<[u32; 3], ServerError> {
        let groups = items.div_ceil(WORKGROUP).max(1);
        let limit = u64::from(self.max_groups);
        let (x, y) = if groups <= limit {
            (groups, 1)
        } else {
            (limit, groups.div_ceil(limit))
        };
        match (u32::try_from(x), u32::try_from(y)) {
            (Ok(x), Ok(y)) if y <= self.max_groups => Ok([x, y, 1]),
            _ => Err(unsupported(format!("a grid of {groups} workgroups"))),
        }
    }

    /// Dispatches of `entry` over `n` elements of `chunked` slices (each of
    /// at least `n` elements), in chunks of one binding each; `whole`
    /// slices are bound entire after them (a flag), and `params` gets the
    /// chunk's element count and bases.
    pub(super) fn elementwise(
        &self,
        entry: Entry,
        chunked: &[&GpuSlice],
        whole: &[Window],
        n: u64,
        params: Params,
    ) -> Result<Vec<Dispatch>, ServerError> {
        let chunk = self.chunk_elements();
        let mut dispatches = Vec::new();
        let mut first = 0;
        let windows_of = |from: u64, count: u64| -> Result<Vec<Window>, ServerError> {
            let mut windows: Vec<Window> = chunked
                .iter()
                .map(|slice| self.window(&slice.part(4 * from, 4 * count)))
                .collect::<Result<_, _>>()?;
            windows.extend(whole.iter().cloned());
            Ok(windows)
        };
        while first < n {
            let elements = chunk.min(n - first);
            dispatches.extend(self.streamed(entry, params, first, elements, &windows_of)?);
            first += elements;
        }
        Ok(dispatches)
    }

    /// The dispatches of `entry` over `elements` from `first`, whose windows
    /// `windows_of(first, count)` makes: the multiple-of-4 bulk through its
    /// vec4 twin where it has one and every window the twin streams is
    /// [`Window::vec4_aligned`], the rest (the tail, or all of it) scalar.
    pub(super) fn streamed(
        &self,
        entry: Entry,
        params: Params,
        first: u64,
        elements: u64,
        windows_of: &dyn Fn(u64, u64) -> Result<Vec<Window>, ServerError>,
    ) -> Result<Vec<Dispatch>, ServerError> {
        let mut dispatches = Vec::with_capacity(2);
        let mut scalar_from = 0;
        let bulk = elements & !3;
        if let Some(twin) = entry.vec4().filter(|_| bulk > 0) {
            let windows = windows_of(first, bulk)?;
            let aligned = (1..)
                .zip(&windows)
                .all(|(binding, window)| twin.module.binds_f32s(binding) || window.vec4_aligned());
            if aligned {
                dispatches.push(self.dispatch(twin, windows, None, params, bulk)?);
                scalar_from = bulk;
            }
        }
        if scalar_from < elements {
            let rest = elements - scalar_from;
            let windows = windows_of(first + scalar_from, rest)?;
            dispatches.push(self.dispatch(entry, windows, None, params, rest)?);
        }
        Ok(dispatches)
    }

    /// One dispatch of `entry` over `items` work items (1D, folded).
    pub(super) fn dispatch(
        &self,
        entry: Entry,
        windows: Vec<Window>,
        table: Option<::wgpu::Buffer>,
        mut params: Params,
        items: u64,
    ) -> Result<Dispatch, ServerError> {
        params.u[0] = u32::try_from(items)
            .map_err(|_| unsupported(format!("{items} work items in one dispatch")))?;
        let groups = self.groups_for(items.div_ceil(u64::from(entry.per_invocation.max(1))))?;
        Ok(Dispatch {
            entry,
            windows,
            table,
            params,
            groups,
        })
    }

    /// A storage buffer holding `words`, for a table binding.
    pub(super) fn table(&self, words: &[u32]) -> ::wgpu::Buffer {
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        if bytes.is_empty() {
            bytes.resize(4, 0);
        }
        self.device
            .create_buffer_init(&::wgpu::util::BufferInitDescriptor {
                label: Some("cistern table"),
                contents: &bytes,
                usage: ::wgpu::BufferUsages::STORAGE,
            })
    }

    /// Runs `dispatches` in order in one submission and waits for them. A
    /// validation error is the launch's own (`KernelLaunchFailed`); a lost
    /// or hung device is a fault.
    pub(super) fn run_now(&self, dispatches: &[Dispatch]) -> Result<(), LaunchError> {
        let Some(first) = dispatches.first() else {
            return Ok(());
        };
        let mut encoder = self.encoder();
        let span = self.timestamps.as_ref().map(|t| t.span(&self.device));
        self.encode_timed(&mut encoder, dispatches, span.as_ref())
            .map_err(LaunchError::Refused)?;
        if let Some(span) = &span {
            span.resolve(&mut encoder);
        }
        self.submit(encoder).map_err(|error| match error {
            Ok(message) => LaunchError::Refused(ServerError::KernelLaunchFailed {
                kernel: first.entry.name.to_string(),
                message,
            }),
            Err(fault) => LaunchError::Fault(fault),
        })?;
        if let (Some(timestamps), Some(span)) = (&self.timestamps, span) {
            timestamps.record(&self.device, &span);
        }
        Ok(())
    }

    /// Records `dispatches` into `encoder`, in order.
    pub(super) fn encode(
        &self,
        encoder: &mut ::wgpu::CommandEncoder,
        dispatches: &[Dispatch],
    ) -> Result<(), ServerError> {
        self.encode_timed(encoder, dispatches, None)
    }

    /// As [`GpuContext::encode`], the first pass's start and the last
    /// pass's end written to `span`'s timestamps.
    fn encode_timed(
        &self,
        encoder: &mut ::wgpu::CommandEncoder,
        dispatches: &[Dispatch],
        span: Option<&Span>,
    ) -> Result<(), ServerError> {
        let last = dispatches.len().saturating_sub(1);
        for (index, dispatch) in dispatches.iter().enumerate() {
            let compiled = self.pipelines.get(&self.device, dispatch.entry)?;
            let mut params = dispatch.params;
            for (slot, window) in params.u[1..=6].iter_mut().zip(&dispatch.windows) {
                *slot = window.base;
            }
            let uniform = self
                .device
                .create_buffer_init(&::wgpu::util::BufferInitDescriptor {
                    label: Some("cistern params"),
                    contents: &params.bytes(),
                    usage: ::wgpu::BufferUsages::UNIFORM,
                });
            let mut entries = vec![::wgpu::BindGroupEntry {
                binding: 0,
                resource: uniform.as_entire_binding(),
            }];
            for (binding, window) in (1..).zip(&dispatch.windows) {
                entries.push(::wgpu::BindGroupEntry {
                    binding,
                    resource: ::wgpu::BindingResource::Buffer(::wgpu::BufferBinding {
                        buffer: &window.buffer,
                        offset: window.offset,
                        size: NonZeroU64::new(window.size),
                    }),
                });
            }
            if let Some(table) = &dispatch.table {
                entries.push(::wgpu::BindGroupEntry {
                    binding: TABLE_BINDING,
                    resource: table.as_entire_binding(),
                });
            }
            let group = self.device.create_bind_group(&::wgpu::BindGroupDescriptor {
                label: None,
                layout: &compiled.layout,
                entries: &entries,
            });
            let timestamp_writes = span.and_then(|span| span.writes(index == 0, index == last));
            let mut pass = encoder.begin_compute_pass(&::wgpu::ComputePassDescriptor {
                label: Some(dispatch.entry.name),
                timestamp_writes,
            });
            pass.set_pipeline(&compiled.pipeline);
            pass.set_bind_group(0, &group, &[]);
            let [x, y, z] = dispatch.groups;
            pass.dispatch_workgroups(x, y, z);
        }
        Ok(())
    }
}
