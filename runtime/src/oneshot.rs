//! A one-shot reply: one value from the server (or an executor) to the one
//! caller waiting for it.
//!
//! A reply is made per call, so its cost is on every round trip. A
//! crossbeam channel is cache-line aligned, and glibc serves aligned
//! allocations from its arena under a lock, where this slot is a plain
//! small allocation from the thread's cache. With a crossbeam `bounded(1)`
//! per call the server thread was seen sleeping on that lock and a sync
//! round trip took 0.7–0.8 µs (p99 2–15 µs); with this slot 0.24–0.29 µs
//! (p99 0.6–0.9 µs). `bench roundtrip` measures it (`docs/benchmarks.md`,
//! "roundtrip").

use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Arc, Condvar, Mutex, RecvError, SendError, TryRecvError};

enum State<T> {
    Empty,
    Full(T),
    /// Taken, or the sender went without sending.
    Closed,
}

struct Slot<T> {
    /// Set once the state is no longer `Empty`: pollers read it without the lock.
    settled: AtomicBool,
    state: Mutex<State<T>>,
    ready: Condvar,
}

/// The sending half. Dropping it unsent closes the slot: the receiver sees
/// a disconnect, never a hang.
pub struct OneshotSender<T> {
    slot: Arc<Slot<T>>,
}

/// The receiving half.
pub struct OneshotReceiver<T> {
    slot: Arc<Slot<T>>,
}

/// A new slot's two halves.
pub fn oneshot<T>() -> (OneshotSender<T>, OneshotReceiver<T>) {
    let slot = Arc::new(Slot {
        settled: AtomicBool::new(false),
        state: Mutex::new(State::Empty),
        ready: Condvar::new(),
    });
    (
        OneshotSender { slot: slot.clone() },
        OneshotReceiver { slot },
    )
}

impl<T> Slot<T> {
    /// Stores `value` if nothing was stored yet; gives it back otherwise.
    fn settle(&self, value: State<T>) -> Option<State<T>> {
        let mut state = self.state.lock();
        if !matches!(*state, State::Empty) {
            return Some(value);
        }
        *state = value;
        self.settled.store(true, Ordering::Release);
        self.ready.notify_one();
        None
    }
}

impl<T> OneshotSender<T> {
    /// Sends the value; an error gives it back if a value was already sent.
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        match self.slot.settle(State::Full(value)) {
            Some(State::Full(value)) => Err(SendError(value)),
            _ => Ok(()),
        }
    }
}

impl<T> Drop for OneshotSender<T> {
    fn drop(&mut self) {
        // Closes the slot only if nothing was sent: a sent value stays.
        let _ = self.slot.settle(State::Closed);
    }
}

impl<T> OneshotReceiver<T> {
    /// The value if it has come; `Disconnected` if the sender went without one.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        if !self.slot.settled.load(Ordering::Acquire) {
            return Err(TryRecvError::Empty);
        }
        let mut state = self.slot.state.lock();
        match std::mem::replace(&mut *state, State::Closed) {
            State::Full(value) => Ok(value),
            State::Empty => {
                *state = State::Empty;
                Err(TryRecvError::Empty)
            }
            State::Closed => Err(TryRecvError::Disconnected),
        }
    }

    /// Waits for the value; `RecvError` if the sender went without one.
    pub fn recv(&self) -> Result<T, RecvError> {
        let mut state = self.slot.state.lock();
        while matches!(*state, State::Empty) {
            self.slot.ready.wait(&mut state);
        }
        match std::mem::replace(&mut *state, State::Closed) {
            State::Full(value) => Ok(value),
            _ => Err(RecvError),
        }
    }
}

impl<T> std::fmt::Debug for OneshotSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OneshotSender")
    }
}

impl<T> std::fmt::Debug for OneshotReceiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OneshotReceiver")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sent_value_is_received_once() {
        let (tx, rx) = oneshot();
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        tx.send(7).expect("first send");
        assert!(tx.send(8).is_err(), "a second send is refused");
        assert_eq!(rx.try_recv(), Ok(7));
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Disconnected)));
    }

    #[test]
    fn a_sender_dropped_unsent_is_a_disconnect_not_a_hang() {
        let (tx, rx) = oneshot::<u32>();
        let waiter = std::thread::spawn(move || rx.recv());
        std::thread::sleep(std::time::Duration::from_millis(10));
        drop(tx);
        assert!(matches!(waiter.join(), Ok(Err(RecvError))));
    }

    #[test]
    fn a_blocked_receiver_wakes_for_the_value() {
        let (tx, rx) = oneshot();
        let waiter = std::thread::spawn(move || rx.recv());
        std::thread::sleep(std::time::Duration::from_millis(10));
        tx.send("done").expect("sent");
        assert!(matches!(waiter.join(), Ok(Ok("done"))));
    }
}
