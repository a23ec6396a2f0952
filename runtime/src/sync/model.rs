//! `sync` under `--cfg loom`: loom's primitives behind the
//! API the crate uses of parking_lot and crossbeam-channel, so the model
//! checks run the real code. Loom models neither crate.
//!
//! Two differences, both on the side of finding bugs: a bounded wait
//! (`wait_until`, `recv_timeout`) never times out, so a missing wakeup
//! is a deadlock loom reports instead of a stall the bound would hide; and
//! a `bounded(0)` channel holds one message (nothing here rendezvouses).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub use loom::sync::Arc;

use super::{RecvError, RecvTimeoutError, SendError, TryRecvError};

/// Atomics shared between threads (loom's, which model weak memory).
pub mod atomic {
    pub use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
}

/// Starting threads and yielding the CPU (loom's scheduled threads, with
/// std's default stack: loom's 32 KiB does not hold a debug server loop).
pub mod thread {
    pub use loom::thread::{JoinHandle, yield_now};

    /// The stack of every model thread, as std gives a thread.
    const STACK: usize = 2 << 20;

    /// Names and starts a model thread.
    #[derive(Debug)]
    pub struct Builder(loom::thread::Builder);

    impl Builder {
        /// A thread with std's default stack.
        #[allow(clippy::new_without_default)]
        pub fn new() -> Self {
            Builder(loom::thread::Builder::new().stack_size(STACK))
        }

        /// Names the thread.
        pub fn name(self, name: String) -> Self {
            Builder(self.0.name(name))
        }

        /// Starts it (loom's start never fails).
        pub fn spawn<F, T>(self, f: F) -> std::io::Result<JoinHandle<T>>
        where
            F: FnOnce() -> T + Send + 'static,
            T: Send + 'static,
        {
            self.0.spawn(f)
        }
    }

    /// Starts a model thread with std's default stack.
    pub fn spawn<F, T>(f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        match Builder::new().spawn(f) {
            Ok(handle) => handle,
            Err(_) => unreachable!("loom starts every thread it is given"),
        }
    }
}

/// A lock with parking_lot's API: `lock` never fails (a panic while
/// holding it does not poison it).
#[derive(Default)]
pub struct Mutex<T>(loom::sync::Mutex<T>);

/// Holds a [`Mutex`]; the value is reached through it.
pub struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

impl<T> Mutex<T> {
    /// A lock around `value`.
    pub fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    /// Waits for the lock.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard(Some(
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ))
    }
}

impl<T> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Mutex { .. }")
    }
}

impl<T> MutexGuard<'_, T> {
    fn held(&self) -> &loom::sync::MutexGuard<'_, T> {
        match &self.0 {
            Some(guard) => guard,
            // Only `Condvar::wait` takes it out, and it puts it back
            // before the guard can be used again.
            None => unreachable!("a guard is held outside a wait"),
        }
    }
}

impl<T> std::ops::Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.held()
    }
}

impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match &mut self.0 {
            Some(guard) => guard,
            None => unreachable!("a guard is held outside a wait"),
        }
    }
}

/// Whether a bounded wait ended by its bound (never, under the model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// Whether the wait ended because its bound passed.
    pub fn timed_out(&self) -> bool {
        self.0
    }
}

/// A condition variable with parking_lot's API (the guard by `&mut`).
#[derive(Default)]
pub struct Condvar(loom::sync::Condvar);

impl Condvar {
    /// A condition variable nobody waits on yet.
    pub fn new() -> Self {
        Condvar(loom::sync::Condvar::new())
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        self.0.notify_all();
    }

    /// Releases the lock until notified, then takes it again.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        if let Some(held) = guard.0.take() {
            let woken = self
                .0
                .wait(held)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            guard.0 = Some(woken);
        }
    }

    /// As [`wait`](Self::wait): the model has no clock, so it never times out.
    pub fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, _: Instant) -> WaitTimeoutResult {
        self.wait(guard);
        WaitTimeoutResult(false)
    }

    /// As [`wait`](Self::wait): the model has no clock, so it never times out.
    pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, _: Duration) -> WaitTimeoutResult {
        self.wait(guard);
        WaitTimeoutResult(false)
    }
}

