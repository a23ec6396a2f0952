//! The server thread: a loop around [`ServerCore`], the handle clients send
//! through, and the record of why the server ended.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cistern_memory::MemoryConfig;

use super::core::{Flow, ServerCore};
use super::published::{DeviceState, PublishedState};
use crate::backend::cpu::{CpuBackend, MAX_CPU_ORDINALS};
use crate::backend::{Backend, Completion};
use crate::command::Command;
use crate::device::DeviceOptions;
use crate::error::ServerError;
use crate::fault::panic_message;
use crate::host::default_cpu_memory_limit;
use crate::ids::Device;
use crate::ids::ServerId;
use crate::sync::{
    Answer, Arc, Condvar, InboxReceiver, InboxSender, Mutex, PATIENCE, Receiver, Reply, Waited,
    inbox, recv_patiently, reply_channel, spin_briefly, thread, unbounded,
};

/// How long a caller whose reply channel disconnected waits for the server
/// thread to record why it ended. The thread records it right after
/// unwinding, so this bound is only reached if it was killed outright.
const END_REASON_WAIT: Duration = Duration::from_secs(5);

/// How often an idle server looks at an invalidate in progress (its drain
/// markers, its probe, its time bound).
const RECOVERY_TICK: Duration = Duration::from_millis(1);

