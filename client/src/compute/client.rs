//! `ComputeClient`: opens a device and sends it commands.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cistern_runtime::{
    AllocationPolicy, Command, CompactionReport, DEFAULT_STREAM, Device, DeviceOptions,
    DeviceState, FailureToken, KernelLaunch, MemorySnapshot, MemoryStats, ServerError,
    ServerHandle, ServerStats, StreamId, StridedCopy,
};

use super::{Buffer, Event};

/// What every clone of a client, and every handle it made, shares.
#[derive(Debug)]
pub(crate) struct ClientShared {
    pub(crate) server: ServerHandle,
    /// Reads and syncs sent: the calls that wait for a stream.
    stream_waits: AtomicU64,
}

/// A device's client: cheap to clone, `Send + Sync`, every failure a
/// [`ServerError`].
///
/// Each [`open`](ComputeClient::open) starts a server of its own; clones
/// share it. Work is asynchronous per stream: launches return before the
/// kernel runs (their failures reach the launch's [`FailureToken`] and the
/// stream's next [`sync`](ComputeClient::sync)); reads and syncs wait for
/// the stream to reach them. The server stops when the last clone and the
/// last handle it made are dropped.
#[derive(Clone, Debug)]
pub struct ComputeClient {
    shared: Arc<ClientShared>,
}

impl ComputeClient {
    /// Opens `device`. A device that is not present is `DeviceUnavailable`.
    pub fn open(device: Device, options: DeviceOptions) -> Result<Self, ServerError> {
        cistern_runtime::open(device, options).map(ComputeClient::of_server)
    }

    /// A client of a server already started (`cistern_runtime::spawn`),
    /// such as one over the test device (`cistern_runtime::testing`).
    pub fn of_server(server: ServerHandle) -> Self {
        ComputeClient {
            shared: Arc::new(ClientShared {
                server,
                stream_waits: AtomicU64::new(0),
            }),
        }
    }

    /// The device this client drives.
    pub fn device(&self) -> Device {
        self.shared.server.device()
    }

    /// The device context's (generation, health) as the server last
    /// published it, read without a round trip: check it before work whose
    /// handles must be current (a training step), and take fresh handles
    /// when the generation moved on.
    pub fn device_state(&self) -> DeviceState {
        self.shared.server.device_state()
    }

    /// The stream every server starts with.
    pub fn default_stream(&self) -> StreamId {
        DEFAULT_STREAM
    }

    /// Reserves `size` bytes for the default stream.
    pub fn reserve(&self, size: u64) -> Result<Buffer, ServerError> {
        self.reserve_with(size, AllocationPolicy::Allow, DEFAULT_STREAM)
    }

    /// Reserves `size` bytes under `policy` for `stream` (`DryRun` backs the
    /// memory on first use).
    pub fn reserve_with(
        &self,
        size: u64,
        policy: AllocationPolicy,
        stream: StreamId,
    ) -> Result<Buffer, ServerError> {
        let reservation = self.shared.server.call(|reply| Command::Reserve {
            size,
            policy,
            stream,
            reply,
        })?;
        Ok(Buffer::new(
            reservation.buffer,
            reservation.size,
            self.shared.clone(),
        ))
    }

    /// Reserves a buffer holding `bytes`, written in order on the default
    /// stream; any stream may use it at once (the server orders the use
    /// after the write).
    pub fn upload(&self, bytes: &[u8]) -> Result<Buffer, ServerError> {
        let buffer = self.reserve(bytes.len() as u64)?;
        self.write(&buffer, 0, bytes)?;
        Ok(buffer)
    }

    /// Reserves a buffer holding `values`, written in order on the default
    /// stream (see [`ComputeClient::upload`]).
    pub fn upload_f32(&self, values: &[f32]) -> Result<Buffer, ServerError> {
        self.upload(&f32_bytes(values))
    }

    /// Writes `bytes` at `offset` of `buffer`, in order on the default stream.
    pub fn write(&self, buffer: &Buffer, offset: u64, bytes: &[u8]) -> Result<(), ServerError> {
        self.write_on(DEFAULT_STREAM, buffer, offset, bytes)
    }

    /// Writes `values` at byte `offset` of `buffer`, on the default stream.
    pub fn write_f32(
        &self,
        buffer: &Buffer,
        offset: u64,
        values: &[f32],
    ) -> Result<(), ServerError> {
        self.write(buffer, offset, &f32_bytes(values))
    }

    /// Writes `bytes` at `offset` of `buffer`, in order on `stream`;
    /// returns once queued.
    pub fn write_on(
        &self,
        stream: StreamId,
        buffer: &Buffer,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), ServerError> {
        self.write_shared_on(stream, buffer, offset, Arc::new(bytes.to_vec()))
    }

