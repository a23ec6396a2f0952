//! The channels and locks shared by the server, its executors and clients.
//!
//! Everything concurrent in Cistern goes through these names, so a model
//! checker can replace them in one place: under `--cfg loom` they are
//! loom's primitives (`sync/model.rs`), and the model checks in
//! `tests/model_check.rs` run the real one-shot, inbox, token and server
//! thread over them (`docs/reliability.md`, "Concurrency model checking").

pub use crossbeam_channel::{RecvError, RecvTimeoutError, SendError, TryRecvError};

#[cfg(not(loom))]
pub use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
#[cfg(not(loom))]
pub use parking_lot::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub use std::sync::Arc;

/// Atomics shared between threads.
#[cfg(not(loom))]
pub mod atomic {
    pub use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
}

/// Starting threads and yielding the CPU.
#[cfg(not(loom))]
pub mod thread {
    pub use std::thread::{Builder, JoinHandle, spawn, yield_now};
}

#[cfg(loom)]
mod model;
#[cfg(loom)]
pub use model::{
    Arc, Condvar, Mutex, MutexGuard, Receiver, Sender, atomic, bounded, thread, unbounded,
};

pub use crate::inbox::{InboxReceiver, InboxSender, Waited, inbox};
pub use crate::oneshot::{OneshotReceiver, OneshotSender, oneshot};

/// The sending half of a one-shot reply: a command that answers carries one.
///
/// A dropped reply (its server or executor ended) is seen by the waiting
/// receiver as a disconnect, never as a hang.
pub type Reply<T> = OneshotSender<Result<T, crate::error::ServerError>>;

/// Where the caller waits for a [`Reply`].
pub type Answer<T> = OneshotReceiver<Result<T, crate::error::ServerError>>;

/// A reply for one answer: the sender goes into the command, the caller
/// waits on the receiver.
pub fn reply_channel<T>() -> (Reply<T>, Answer<T>) {
    oneshot()
}

/// How long a thread that expects an answer soon polls before it sleeps.
///
/// Waking a sleeping thread costs a futex call and, on a virtual machine, an
/// interrupt to a halted CPU: several microseconds per hop. A server round
/// trip has three hops, so the waits on it poll (yielding the CPU) this long first.
pub const PATIENCE: std::time::Duration = std::time::Duration::from_micros(50);

/// What [`recv_patiently`] can wait on: a channel or a one-shot reply.
pub trait Receive<T> {
    /// The value if one is there now.
    fn try_recv(&self) -> Result<T, TryRecvError>;
    /// Sleeps until a value comes or the sender goes.
    fn recv(&self) -> Result<T, RecvError>;
}

impl<T> Receive<T> for Receiver<T> {
    fn try_recv(&self) -> Result<T, TryRecvError> {
        Receiver::try_recv(self)
    }
    fn recv(&self) -> Result<T, RecvError> {
        Receiver::recv(self)
    }
}

impl<T> Receive<T> for OneshotReceiver<T> {
    fn try_recv(&self) -> Result<T, TryRecvError> {
        OneshotReceiver::try_recv(self)
    }
    fn recv(&self) -> Result<T, RecvError> {
        OneshotReceiver::recv(self)
    }
}

/// Receives like [`Receiver::recv`], but polls for `patience` before sleeping.
pub fn recv_patiently<T>(
    receiver: &impl Receive<T>,
    patience: std::time::Duration,
) -> Result<T, RecvError> {
    let polled = poll_patiently(patience, || match receiver.try_recv() {
        Ok(value) => Some(Ok(value)),
        Err(TryRecvError::Disconnected) => Some(Err(RecvError)),
        Err(TryRecvError::Empty) => None,
    });
    polled.unwrap_or_else(|| receiver.recv())
}

/// Calls `attempt` until it gives something, spinning briefly and then
/// yielding the CPU, for at most `patience`; `None` when patience ran out
/// (the caller then sleeps its own way).
#[cfg(loom)]
pub fn poll_patiently<T>(
    _patience: std::time::Duration,
    mut attempt: impl FnMut() -> Option<T>,
) -> Option<T> {
    // The model has no clock: one attempt, and the checker explores both
    // the answer that came in time and the one that did not.
    attempt()
}

/// The time now, for the bounds of waits (`Instant::now`).
#[cfg(not(loom))]
pub fn now() -> std::time::Instant {
    std::time::Instant::now()
}

/// The time now, for the bounds of waits: under the model time stands
/// still (an interleaving must not depend on the host's clock), so no
/// bound ever passes.
#[cfg(loom)]
pub fn now() -> std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

/// Calls `ready` up to `polls` times, spinning between calls; whether it
/// said yes (the caller then waits its own way).
pub fn spin_briefly(polls: u32, mut ready: impl FnMut() -> bool) -> bool {
    // Under the model one look stands for all of them: the checker
    // explores both sides of the race without a branch per spin.
    let polls = if cfg!(loom) { polls.min(1) } else { polls };
    (0..polls).any(|_| {
        std::hint::spin_loop();
        ready()
    })
}

/// Calls `attempt` until it gives something, spinning briefly and then
/// yielding the CPU, for at most `patience`; `None` when patience ran out
/// (the caller then sleeps its own way).
#[cfg(not(loom))]
pub fn poll_patiently<T>(
    patience: std::time::Duration,
    mut attempt: impl FnMut() -> Option<T>,
) -> Option<T> {
    let mut spins = 0u32;
    let mut started = None;
    loop {
        if let Some(value) = attempt() {
            return Some(value);
        }
        if spins < 64 {
            spins += 1;
            std::hint::spin_loop();
            continue;
        }
        // The clock starts after the spins: an answer that comes at once
        // never pays for reading it.
        let started = *started.get_or_insert_with(std::time::Instant::now);
        if started.elapsed() >= patience {
            return None;
        }
        std::thread::yield_now();
    }
}