/// Opens a device: starts its server thread with the device's backend.
///
/// A device that is not present is `DeviceUnavailable`.
pub fn open(device: Device, options: DeviceOptions) -> Result<ServerHandle, ServerError> {
    let (completions, completed) = unbounded();
    match device {
        Device::Cpu(ordinal) if ordinal < MAX_CPU_ORDINALS => {
            let (backend, storage) = CpuBackend::new(ordinal, options.cpu_threads, completions)?;
            start(
                backend,
                storage,
                default_cpu_memory_limit(),
                completed,
                options,
            )
        }
        #[cfg(feature = "wgpu")]
        Device::Wgpu(ordinal) => {
            let (backend, storage, limit) =
                crate::backend::wgpu::WgpuBackend::open(ordinal, completions)?;
            start(backend, storage, limit, completed, options)
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(ordinal) => open_cuda(ordinal, completions, completed, options),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(ServerError::CudaUnavailable {
            reason: "built without the `cuda` feature: build with `--features cuda`".into(),
        }),
        other => Err(ServerError::DeviceUnavailable {
            device: other.to_string(),
            reason: match other {
                Device::Cpu(_) => format!(
                    "the CPU is cpu:0 to cpu:{}: each ordinal a share of its cores",
                    MAX_CPU_ORDINALS - 1
                ),
                Device::Wgpu(_) => "built without the `wgpu` feature".to_string(),
                Device::Cuda(_) => "built without the `cuda` feature".to_string(),
            },
        }),
    }
}

/// Opens CUDA device `ordinal`; CUDA that cannot be used is
/// `CudaUnavailable`, an ordinal past its devices `DeviceUnavailable`. The memory limit never exceeds the device's free memory.
#[cfg(feature = "cuda")]
fn open_cuda(
    ordinal: usize,
    completions: crate::sync::Sender<Completion>,
    completed: Receiver<Completion>,
    mut options: DeviceOptions,
) -> Result<ServerHandle, ServerError> {
    use crate::backend::cuda::CudaBackend;
    let (backend, storage, free) = CudaBackend::new(ordinal, completions).map_err(|why| {
        if why.ordinal_absent {
            ServerError::DeviceUnavailable {
                device: Device::Cuda(ordinal).to_string(),
                reason: why.reason,
            }
        } else {
            ServerError::CudaUnavailable { reason: why.reason }
        }
    })?;
    options.memory_limit = Some(options.memory_limit.unwrap_or(free).min(free));
    start(backend, storage, free, completed, options)
}

/// Starts a server over `backend` and `storage`, whose memory limit is
/// `default_limit` unless `options` configure one.
fn start<B: Backend>(
    backend: B,
    storage: B::Storage,
    default_limit: u64,
    completed: Receiver<Completion>,
    options: DeviceOptions,
) -> Result<ServerHandle, ServerError> {
    let core = ServerCore::new(
        next_server_id(),
        backend,
        storage,
        memory_config(&options, default_limit),
        completed,
        options.faults,
    )?
    .with_drain_timeout(options.drain_timeout);
    spawn(core)
}

/// The memory manager's configuration for a device opened with `options`.
fn memory_config(options: &DeviceOptions, default_limit: u64) -> MemoryConfig {
    MemoryConfig {
        virtual_memory: options.virtual_memory,
        ..MemoryConfig::with_limit(options.memory_limit.unwrap_or(default_limit))
    }
}

/// A fresh id for a server of this process.
pub fn next_server_id() -> ServerId {
    // A counter, not a meeting point: std's atomic, so it can be a static.
    static NEXT: AtomicU64 = AtomicU64::new(1);
    ServerId(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Starts a server thread around `core`.
pub fn spawn<B: Backend>(core: ServerCore<B>) -> Result<ServerHandle, ServerError> {
    let device = core.backend().device();
    let id = core.id();
    let state = core.published();
    let (inbox, commands) = inbox();
    let end = Arc::new(ServerEnd::default());
    let thread_end = end.clone();
    thread::Builder::new()
        .name(format!("cistern-{}-server", device).replace(':', ""))
        .spawn(move || serve(core, commands, &thread_end))
        .map_err(|e| ServerError::DeviceUnavailable {
            device: device.to_string(),
            reason: format!("could not start the server thread: {e}"),
        })?;
    Ok(ServerHandle {
        id,
        device,
        inbox,
        end,
        state,
    })
}

fn serve<B: Backend>(mut core: ServerCore<B>, commands: InboxReceiver<Command>, end: &ServerEnd) {
    let ordinal = core.backend().device().ordinal();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut batch = Vec::new();
        loop {
            if commands.take(&mut batch) == 0 {
                if !poll_briefly(&commands) {
                    // About to wait: let the device start what was gathered.
                    core.flush();
                    let tick = core.is_recovering().then_some(RECOVERY_TICK);
                    match commands.wait(PATIENCE, tick) {
                        Waited::Ready => {}
                        Waited::TimedOut => core.tick(Instant::now()),
                        Waited::Abandoned => break,
                    }
                }
                continue;
            }
            for command in batch.drain(..) {
                if core.handle(command) == Flow::Stop {
                    // What followed the shutdown is dropped unanswered:
                    // its callers read why the server ended.
                    return;
                }
                // Under a steady stream of commands the idle tick never
                // comes: a recovery's time bound is checked here too.
                if core.is_recovering() {
                    core.tick(Instant::now());
                }
            }
        }
    }));
    let reason = match outcome {
        Ok(()) => ServerError::ServerGone { ordinal },
        Err(payload) => ServerError::ServerPanicked {
            ordinal,
            message: panic_message(payload.as_ref()),
        },
    };
    tracing::info!(device = ordinal, code = reason.code().stable_id(), %reason, "server ended");
    // Recorded before the inbox closes, so every later send finds it.
    end.record(reason);
    drop(commands);
    // Closes the stream queues: executors run what is queued, then exit.
    drop(core);
}

/// Why a server ended, shared by the server thread and every client.
#[derive(Debug, Default)]
pub struct ServerEnd {
    reason: Mutex<Option<ServerError>>,
    recorded: Condvar,
}

impl ServerEnd {
    /// Why the server ended, if it has.
    pub fn reason(&self) -> Option<ServerError> {
        self.reason.lock().clone()
    }