    /// [`write_on`](Self::write_on) of bytes the caller shares: the command
    /// carries them as they are, with no copy on the host, so one buffer
    /// may be written to several devices (or again, after a failed
    /// transfer).
    pub fn write_shared_on(
        &self,
        stream: StreamId,
        buffer: &Buffer,
        offset: u64,
        data: Arc<Vec<u8>>,
    ) -> Result<(), ServerError> {
        self.check_owner(buffer)?;
        let target = buffer.region(offset, data.len() as u64);
        self.shared.server.call(|reply| Command::Write {
            stream,
            target,
            data,
            reply,
        })
    }

    /// Reads `size` bytes at `offset` of `buffer` once the default stream reaches the read.
    pub fn read(&self, buffer: &Buffer, offset: u64, size: u64) -> Result<Vec<u8>, ServerError> {
        self.read_on(DEFAULT_STREAM, buffer, offset, size)
    }

    /// Reads `size` bytes at `offset` of `buffer` once `stream` reaches the read.
    pub fn read_on(
        &self,
        stream: StreamId,
        buffer: &Buffer,
        offset: u64,
        size: u64,
    ) -> Result<Vec<u8>, ServerError> {
        self.check_owner(buffer)?;
        let source = buffer.region(offset, size);
        self.count_stream_wait();
        self.shared.server.call(|reply| Command::Read {
            stream,
            source,
            reply,
        })
    }

    /// All of `buffer`'s bytes, read on the default stream.
    pub fn download(&self, buffer: &Buffer) -> Result<Vec<u8>, ServerError> {
        self.read(buffer, 0, buffer.size())
    }

    /// All of `buffer` as `f32`s, read on the default stream; its size must
    /// be a multiple of 4.
    pub fn download_f32(&self, buffer: &Buffer) -> Result<Vec<f32>, ServerError> {
        if buffer.size() % 4 != 0 {
            return Err(ServerError::InvalidArgument {
                message: format!("a buffer of {} bytes does not hold f32s", buffer.size()),
            });
        }
        Ok(bytes_f32(&self.download(buffer)?))
    }

    /// Copies `size` bytes between buffers, in order on `stream`; returns once queued.
    pub fn copy(
        &self,
        stream: StreamId,
        (source, source_offset): (&Buffer, u64),
        (target, target_offset): (&Buffer, u64),
        size: u64,
    ) -> Result<(), ServerError> {
        self.check_owner(source)?;
        self.check_owner(target)?;
        let (source, target) = (
            source.region(source_offset, size),
            target.region(target_offset, size),
        );
        self.shared.server.call(|reply| Command::Copy {
            stream,
            source: Box::new(source),
            target: Box::new(target),
            reply,
        })
    }

    /// A strided copy (build `copy` from [`Buffer::reference`]s), in order
    /// on `stream`; `UnsupportedStrides` if the backend declines the pattern.
    pub fn strided_copy(&self, stream: StreamId, copy: StridedCopy) -> Result<(), ServerError> {
        self.shared.server.call(|reply| Command::StridedCopy {
            stream,
            copy: Box::new(copy),
            reply,
        })
    }

    /// Launches a kernel on `stream` and returns before it runs. A failure
    /// is latched on the stream: the stream's next [`sync`](Self::sync) returns it.
    pub fn launch(&self, stream: StreamId, launch: KernelLaunch) -> Result<(), ServerError> {
        self.shared.server.send(Command::Launch {
            stream,
            launch,
            token: None,
        })
    }

    /// Launches a kernel on `stream`; the returned token says when it ran or
    /// why it failed (the failure is also latched on the stream).
    pub fn launch_tracked(
        &self,
        stream: StreamId,
        launch: KernelLaunch,
    ) -> Result<FailureToken, ServerError> {
        let token = FailureToken::new();
        self.shared.server.send(Command::Launch {
            stream,
            launch,
            token: Some(token.clone()),
        })?;
        Ok(token)
    }

    /// Launches kernels as one command: all are checked before any runs, and
    /// a failure stops the rest. The token settles when all ran or one failed.
    pub fn launch_batch(
        &self,
        stream: StreamId,
        launches: Vec<KernelLaunch>,
    ) -> Result<FailureToken, ServerError> {
        self.launch_batch_requiring(stream, launches, Vec::new())
    }

    /// [`launch_batch`](Self::launch_batch) of kernels that consume the
    /// results of the work behind `requires` (a tape's launches): where any
    /// of it failed, as the stream finds just before the batch would run,
    /// nothing of the batch runs and its token fails with that error.
    pub fn launch_batch_requiring(
        &self,
        stream: StreamId,
        launches: Vec<KernelLaunch>,
        requires: Vec<FailureToken>,
    ) -> Result<FailureToken, ServerError> {
        let token = FailureToken::new();
        self.shared.server.send(Command::LaunchBatch {
            stream,
            launches,
            token: Some(token.clone()),
            requires,
        })?;
        Ok(token)
    }

    /// A new stream, independent of the others.
    pub fn create_stream(&self) -> Result<StreamId, ServerError> {
        self.shared
            .server
            .call(|reply| Command::CreateStream { reply })
    }

    /// Destroys a stream once its queued work has run.
    pub fn destroy_stream(&self, stream: StreamId) -> Result<(), ServerError> {
        self.shared
            .server
            .call(|reply| Command::DestroyStream { stream, reply })
    }

