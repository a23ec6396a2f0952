//! `FaultPlan`: faults a test asks the runtime to inject, and the injector
//! the server consults.
//!
//! Faults are injected by the server, before work reaches the backend, so
//! the same plan behaves the same on every backend: a trapped launch is
//! replaced by the `Trap` kernel, which every backend provides and which
//! faults on the device for real (the poison travels the normal path).

use std::collections::VecDeque;

use cistern_memory::SplitMix64;

/// Faults to inject into a server, so tests can prove every failure reaches
/// its owner and the context state machine ends where it should.
///
/// Counts start at 1 and run over the whole life of the server. The default
/// plan injects nothing; a server opened with it holds no injector and pays
/// one predictable branch per command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// The server thread panics while handling its Nth command (counting
    /// from 1), as if it had a bug: every waiting and later call must see
    /// `ServerPanicked`.
    pub server_panic_at_command: Option<u64>,
    /// The Nth launch the server accepts and queues (each kernel of a batch
    /// counts; refused launches do not) traps on the device and poisons it.
    pub trap_launch: Option<u64>,
    /// The Nth reservation that passes its checks fails with `OutOfMemory`
    /// (operation-local: nothing is poisoned).
    pub fail_reservation: Option<u64>,
    /// The Nth host/device transfer (write or read) that passes its checks
    /// fails with `TransferFailed` (operation-local: nothing is poisoned).
    pub fail_transfer: Option<u64>,
    /// How the next recovery probes fail, one entry per probe attempt, in
    /// order; attempts past the end run normally.
    pub probe_faults: Vec<ProbeFault>,
    /// Each accepted launch traps with this probability, drawn from a
    /// seeded generator: the same seed and launches trap the same launch.
    pub launch_trap_rate: Option<TrapRate>,
    /// The Nth launch batch is refused as if another caller had begun a
    /// capture (`CaptureInProgress`, transient: nothing of it runs, its
    /// token fails, nothing latches), as a racing capture would.
    pub busy_batch: Option<u64>,
    /// The Nth single launch (a step sent alone counts) is refused as a
    /// racing capture would refuse it: `CaptureInProgress`, its token
    /// fails, nothing latches, and the launches after it run.
    pub busy_launch: Option<u64>,
    /// The Nth graph replay is refused as a racing capture would refuse
    /// it: `CaptureInProgress`, nothing of it runs, its token fails,
    /// nothing latches.
    pub busy_replay: Option<u64>,
}

/// How one recovery probe attempt is made to fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeFault {
    /// The probe's host-to-device transfer fails without touching the
    /// device: retried, up to three attempts in all.
    OperationLocal,
    /// The probe's kernel traps on the device: the context is unrecoverable.
    Sticky,
    /// The probe's kernel writes the wrong values: the read-back mismatches
    /// and the context is unrecoverable.
    Mismatch,
}

/// A seeded probability that each accepted launch traps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrapRate {
    /// The generator's seed.
    pub seed: u64,
    /// The probability, in parts per million (1_000_000 traps every launch).
    pub per_million: u32,
}

impl TrapRate {
    /// A rate of `probability` (clamped to `0.0..=1.0`) from `seed`.
    pub fn new(seed: u64, probability: f64) -> Self {
        let clamped = if probability.is_nan() {
            0.0
        } else {
            probability.clamp(0.0, 1.0)
        };
        TrapRate {
            seed,
            per_million: (clamped * 1_000_000.0).round() as u32,
        }
    }
}

impl FaultPlan {
    /// The plan that injects nothing.
    pub fn none() -> Self {
        FaultPlan::default()
    }

    /// Whether the plan injects nothing.
    pub fn is_empty(&self) -> bool {
        *self == FaultPlan::default()
    }

    /// The Nth accepted launch traps.
    pub fn with_trap_at_launch(mut self, n: u64) -> Self {
        self.trap_launch = Some(n);
        self
    }

    /// The Nth reservation fails with `OutOfMemory`.
    pub fn with_failed_reservation(mut self, n: u64) -> Self {
        self.fail_reservation = Some(n);
        self
    }

    /// The Nth transfer fails with `TransferFailed`.
    pub fn with_failed_transfer(mut self, n: u64) -> Self {
        self.fail_transfer = Some(n);
        self
    }

    /// The next probe attempts fail as listed, in order.
    pub fn with_probe_faults(mut self, faults: impl IntoIterator<Item = ProbeFault>) -> Self {
        self.probe_faults = faults.into_iter().collect();
        self
    }

    /// Each accepted launch traps with `probability`, drawn from `seed`.
    pub fn with_trap_rate(mut self, seed: u64, probability: f64) -> Self {
        self.launch_trap_rate = Some(TrapRate::new(seed, probability));
        self
    }

    /// The Nth launch batch is refused as if a capture were in progress.
    pub fn with_busy_batch(mut self, n: u64) -> Self {
        self.busy_batch = Some(n);
        self
    }

    /// The Nth single launch is refused as if a capture were in progress.
    pub fn with_busy_launch(mut self, n: u64) -> Self {
        self.busy_launch = Some(n);
        self
    }

    /// The Nth graph replay is refused as if a capture were in progress.
    pub fn with_busy_replay(mut self, n: u64) -> Self {
        self.busy_replay = Some(n);
        self
    }

    /// The server panics while handling its Nth command.
    pub fn with_server_panic_at_command(mut self, n: u64) -> Self {
        self.server_panic_at_command = Some(n);
        self
    }
}

