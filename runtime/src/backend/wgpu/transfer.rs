//! Transfers on a wgpu device: writes, reads through a mappable staging
//! buffer, and device copies. Each is done on the device when it returns.
//! Copies need 4-byte aligned ends; unaligned bytes go through the host.
//! A staging buffer that fails to map fails only its read.

use std::sync::mpsc;

use super::context::GpuContext;
use super::slice::GpuSlice;
use crate::backend::stream::{KernelFault, ReadError};

/// The 4-byte aligned range covering `slice`: (offset, size).
fn covering(slice: &GpuSlice) -> (u64, u64) {
    let start = slice.offset & !3;
    let end = (slice.offset + slice.size).next_multiple_of(4);
    (start, end - start)
}

fn aligned(slice: &GpuSlice) -> bool {
    (slice.offset | slice.size) % 4 == 0
}

impl GpuContext {
    /// Writes `data` (as long as `target`) to `target`.
    pub(super) fn write(&self, target: &GpuSlice, data: &[u8]) -> Result<(), KernelFault> {
        if data.is_empty() {
            return Ok(());
        }
        if aligned(target) {
            self.queue.write_buffer(&target.buffer, target.offset, data);
        } else {
            // Keep the bytes around the target as they are.
            let (start, size) = covering(target);
            let whole = target.part(0, 0);
            let whole = GpuSlice {
                offset: start,
                size,
                ..whole
            };
            let mut bytes = self.read(&whole).map_err(ReadError::into_fault)?;
            let lead = (target.offset - start) as usize;
            bytes[lead..lead + data.len()].copy_from_slice(data);
            self.queue.write_buffer(&target.buffer, start, &bytes);
        }
        // Staged writes reach the device with the next submission.
        self.submit_all(self.encoder())
    }

