//! Transfers on a wgpu device: writes, reads through a mappable staging
//! buffer, and device copies. Each is done on the device when it returns.
//! Copies need 4-byte aligned ends; unaligned bytes go through the host.

use std::sync::mpsc;

use super::context::GpuContext;
use super::slice::GpuSlice;
use crate::backend::stream::KernelFault;

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
            let mut bytes = self.read(&whole)?;
            let lead = (target.offset - start) as usize;
            bytes[lead..lead + data.len()].copy_from_slice(data);
            self.queue.write_buffer(&target.buffer, start, &bytes);
        }
        // Staged writes reach the device with the next submission.
        self.submit_all(self.encoder())
    }

    /// The bytes of `source`.
    pub(super) fn read(&self, source: &GpuSlice) -> Result<Vec<u8>, KernelFault> {
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
        let (mapped, wait) = mpsc::channel();
        staging.map_async(::wgpu::MapMode::Read, .., move |result| {
            let _ = mapped.send(result);
        });
        self.device
            .poll(::wgpu::PollType::wait_indefinitely())
            .map_err(|e| KernelFault::Device(format!("waiting for a read: {e}")))?;
        let map_failed = |e: String| KernelFault::Device(format!("mapping a read: {e}"));
        match wait.recv() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(map_failed(error.to_string())),
            Err(_) => return Err(map_failed("the map callback never ran".into())),
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
            let bytes = self.read(source)?;
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