    /// Records an event on `stream`.
    pub fn record_event(&self, stream: StreamId) -> Result<Event, ServerError> {
        let id = self
            .shared
            .server
            .call(|reply| Command::RecordEvent { stream, reply })?;
        Ok(Event::new(id, self.shared.clone()))
    }

    /// Makes `stream` wait for `event` before running its later work.
    pub fn wait_event(&self, stream: StreamId, event: &Event) -> Result<(), ServerError> {
        if !event.belongs_to(&self.shared) {
            return Err(self.mismatch("an event"));
        }
        let event = event.id();
        self.shared.server.call(|reply| Command::WaitEvent {
            stream,
            event,
            reply,
        })
    }

    /// Waits until `stream` has run everything queued before this call;
    /// returns the stream's latched error (clearing it) or the device's fault.
    pub fn sync(&self, stream: StreamId) -> Result<(), ServerError> {
        self.count_stream_wait();
        self.shared
            .server
            .call(|reply| Command::Sync { stream, reply })
    }

    /// The memory manager's counters.
    pub fn memory_stats(&self) -> Result<MemoryStats, ServerError> {
        self.shared
            .server
            .call(|reply| Command::MemoryStats { reply })
    }

    /// Every page and slice.
    pub fn memory_snapshot(&self) -> Result<MemorySnapshot, ServerError> {
        self.shared
            .server
            .call(|reply| Command::MemorySnapshot { reply })
    }

    /// Releases every empty page; returns the bytes released.
    pub fn reclaim(&self) -> Result<u64, ServerError> {
        self.shared.server.call(|reply| Command::Reclaim { reply })
    }

    /// Moves live allocations off sparse pages; handles stay valid.
    pub fn compact(&self) -> Result<CompactionReport, ServerError> {
        self.shared.server.call(|reply| Command::Compact { reply })
    }

    /// What the server has done.
    pub fn server_stats(&self) -> Result<ServerStats, ServerError> {
        self.shared
            .server
            .call(|reply| Command::ServerStats { reply })
    }

    /// The launch log: what the server queued since it last started (sent
    /// alone, batched, or replayed in a graph), in order, as sent;
    /// `keep_logging` starts or keeps it, `false` stops it. Empty when it
    /// was off. For benchmarks that replay a step's kernels alone.
    pub fn take_launch_log(&self, keep_logging: bool) -> Result<Vec<KernelLaunch>, ServerError> {
        self.shared.server.call(|reply| Command::TakeLaunchLog {
            keep_logging,
            reply,
        })
    }

    /// Reads and syncs this client and its clones have sent since it opened:
    /// the calls that wait for a stream to reach them (host
    /// synchronisations). Counted here, on the client side; the server
    /// counts syncs alone (`ServerStats::syncs`).
    pub fn stream_waits(&self) -> u64 {
        self.shared.stream_waits.load(Ordering::Relaxed)
    }

    fn count_stream_wait(&self) {
        self.shared.stream_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Stops the server; every later call of every clone answers `ServerGone`.
    pub fn shutdown(&self) -> Result<(), ServerError> {
        self.shared.server.shutdown()
    }

    /// What every clone shares, for handles made by the client's other modules.
    pub(crate) fn shared(&self) -> &Arc<ClientShared> {
        &self.shared
    }

    /// The server handle, for commands sent by the client's other modules.
    pub(crate) fn server(&self) -> &ServerHandle {
        &self.shared.server
    }

    /// Whether `other` drives the same server (a clone of this client).
    pub(crate) fn same_server(&self, other: &ComputeClient) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    pub(crate) fn check_owner(&self, buffer: &Buffer) -> Result<(), ServerError> {
        if buffer.belongs_to(&self.shared) {
            Ok(())
        } else {
            Err(self.mismatch("a buffer"))
        }
    }

    pub(crate) fn mismatch(&self, what: &str) -> ServerError {
        ServerError::DeviceMismatch {
            expected: format!("{} (server {})", self.device(), self.shared.server.id().0),
            found: format!("{what} of another server"),
        }
    }
}

pub(crate) fn f32_bytes(values: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

pub(crate) fn bytes_f32(bytes: &[u8]) -> Vec<f32> {
    // A copy at memcpy speed, whatever the bytes' alignment; a trailing
    // partial word is dropped, as `chunks_exact` did.
    let words = bytes.len() / 4;
    let mut values = vec![0.0f32; words];
    bytemuck::cast_slice_mut(&mut values).copy_from_slice(&bytes[..words * 4]);
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32s_round_trip_through_bytes() {
        let values = [1.5f32, -0.0, f32::MAX, 3.25];
        assert_eq!(bytes_f32(&f32_bytes(&values)), values);
    }

    #[test]
    fn a_client_is_send_sync_and_clone() {
        fn check<T: Send + Sync + Clone>() {}
        check::<ComputeClient>();
        check::<Buffer>();
    }
}