    /// The bytes of `source`. A map that fails is `ReadError::Failed`: the
    /// staging buffer is this read's own, so nothing stale is ever answered.
    pub(super) fn read(&self, source: &GpuSlice) -> Result<Vec<u8>, ReadError> {
        if source.size == 0 {
            return Ok(Vec::new());
        }
        let (start, size) = covering(source);
        let staging = self.device.create_buffer(&::wgpu::BufferDescriptor {
            label: Some("cistern read"),
            size,
            usage: ::wgpu::BufferUsages::MAP_READ | ::wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self.encoder();
        encoder.copy_buffer_to_buffer(&source.buffer, start, &staging, 0, size);
        self.submit_all(encoder)?;
        #[cfg(test)]
        if self.faults.take_unmappable_read() {
            staging.destroy();
        }
        let map_failed = |e: String| ReadError::Failed(format!("mapping a read: {e}"));
        let (mapped, wait) = mpsc::channel();
        // Scopes are per thread: a map refused at once is this read's error.
        let scope = self
            .device
            .push_error_scope(::wgpu::ErrorFilter::Validation);
        staging.map_async(::wgpu::MapMode::Read, .., move |result| {
            let _ = mapped.send(result);
        });
        let refused = pollster::block_on(scope.pop());
        self.device
            .poll(::wgpu::PollType::wait_indefinitely())
            .map_err(|e| KernelFault::Device(format!("waiting for a read: {e}")))?;
        self.lost()?;
        match (wait.recv(), refused) {
            (Ok(Ok(())), None) => {}
            (_, Some(error)) => return Err(map_failed(error.to_string())),
            (Ok(Err(error)), None) => return Err(map_failed(error.to_string())),
            (Err(_), None) => return Err(map_failed("the map callback never ran".into())),
        }
        let lead = (source.offset - start) as usize;
        let bytes = {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| map_failed(e.to_string()))?;
            view[lead..lead + source.size as usize].to_vec()
        };
        staging.unmap();
        Ok(bytes)
    }

    /// Copies `source` to `target` (same size, not overlapping).
    pub(super) fn copy(&self, source: &GpuSlice, target: &GpuSlice) -> Result<(), KernelFault> {
        if source.size != target.size {
            return Err(KernelFault::Malformed("copy sizes differ".into()));
        }
        if source.size == 0 {
            return Ok(());
        }
        if !(aligned(source) && aligned(target)) {
            let bytes = self.read(source).map_err(ReadError::into_fault)?;
            return self.write(target, &bytes);
        }
        let mut encoder = self.encoder();
        self.encode_copy(&mut encoder, source, target);
        self.submit_all(encoder)
    }

    /// Records an aligned copy; within one buffer it goes through a
    /// temporary one (a copy may not read and write one buffer).
    pub(super) fn encode_copy(
        &self,
        encoder: &mut ::wgpu::CommandEncoder,
        source: &GpuSlice,
        target: &GpuSlice,
    ) {
        let size = source.size;
        if source.buffer == target.buffer {
            let temporary = self.device.create_buffer(&::wgpu::BufferDescriptor {
                label: Some("cistern copy"),
                size,
                usage: ::wgpu::BufferUsages::COPY_SRC | ::wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            encoder.copy_buffer_to_buffer(&source.buffer, source.offset, &temporary, 0, size);
            encoder.copy_buffer_to_buffer(&temporary, 0, &target.buffer, target.offset, size);
        } else {
            encoder.copy_buffer_to_buffer(
                &source.buffer,
                source.offset,
                &target.buffer,
                target.offset,
                size,
            );
        }
    }
}

/// Reads a unit test makes fail: their staging buffer is destroyed before
/// it is mapped, so wgpu itself refuses the map.
#[cfg(test)]
#[derive(Debug, Default)]
pub(super) struct TransferFaults {
    unmappable_reads: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
impl TransferFaults {
    fn take_unmappable_read(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.unmappable_reads
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use cistern_memory::StreamId;

    use super::super::context::GpuContext;
    use super::super::stream::{Counters, WgpuStream};
    use super::*;
    use crate::backend::stream::{DeviceHealth, Job, StreamProgress, StreamRunner, Work};
    use crate::error::ServerError;
    use crate::sync::{oneshot, unbounded};
    use cistern_memory::ErrorCode;

    fn context() -> Option<Arc<GpuContext>> {
        GpuContext::for_tests().map(Arc::new)
    }

    /// A buffer of `bytes` on `context`.
    pub(in super::super) fn slice_of(context: &GpuContext, bytes: &[u8]) -> GpuSlice {
        let buffer = context.device.create_buffer(&::wgpu::BufferDescriptor {
            label: Some("test"),
            size: bytes.len() as u64,
            usage: ::wgpu::BufferUsages::STORAGE
                | ::wgpu::BufferUsages::COPY_SRC
                | ::wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let slice = GpuSlice {
            buffer,
            offset: 0,
            size: bytes.len() as u64,
        };
        assert!(context.write(&slice, bytes).is_ok());
        slice
    }

    fn read_on(
        runner: &mut StreamRunner<WgpuStream>,
        sequence: u64,
        source: &GpuSlice,
    ) -> Result<Vec<u8>, ServerError> {
        let (reply, answer) = oneshot();
        let task = Work::Read {
            source: source.clone(),
            reply,
        };
        runner.execute(Job { sequence, task });
        answer.recv().unwrap_or_else(|_| {
            Err(ServerError::TransferFailed {
                message: "no answer".into(),
            })
        })
    }

    #[test]
    fn a_read_whose_map_fails_is_transfer_failed_and_the_next_read_is_fresh() {
        let Some(context) = context() else { return };
        let first = slice_of(&context, &[1u8; 256]);
        context.faults.unmappable_reads.store(1, Ordering::Relaxed);
        let failed = context.read(&first);
        assert!(matches!(failed, Err(ReadError::Failed(_))), "{failed:?}");
        // Not lost, nothing left uncaptured: the next read maps, with today's bytes.
        assert!(context.write(&first, &[2u8; 256]).is_ok());
        assert_eq!(context.read(&first), Ok(vec![2u8; 256]));
    }

    #[test]
    fn a_stream_answers_a_failed_map_with_transfer_failed_and_stays_healthy() {
        let Some(context) = context() else { return };
        let source = slice_of(&context, &[7u8; 64]);
        let health = Arc::new(DeviceHealth::new(0));
        let (completions, _completed) = unbounded();
        let device = WgpuStream {
            context: context.clone(),
            counters: Arc::new(Counters::default()),
        };
        let progress = Arc::new(StreamProgress::default());
        let mut runner =
            StreamRunner::new(StreamId(1), device, health.clone(), completions, progress);
        context.faults.unmappable_reads.store(1, Ordering::Relaxed);
        let failed = read_on(&mut runner, 1, &source);
        assert_eq!(failed.map_err(|e| e.code()), Err(ErrorCode::TransferFailed));
        assert!(!health.is_faulted(), "a failed map poisoned the device");
        assert_eq!(read_on(&mut runner, 2, &source).ok(), Some(vec![7u8; 64]));
    }
}
