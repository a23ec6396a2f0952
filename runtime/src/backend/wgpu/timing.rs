//! Kernel timings from timestamp queries, where the adapter has
//! `TIMESTAMP_QUERY` (requested then, never required): each launch's passes
//! are bracketed by two timestamps, read back after its submission. Without
//! the feature there are no timings (`None`), and nothing fails.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use crate::sync::Mutex;

/// Bytes of a launch's two resolved timestamps.
const SPAN_BYTES: u64 = 2 * ::wgpu::QUERY_SIZE as u64;

/// A device's timestamp queries and the device time they have measured.
#[derive(Debug)]
pub(super) struct Timestamps {
    /// Nanoseconds per timestamp tick.
    period_ns: f64,
    /// The sum of every launch's measured time.
    total_ns: AtomicU64,
    /// The last launch's (start, end), in nanoseconds on the device's clock.
    last: Mutex<Option<(u64, u64)>>,
}

/// One launch's two timestamps, with the buffers they are read back through.
pub(super) struct Span {
    queries: ::wgpu::QuerySet,
    resolved: ::wgpu::Buffer,
    staging: ::wgpu::Buffer,
}

impl Timestamps {
    /// Timestamps on `device`, or `None` where it was opened without them.
    pub(super) fn of(device: &::wgpu::Device, queue: &::wgpu::Queue) -> Option<Timestamps> {
        device
            .features()
            .contains(::wgpu::Features::TIMESTAMP_QUERY)
            .then(|| Timestamps {
                period_ns: f64::from(queue.get_timestamp_period()),
                total_ns: AtomicU64::new(0),
                last: Mutex::new(None),
            })
    }

    /// A fresh span for one launch.
    pub(super) fn span(&self, device: &::wgpu::Device) -> Span {
        let buffer = |label, usage| {
            device.create_buffer(&::wgpu::BufferDescriptor {
                label: Some(label),
                size: SPAN_BYTES,
                usage,
                mapped_at_creation: false,
            })
        };
        use ::wgpu::BufferUsages as Usage;
        Span {
            queries: device.create_query_set(&::wgpu::QuerySetDescriptor {
                label: Some("cistern timestamps"),
                ty: ::wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolved: buffer("cistern timestamps", Usage::QUERY_RESOLVE | Usage::COPY_SRC),
            staging: buffer("cistern timestamps read", Usage::MAP_READ | Usage::COPY_DST),
        }
    }

    /// Adds `span`'s time, once its submission is done. A span that cannot
    /// be read, or whose end precedes its start, adds nothing: a timing is
    /// never a launch's failure.
    pub(super) fn record(&self, device: &::wgpu::Device, span: &Span) {
        let Some((start, end)) = read_span(device, span) else {
            return;
        };
        let nanos = |ticks: u64| (ticks as f64 * self.period_ns) as u64;
        let (start, end) = (nanos(start), nanos(end));
        *self.last.lock() = Some((start, end));
        if end >= start {
            self.total_ns.fetch_add(end - start, Ordering::Relaxed);
        }
    }

    /// Device time of every launch timed so far, in nanoseconds.
    pub(super) fn total_ns(&self) -> u64 {
        self.total_ns.load(Ordering::Relaxed)
    }

    /// The last launch's (start, end) in nanoseconds, once one was timed.
    #[cfg(test)]
    pub(super) fn last(&self) -> Option<(u64, u64)> {
        *self.last.lock()
    }
}

impl Span {
    /// The timestamp writes of a pass: a start for the first, an end for the last.
    pub(super) fn writes(
        &self,
        first: bool,
        last: bool,
    ) -> Option<::wgpu::ComputePassTimestampWrites<'_>> {
        (first || last).then_some(::wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: first.then_some(0),
            end_of_pass_write_index: last.then_some(1),
        })
    }

    /// Records the resolution of both timestamps into the staging buffer.
    pub(super) fn resolve(&self, encoder: &mut ::wgpu::CommandEncoder) {
        encoder.resolve_query_set(&self.queries, 0..2, &self.resolved, 0);
        encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.staging, 0, SPAN_BYTES);
    }
}

/// The two ticks of a span whose submission is done; `None` if it does not map.
fn read_span(device: &::wgpu::Device, span: &Span) -> Option<(u64, u64)> {
    let (mapped, wait) = mpsc::channel();
    span.staging
        .map_async(::wgpu::MapMode::Read, .., move |result| {
            let _ = mapped.send(result);
        });
    device.poll(::wgpu::PollType::wait_indefinitely()).ok()?;
    wait.recv().ok()?.ok()?;
    let ticks = {
        let view = span.staging.slice(..).get_mapped_range().ok()?;
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(view.get(at..at + 8)?.try_into().ok()?))
        };
        (word(0)?, word(8)?)
    };
    span.staging.unmap();
    Some(ticks)
}

impl super::context::GpuContext {
    /// Device time of the kernels run, where the device takes timestamps.
    pub(super) fn kernel_device_ns(&self) -> Option<u64> {
        self.timestamps.as_ref().map(Timestamps::total_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::GpuContext;
    use super::super::kernels::Plan;
    use super::super::transfer::tests::slice_of;
    use crate::backend::stream::BoundLaunch;
    use crate::kernel::Kernel;

    /// Runs a fill over 4096 floats on `context`.
    fn fill(context: &GpuContext, value: f32) {
        let launch = BoundLaunch {
            kernel: Kernel::map(cistern_kernels::MapOp::Fill, &[value]),
            bindings: vec![slice_of(context, &[0u8; 4 << 12])],
        };
        match context.plan(&launch) {
            Ok(Plan::Dispatches(dispatches)) => assert!(context.run_now(&dispatches).is_ok()),
            other => panic!("a fill plans dispatches: {:?}", other.err()),
        }
    }

    #[test]
    fn kernel_timings_are_ordered_with_timestamp_queries_and_absent_without() {
        let Some(context) = GpuContext::for_tests() else {
            return;
        };
        let offered = context
            .device
            .features()
            .contains(::wgpu::Features::TIMESTAMP_QUERY);
        fill(&context, 1.0);
        let Some(timestamps) = &context.timestamps else {
            assert!(!offered);
            assert_eq!(context.kernel_device_ns(), None);
            return;
        };
        let first = timestamps.last();
        assert!(first.is_some_and(|(start, end)| start <= end), "{first:?}");
        fill(&context, 2.0);
        let second = timestamps.last();
        assert!(
            second.is_some_and(|(start, end)| start <= end),
            "{second:?}"
        );
        let (Some((_, first_end)), Some((second_start, _))) = (first, second) else {
            return;
        };
        assert!(
            first_end <= second_start,
            "a later launch started before an earlier one ended"
        );
        assert!(context.kernel_device_ns().is_some());
    }
}