impl std::fmt::Debug for Condvar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Condvar { .. }")
    }
}

struct Queue<T> {
    items: VecDeque<T>,
    capacity: Option<usize>,
    senders: usize,
    receivers: usize,
}

struct Channel<T> {
    queue: Mutex<Queue<T>>,
    /// Receivers wait here for an item or the last sender's drop.
    filled: Condvar,
    /// Senders of a bounded channel wait here for room.
    emptied: Condvar,
}

/// The sending side of a channel (crossbeam's API subset).
pub struct Sender<T>(Arc<Channel<T>>);

/// The receiving side of a channel (crossbeam's API subset).
pub struct Receiver<T>(Arc<Channel<T>>);

fn channel<T>(capacity: Option<usize>) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Channel {
        queue: Mutex::new(Queue {
            items: VecDeque::new(),
            capacity,
            senders: 1,
            receivers: 1,
        }),
        filled: Condvar::new(),
        emptied: Condvar::new(),
    });
    (Sender(shared.clone()), Receiver(shared))
}

/// A channel of unlimited capacity.
pub fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
    channel(None)
}

/// A channel holding at most `capacity` items (at least one).
pub fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    channel(Some(capacity.max(1)))
}

impl<T> Sender<T> {
    /// Queues `item`, waiting for room; gives it back if every receiver is gone.
    pub fn send(&self, item: T) -> Result<(), SendError<T>> {
        let mut queue = self.0.queue.lock();
        loop {
            if queue.receivers == 0 {
                return Err(SendError(item));
            }
            if queue
                .capacity
                .is_none_or(|capacity| queue.items.len() < capacity)
            {
                queue.items.push_back(item);
                self.0.filled.notify_one();
                return Ok(());
            }
            self.0.emptied.wait(&mut queue);
        }
    }

    /// Items queued and not yet received.
    pub fn len(&self) -> usize {
        self.0.queue.lock().items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Receiver<T> {
    /// The next item if one is queued.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        let mut queue = self.0.queue.lock();
        match queue.items.pop_front() {
            Some(item) => {
                self.0.emptied.notify_one();
                Ok(item)
            }
            None if queue.senders == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Waits for the next item; `RecvError` once it is empty and every sender is gone.
    pub fn recv(&self) -> Result<T, RecvError> {
        let mut queue = self.0.queue.lock();
        loop {
            if let Some(item) = queue.items.pop_front() {
                self.0.emptied.notify_one();
                return Ok(item);
            }
            if queue.senders == 0 {
                return Err(RecvError);
            }
            self.0.filled.wait(&mut queue);
        }
    }

    /// As [`recv`](Self::recv): the model has no clock, so it never times out.
    pub fn recv_timeout(&self, _: Duration) -> Result<T, RecvTimeoutError> {
        self.recv()
            .map_err(|RecvError| RecvTimeoutError::Disconnected)
    }

    /// Takes every item queued now.
    pub fn try_iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(|| self.try_recv().ok())
    }

    /// Receives until every sender is gone.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(|| self.recv().ok())
    }

    /// Items queued and not yet received.
    pub fn len(&self) -> usize {
        self.0.queue.lock().items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The items of a [`Receiver`], until every sender is gone.
pub struct IntoIter<T>(Receiver<T>);

impl<T> Iterator for IntoIter<T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.0.recv().ok()
    }
}

impl<T> IntoIterator for Receiver<T> {
    type Item = T;
    type IntoIter = IntoIter<T>;
    fn into_iter(self) -> IntoIter<T> {
        IntoIter(self)
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.0.queue.lock().senders += 1;
        Sender(self.0.clone())
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        self.0.queue.lock().receivers += 1;
        Receiver(self.0.clone())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut queue = self.0.queue.lock();
        queue.senders -= 1;
        if queue.senders == 0 {
            self.0.filled.notify_all();
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut queue = self.0.queue.lock();
        queue.receivers -= 1;
        if queue.receivers == 0 {
            self.0.emptied.notify_all();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sender { .. }")
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Receiver { .. }")
    }
}