    /// Why the server ended, waiting for the server thread to record it.
    fn wait(&self, ordinal: usize) -> ServerError {
        let deadline = Instant::now() + END_REASON_WAIT;
        let mut reason = self.reason.lock();
        while reason.is_none() {
            if self.recorded.wait_until(&mut reason, deadline).timed_out() {
                break;
            }
        }
        reason
            .clone()
            .unwrap_or(ServerError::ServerGone { ordinal })
    }

    fn record(&self, error: ServerError) {
        let mut reason = self.reason.lock();
        if reason.is_none() {
            *reason = Some(error);
        }
        self.recorded.notify_all();
    }
}

/// The sending side of a running server. Dropping it shuts the server down
/// (queued work still runs).
#[derive(Debug)]
pub struct ServerHandle {
    id: ServerId,
    device: Device,
    inbox: InboxSender<Command>,
    end: Arc<ServerEnd>,
    state: PublishedState,
}

impl ServerHandle {
    /// The server's id: handles it made name it.
    pub fn id(&self) -> ServerId {
        self.id
    }

    /// The device it owns.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The context's (generation, health) as last published; never waits.
    pub fn device_state(&self) -> DeviceState {
        self.state.read()
    }

    /// Sends a command without waiting (yielding the CPU once first when
    /// thousands of commands already wait). If the server has ended, the
    /// error says why (`ServerPanicked`, `ServerGone`).
    pub fn send(&self, command: Command) -> Result<(), ServerError> {
        if self.inbox.len() > INBOX_BACKLOG {
            thread::yield_now();
        }
        self.enqueue(command)
    }

    /// Sends the command `make` builds around a fresh reply, and waits for the answer.
    pub fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, ServerError> {
        let (reply, answer) = reply_channel();
        // A caller that waits cannot build a backlog: no yield.
        self.enqueue(make(reply))?;
        self.wait(&answer)
    }

    fn enqueue(&self, command: Command) -> Result<(), ServerError> {
        self.inbox.send(command).map_err(|_| self.end_reason())
    }

    /// Waits for an answer; a reply dropped unanswered means the server ended.
    pub fn wait<T>(&self, answer: &Answer<T>) -> Result<T, ServerError> {
        recv_patiently(answer, PATIENCE).unwrap_or_else(|_| Err(self.end_reason()))
    }

    /// Why the server ended, if it has.
    pub fn ended(&self) -> Option<ServerError> {
        self.end.reason()
    }

    /// Why the server ended, once it has (waits for the thread to say).
    pub fn end_reason(&self) -> ServerError {
        self.end.wait(self.device.ordinal())
    }

    /// Stops the server once it reaches this command; later calls answer
    /// `ServerGone`.
    pub fn shutdown(&self) -> Result<(), ServerError> {
        self.call(|reply| Command::Shutdown { reply: Some(reply) })
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.inbox.send(Command::Shutdown { reply: None });
    }
}

/// Polls `commands` a little before the server counts as idle, so a client
/// that is just slower than the server does not make it flush (and wake an
/// executor) after every command. True if something came.
fn poll_briefly(commands: &InboxReceiver<Command>) -> bool {
    spin_briefly(IDLE_POLLS, || commands.has_queued())
}

/// Polls before an idle flush: about a microsecond.
const IDLE_POLLS: u32 = 256;

/// Commands waiting in a server's inbox past which [`ServerHandle::send`]
/// yields once before queueing: a client far ahead of its server otherwise
/// grows the inbox into fresh, cold memory that both threads then pay for.
/// One yield, never a wait, so no sender can deadlock on it.
const INBOX_BACKLOG: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_opened_without_virtual_memory_keeps_its_manager_to_pages() {
        let paged = DeviceOptions {
            virtual_memory: false,
            ..DeviceOptions::with_memory_limit(64 << 20)
        };
        let config = memory_config(&paged, 1 << 30);
        assert!(!config.virtual_memory);
        assert_eq!(config.limit, 64 << 20);
        let default = memory_config(&DeviceOptions::default(), 1 << 30);
        assert!(default.virtual_memory);
        assert_eq!(default.limit, 1 << 30);
    }
}