/// A plan being carried out: counters and the seeded generator.
#[derive(Debug)]
pub(crate) struct FaultInjector {
    plan: FaultPlan,
    launches: u64,
    singles: u64,
    batches: u64,
    replays: u64,
    reservations: u64,
    transfers: u64,
    probes: VecDeque<ProbeFault>,
    random: SplitMix64,
}

impl FaultInjector {
    /// The injector for `plan`, or `None` when it injects nothing (so the
    /// server's hot path tests one `Option`).
    pub(crate) fn new(plan: FaultPlan) -> Option<Box<Self>> {
        if plan.is_empty() {
            return None;
        }
        let seed = plan.launch_trap_rate.map_or(0, |rate| rate.seed);
        Some(Box::new(FaultInjector {
            probes: plan.probe_faults.iter().copied().collect(),
            plan,
            launches: 0,
            singles: 0,
            batches: 0,
            replays: 0,
            reservations: 0,
            transfers: 0,
            random: SplitMix64::new(seed),
        }))
    }

    /// Whether the server panics at its command number `command`.
    pub(crate) fn panics_at(&self, command: u64) -> bool {
        self.plan.server_panic_at_command == Some(command)
    }

    /// Counts one accepted launch; whether it traps.
    pub(crate) fn launch_traps(&mut self) -> bool {
        self.launches += 1;
        let nth = self.plan.trap_launch == Some(self.launches);
        let drawn = match self.plan.launch_trap_rate {
            Some(rate) => self.random.next_u64() % 1_000_000 < u64::from(rate.per_million),
            None => false,
        };
        nth || drawn
    }

    /// Counts one launch batch; whether it is refused as busy.
    pub(crate) fn batch_busy(&mut self) -> bool {
        self.batches += 1;
        self.plan.busy_batch == Some(self.batches)
    }

    /// Counts one graph replay; whether it is refused as busy.
    pub(crate) fn replay_busy(&mut self) -> bool {
        self.replays += 1;
        self.plan.busy_replay == Some(self.replays)
    }

    /// Counts one single launch; whether it is refused as busy.
    pub(crate) fn single_busy(&mut self) -> bool {
        self.singles += 1;
        self.plan.busy_launch == Some(self.singles)
    }

    /// Counts one reservation; whether it fails.
    pub(crate) fn reservation_fails(&mut self) -> bool {
        self.reservations += 1;
        self.plan.fail_reservation == Some(self.reservations)
    }

    /// Counts one transfer; whether it fails.
    pub(crate) fn transfer_fails(&mut self) -> bool {
        self.transfers += 1;
        self.plan.fail_transfer == Some(self.transfers)
    }

    /// How the next probe attempt fails, if it is made to.
    pub(crate) fn next_probe_fault(&mut self) -> Option<ProbeFault> {
        self.probes.pop_front()
    }
}

/// The message of a caught panic, for errors and traces.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic with a non-text payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trapped(injector: &mut FaultInjector, launches: u64) -> Vec<u64> {
        (1..=launches).filter(|_| injector.launch_traps()).collect()
    }

    #[test]
    fn an_empty_plan_builds_no_injector() {
        assert!(FaultInjector::new(FaultPlan::none()).is_none());
        assert!(FaultInjector::new(FaultPlan::none().with_trap_at_launch(1)).is_some());
    }

    #[test]
    fn the_nth_launch_reservation_and_transfer_fail_once() {
        let plan = FaultPlan::none()
            .with_trap_at_launch(3)
            .with_failed_reservation(2)
            .with_failed_transfer(1);
        let Some(mut injector) = FaultInjector::new(plan) else {
            panic!("a non-empty plan has an injector");
        };
        assert_eq!(trapped(&mut injector, 10), vec![3]);
        let reservations: Vec<bool> = (0..4).map(|_| injector.reservation_fails()).collect();
        assert_eq!(reservations, vec![false, true, false, false]);
        assert!(injector.transfer_fails());
        assert!(!injector.transfer_fails());
    }

    #[test]
    fn the_same_seed_traps_the_same_launches_and_another_seed_differs() {
        let run = |seed| {
            let plan = FaultPlan::none().with_trap_rate(seed, 0.1);
            match FaultInjector::new(plan) {
                Some(mut injector) => trapped(&mut injector, 1000),
                None => Vec::new(),
            }
        };
        let first = run(42);
        assert_eq!(first, run(42));
        assert_ne!(first, run(43));
        // About one in ten: far from none and far from all.
        assert!((50..200).contains(&first.len()), "{} traps", first.len());
    }

    #[test]
    fn rates_are_clamped_and_zero_never_traps() {
        assert_eq!(TrapRate::new(0, 2.0).per_million, 1_000_000);
        assert_eq!(TrapRate::new(0, f64::NAN).per_million, 0);
        let Some(mut injector) = FaultInjector::new(FaultPlan::none().with_trap_rate(1, 0.0))
        else {
            panic!("a plan with a rate has an injector");
        };
        assert!(trapped(&mut injector, 1000).is_empty());
    }

    #[test]
    fn probe_faults_are_used_once_each_in_order() {
        let plan =
            FaultPlan::none().with_probe_faults([ProbeFault::OperationLocal, ProbeFault::Sticky]);
        let Some(mut injector) = FaultInjector::new(plan) else {
            panic!("a plan with probe faults has an injector");
        };
        assert_eq!(
            injector.next_probe_fault(),
            Some(ProbeFault::OperationLocal)
        );
        assert_eq!(injector.next_probe_fault(), Some(ProbeFault::Sticky));
        assert_eq!(injector.next_probe_fault(), None);
    }
}
