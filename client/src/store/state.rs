//! `StepState`: everything about a store that changes after it is made,
//! and the only code that changes it. The other store files ask it and
//! call its transitions.
//!
//! The training step's phase:
//!
//! ```text
//!  Idle ── register_forward ──▶ Forwarded ── stage_backward ──▶ Staged
//!   ▲                               ▲ ◀──────── begin_backward ───┘
//!   └── commit_step, abandon_forward (from Forwarded or Staged) ──┘
//! ```
//!
//! A chain step (`commit_chain_step`) runs from `Idle`. Around the phase:
//! the serials of the latest backward and train-step loss, the optimizer
//! run (fixed by the first step), the AMP words and the chain workspace
//! (reserved on first use), and the queued work with the state before
//! each step: `settle` puts that state back when the device refused the
//! step as transient. `latch` poisons the store for good, keeping the
//! failure that latched it; it is a `OnceLock` so that `&self` calls latch
//! it too.

use std::sync::OnceLock;

use cistern_optim::OptimizerConfig;
use cistern_runtime::{FailureToken, ScaleRule};

use super::chain_plan::ChainRun;
use super::work::WorkList;
use crate::compute::Buffer;
use crate::error::{AutodiffError, BackendError};
use crate::tape::TapeId;

/// The store's mutable state: the step's phase and what outlives a step.
#[derive(Debug, Default)]
pub(super) struct StepState {
    phase: Phase,
    /// The serial of the latest backward (0: none yet).
    backward_serial: u64,
    /// The serial of the latest train-step loss (0: none yet).
    loss_serial: u64,
    /// The optimizer run, from the first step on.
    optimizer: Option<OptimizerRun>,
    /// The AMP found-inf flag and the device form's words, reserved by the
    /// first AMP step.
    amp_words: Option<Buffer>,
    /// The device chain's workspace and recorded step (`chain_step.rs`).
    chain_run: Option<ChainRun>,
    /// The step counter's words (`step_graph.rs`), reserved on first use,
    /// and the count they hold once the queued work ran, when known.
    step_words: Option<Buffer>,
    counter_holds: Option<u64>,
    /// A replayed step's loss buffer, with its loss serial.
    graph_loss: Option<(u64, Buffer)>,
    /// The queued work whose outcome is unseen, with what each item changed.
    work: WorkList<Effect>,
    /// The device failure that latched the store: set once by
    /// [`latch`](Self::latch), never cleared.
    poisoned: OnceLock<BackendError>,
}

/// Where the training step stands.
#[derive(Debug, Default)]
enum Phase {
    /// No forward registered (or the last one consumed or abandoned).
    #[default]
    Idle,
    /// A registered forward with no gradients staged for it.
    Forwarded(PendingForward),
    /// A registered forward and the gradients its latest backward staged.
    Staged(PendingForward, StagedGradients),
}

/// A registered forward a step has not consumed yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PendingForward {
    tape: TapeId,
    leaves: Vec<usize>,
}

impl PendingForward {
    /// The tape it was registered on.
    pub(super) fn tape(&self) -> TapeId {
        self.tape
    }

    /// Each slot's leaf on that tape, in slot order.
    pub(super) fn leaves(&self) -> &[usize] {
        &self.leaves
    }
}

/// What the latest backward wrote into the staging buffer.
#[derive(Clone, Debug)]
pub(super) struct StagedGradients {
    serial: u64,
    filled: Vec<bool>,
    made_by: Vec<FailureToken>,
}

impl StagedGradients {
    /// That backward's serial.
    pub(super) fn serial(&self) -> u64 {
        self.serial
    }

    /// Which slots it filled.
    pub(super) fn filled(&self) -> &[bool] {
        &self.filled
    }

    /// The tape's launches not yet seen to succeed when it ended: the
    /// gradients are only as good as all of them.
    pub(super) fn made_by(&self) -> &[FailureToken] {
        &self.made_by
    }
}

/// The optimizer a store steps with, fixed by its first step; a step
/// builds the next one and hands it to [`StepState::commit_step`].
#[derive(Clone, Debug)]
pub(super) struct OptimizerRun {
    /// The latest step's config (only `lr` may change between steps).
    pub(super) config: OptimizerConfig,
    /// The state buffers, in the config's state-layout order.
    pub(super) state: Vec<Buffer>,
    /// Steps committed on the host (frozen once the count is on the device).
    pub(super) steps: u64,
    /// Set by the first AMP step with no synchronisation: from then on the
    /// step count, loss scale and growth tracker live on the device, and
    /// follow this rule.
    pub(super) device_amp: Option<ScaleRule>,
}

/// What a queued launch did to the state.
#[derive(Debug)]
enum Effect {
    /// A backward's copy of gradients into the staging buffer.
    Staging { serial: u64 },
    /// An optimizer step, with the state from before it.
    Step(Box<Snapshot>),
    /// A device-chain train step, with the state and loss serial from before it.
    ChainStep {
        before: Box<Snapshot>,
        loss_serial: u64,
    },
}

/// The state a step replaced: put back when the device refused the step
/// as transient (nothing ran), so that it can be retried.
#[derive(Debug)]
struct Snapshot {
    phase: Phase,
    optimizer: Option<OptimizerRun>,
}

impl StepState {
    /// A restored store's optimizer run (`checkpoint.rs`), before any step
    /// of its own.
    pub(super) fn restore_optimizer(&mut self, run: OptimizerRun) {
        self.optimizer = Some(run);
    }

    /// Whether a device failure latched the store.
    pub(super) fn is_poisoned(&self) -> bool {
        self.poisoned.get().is_some()
    }

    /// `StorePoisoned`, naming the failure that latched the store, once
    /// one did.
    pub(super) fn poison(&self) -> Option<BackendError> {
        self.poisoned
            .get()
            .cloned()
            .map(BackendError::store_poisoned)
    }

    /// The registered forward no step has consumed, if any.
    pub(super) fn pending_forward(&self) -> Option<&PendingForward> {
        match &self.phase {
            Phase::Idle => None,
            Phase::Forwarded(forward) | Phase::Staged(forward, _) => Some(forward),
        }
    }

    /// The gradients the latest backward of the pending forward staged.
    pub(super) fn staged_gradients(&self) -> Option<&StagedGradients> {
        match &self.phase {
            Phase::Staged(_, staged) => Some(staged),
            Phase::Idle | Phase::Forwarded(_) => None,
        }
    }

    /// The serial of the latest backward (0: none yet).
    pub(super) fn backward_serial(&self) -> u64 {
        self.backward_serial
    }

    /// The serial of the latest train-step loss (0: none yet).
    pub(super) fn loss_serial(&self) -> u64 {
        self.loss_serial
    }

    /// The optimizer run, once a step fixed it.
    pub(super) fn optimizer(&self) -> Option<&OptimizerRun> {
        self.optimizer.as_ref()
    }

    /// The optimizer steps committed so far.
    pub(super) fn steps(&self) -> u64 {
        self.optimizer.as_ref().map_or(0, |run| run.steps)
    }

    /// The AMP words, once an AMP step reserved them.
    pub(super) fn amp_words(&self) -> Option<&Buffer> {
        self.amp_words.as_ref()
    }

    /// The device chain's workspace, once a chain step made it.
    pub(super) fn chain_run(&self) -> Option<&ChainRun> {
        self.chain_run.as_ref()
    }

    /// `PendingForwardUnconsumed` while a registered forward waits for its
    /// step (no forward may be registered, nor a chain run, then).
    pub(super) fn check_no_pending_forward(&self) -> Result<(), BackendError> {
        match self.phase {
            Phase::Idle => Ok(()),
            Phase::Forwarded(_) | Phase::Staged(..) => Err(BackendError::PendingForwardUnconsumed),
        }
    }

    /// `Idle → Forwarded`: `leaves` (one per slot) on `tape` become the
    /// pending forward. A forward already pending is `PendingForwardUnconsumed`.
    pub(super) fn register_forward(
        &mut self,
        tape: TapeId,
        leaves: Vec<usize>,
    ) -> Result<(), BackendError> {
        self.check_no_pending_forward()?;
        self.phase = Phase::Forwarded(PendingForward { tape, leaves });
        Ok(())
    }

    /// `→ Idle`: forgets the pending forward and its staged gradients;
    /// whether one was pending.
    pub(super) fn abandon_forward(&mut self) -> bool {
        !matches!(std::mem::take(&mut self.phase), Phase::Idle)
    }

    /// `Staged → Forwarded` for a backward on `tape`: the staged gradients
    /// are dropped (the backward overwrites them); the pending forward's
    /// leaves. No pending forward is `InvalidArgument`, another tape
    /// `TapeMismatch` (nothing changes).
    pub(super) fn begin_backward(&mut self, tape: TapeId) -> Result<Vec<usize>, AutodiffError> {
        let forward = self.pending_forward().ok_or_else(|| {
            AutodiffError::InvalidArgument(
                "backward through the store needs a registered forward".into(),
            )
        })?;
        if forward.tape != tape {
            return Err(BackendError::TapeMismatch.into());
        }
        let leaves = forward.leaves.clone();
        self.unstage(|_| true);
        Ok(leaves)
    }

    /// A new backward serial, for the gradients a backward is staging.
    pub(super) fn new_backward_serial(&mut self) -> u64 {
        self.backward_serial += 1;
        self.backward_serial
    }

    /// Records a queued copy of backward `serial`'s gradients into the
    /// staging buffer (refused as transient, its gradients are unstaged).
    pub(super) fn queue_staging(&mut self, token: FailureToken, serial: u64) {
        self.work.push(token, Effect::Staging { serial });
    }

    /// `Forwarded → Staged`: backward `serial` filled the slots `filled`,
    /// from the work behind `made_by`.
    pub(super) fn stage_backward(
        &mut self,
        serial: u64,
        filled: Vec<bool>,
        made_by: Vec<FailureToken>,
    ) {
        debug_assert!(
            self.pending_forward().is_some(),
            "gradients staged with no forward pending"
        );
        self.phase = match std::mem::take(&mut self.phase) {
            Phase::Forwarded(forward) | Phase::Staged(forward, _) => {
                let staged = StagedGradients {
                    serial,
                    filled,
                    made_by,
                };
                Phase::Staged(forward, staged)
            }
            Phase::Idle => Phase::Idle,
        };
    }

    /// `→ Idle`, the queued step's outcome tracked through `token`: the
    /// pending forward and staged gradients are consumed and `run` becomes
    /// the optimizer run (put back as they were if the device refuses the
    /// step as transient; any other failure latches the store).
    pub(super) fn commit_step(&mut self, token: FailureToken, run: OptimizerRun) {
        let before = self.replace_for_step(run);
        self.work.push(token, Effect::Step(Box::new(before)));
    }

    /// [`commit_step`](Self::commit_step) for a device-chain train step or
    /// a replayed step graph, which also takes a new loss serial; that serial.
    pub(super) fn commit_chain_step(&mut self, token: FailureToken, run: OptimizerRun) -> u64 {
        let before = self.replace_for_step(run);
        let effect = Effect::ChainStep {
            before: Box::new(before),
            loss_serial: self.loss_serial,
        };
        self.work.push(token, effect);
        self.loss_serial += 1;
        self.loss_serial
    }

    /// Sets the step count of the latest step (an AMP step that its flag
    /// skipped keeps the count from before it).
    pub(super) fn recount_latest_step(&mut self, steps: u64) {
        if let Some(run) = &mut self.optimizer {
            run.steps = steps;
        }
    }

    /// A new loss serial, for a loss recorded from the host.
    pub(super) fn record_host_loss(&mut self) -> u64 {
        self.loss_serial += 1;
        self.loss_serial
    }

    /// Keeps the AMP words reserved by the first AMP step.
    pub(super) fn keep_amp_words(&mut self, words: Buffer) {
        debug_assert!(self.amp_words.is_none(), "AMP words reserved twice");
        self.amp_words = Some(words);
    }

    /// Keeps the chain workspace until the next chain step.
    pub(super) fn keep_chain_run(&mut self, run: ChainRun) {
        self.chain_run = Some(run);
    }

    /// Takes the chain workspace out (a chain step keeps it back).
    pub(super) fn take_chain_run(&mut self) -> Option<ChainRun> {
        self.chain_run.take()
    }

    /// Forgets the queued work that succeeded and puts back what work
    /// refused as transient changed (answering that refusal once); the
    /// first other failure latches the store and is returned.
    pub(super) fn settle(&mut self) -> Result<(), BackendError> {
        let settled = self.work.settle();
        let mut transient = None;
        for (effect, error) in settled.refused {
            self.put_back(effect);
            transient.get_or_insert(error);
        }
        match settled.failed {
            Some(error) => Err(self.latch(error)),
            None => transient.map_or(Ok(()), Err),
        }
    }

    /// Puts back what the latest queued work changed: a step its kernel
    /// refused (nothing ran).
    pub(super) fn put_back_latest(&mut self) {
        if let Some(effect) = self.work.pop_latest() {
            self.put_back(effect);
        }
    }

    /// The first failure of the queued work: a transient one is returned
    /// as it is, any other latches the store.
    pub(super) fn check_work(&self) -> Result<(), BackendError> {
        match self.work.first_failure().map(BackendError::from) {
            None => Ok(()),
            Some(error) if error.is_transient() => Err(error),
            Some(error) => Err(self.latch(error)),
        }
    }

    /// Whether the queued work was refused by a transient state: it
    /// changed nothing and is put back on the next `settle`.
    pub(super) fn work_refused_transiently(&self) -> bool {
        self.work
            .first_failure()
            .map(BackendError::from)
            .is_some_and(|error| error.is_transient())
    }

    /// `error`, latching the store first when it is device-level.
    pub(super) fn fail(&self, error: BackendError) -> BackendError {
        if latches(&error) {
            self.latch(error)
        } else {
            error
        }
    }

    /// Latches the store: the call that latches it gets `error`, every
    /// other (concurrent or later) call `StorePoisoned` naming the error
    /// that latched it.
    pub(super) fn latch(&self, error: BackendError) -> BackendError {
        match self.poisoned.set(error.clone()) {
            Ok(()) => error,
            Err(_) => BackendError::store_poisoned(self.poisoned.get().cloned().unwrap_or(error)),
        }
    }

    /// The step counter's words, once reserved.
    pub(super) fn step_words(&self) -> Option<&Buffer> {
        self.step_words.as_ref()
    }

    /// Keeps the step counter's words, reserved by their first use.
    pub(super) fn keep_step_words(&mut self, words: Buffer) {
        debug_assert!(self.step_words.is_none(), "step words reserved twice");
        self.step_words = Some(words);
    }

    /// Whether the counter will hold the committed step count once the
    /// queued work ran (otherwise it must be written first).
    pub(super) fn counter_is_current(&self) -> bool {
        self.counter_holds.is_some() && self.counter_holds == Some(self.steps())
    }

    /// The queued work leaves the counter holding the committed step count
    /// (written, or advanced by a counted step just committed).
    pub(super) fn counter_now_current(&mut self) {
        self.counter_holds = Some(self.steps());
    }

    /// Records a replayed step's loss buffer under loss `serial`.
    pub(super) fn keep_graph_loss(&mut self, serial: u64, loss: Buffer) {
        self.graph_loss = Some((serial, loss));
    }

    /// The loss buffer of replayed step `serial`, if that step was one.
    pub(super) fn graph_loss(&self, serial: u64) -> Option<&Buffer> {
        self.graph_loss
            .as_ref()
            .filter(|(of, _)| *of == serial)
            .map(|(_, loss)| loss)
    }

    /// The phase and optimizer run before a step, replaced by `Idle` and
    /// `run`; the counter is no longer known to be current.
    fn replace_for_step(&mut self, run: OptimizerRun) -> Snapshot {
        self.counter_holds = None;
        Snapshot {
            phase: std::mem::take(&mut self.phase),
            optimizer: self.optimizer.replace(run),
        }
    }

    /// Undoes what refused work changed.
    fn put_back(&mut self, effect: Effect) {
        self.counter_holds = None;
        match effect {
            Effect::Staging { serial } => self.unstage(|staged| staged.serial == serial),
            Effect::Step(before) => self.restore(*before),
            Effect::ChainStep {
                before,
                loss_serial,
            } => {
                self.restore(*before);
                self.loss_serial = loss_serial;
                // The recorded step may hold the refused launches' state.
                self.chain_run = None;
            }
        }
    }

    /// `Staged → Forwarded` when `drops` answers true of the staged gradients.
    fn unstage(&mut self, drops: impl Fn(&StagedGradients) -> bool) {
        self.phase = match std::mem::take(&mut self.phase) {
            Phase::Staged(forward, staged) if drops(&staged) => Phase::Forwarded(forward),
            phase => phase,
        };
    }

    /// Puts back the phase and optimizer run from before a step.
    fn restore(&mut self, before: Snapshot) {
        self.phase = before.phase;
        self.optimizer = before.optimizer;
    }
}

/// Whether `error` means the device may have half-applied the store's
/// work: those latch it. Refusals that changed nothing (caller errors,
/// allocation failures, transfer failures, a stale generation, the
/// transient states) do not.
pub(super) fn latches(error: &BackendError) -> bool {
    matches!(
        error,
        BackendError::DeviceContextPoisoned(_)
            | BackendError::DeviceContextUnrecoverable { .. }
            | BackendError::KernelLaunchFailed(_)
            | BackendError::KernelCompileFailed { .. }
            | BackendError::InvalidProgram(_)
            | BackendError::ServerPanicked { .. }
            | BackendError::ServerGone { .. }
            | BackendError::Unknown(_)
    )
}

#[cfg(test)]
mod tests {
    use cistern_optim::SgdConfig;
    use cistern_runtime::{Device, DeviceOptions, PendingToken, ServerError};

    use super::*;
    use crate::compute::ComputeClient;
    use crate::tape::Tape;

    /// Two tape ids (a tape is the only way to get one).
    fn two_tapes() -> (TapeId, TapeId) {
        let options = DeviceOptions::with_memory_limit(1 << 20);
        let client = ComputeClient::open(Device::Cpu(0), options).expect("cpu:0 opens");
        (Tape::new(&client).id(), Tape::new(&client).id())
    }

    fn sgd_run(steps: u64) -> OptimizerRun {
        OptimizerRun {
            config: OptimizerConfig::Sgd(SgdConfig::default()),
            state: Vec::new(),
            steps,
            device_amp: None,
        }
    }

    /// A state with a forward on `tape` whose backward 1 staged both slots.
    fn staged_on(tape: TapeId) -> StepState {
        let mut state = StepState::default();
        state.register_forward(tape, vec![3, 4]).expect("idle");
        state.begin_backward(tape).expect("a forward on that tape");
        let serial = state.new_backward_serial();
        state.stage_backward(serial, vec![true, true], Vec::new());
        state
    }

    /// A token that the device refused as transient.
    fn refused_token() -> FailureToken {
        let token = FailureToken::new();
        PendingToken::new(token.clone(), 0).fail(ServerError::CaptureInProgress { ordinal: 0 });
        token
    }

    #[test]
    fn a_second_forward_is_refused_until_the_first_is_abandoned() {
        let (tape, _) = two_tapes();
        let mut state = StepState::default();
        state.register_forward(tape, vec![0]).expect("idle");
        assert!(matches!(
            state.register_forward(tape, vec![0]),
            Err(BackendError::PendingForwardUnconsumed)
        ));
        assert!(state.abandon_forward());
        assert!(!state.abandon_forward());
        assert!(state.register_forward(tape, vec![0]).is_ok());
    }

    #[test]
    fn a_backward_on_another_tape_changes_nothing() {
        let (tape, other) = two_tapes();
        let mut state = staged_on(tape);
        assert!(matches!(
            state.begin_backward(other),
            Err(AutodiffError::Backend(BackendError::TapeMismatch))
        ));
        assert_eq!(
            state.staged_gradients().map(|staged| staged.serial()),
            Some(1)
        );
        assert!(state.begin_backward(tape).is_ok());
        assert!(state.staged_gradients().is_none());
    }

    #[test]
    fn a_step_consumes_the_forward_and_a_transient_refusal_puts_it_back() {
        let (tape, _) = two_tapes();
        let mut state = staged_on(tape);
        state.commit_step(refused_token(), sgd_run(1));
        assert!(state.pending_forward().is_none());
        assert_eq!(state.steps(), 1);
        assert!(matches!(
            state.settle(),
            Err(BackendError::DeviceContextCaptureInProgress { .. })
        ));
        assert_eq!(
            state.pending_forward().map(|forward| forward.leaves()),
            Some(&[3, 4][..])
        );
        assert_eq!(
            state.staged_gradients().map(|staged| staged.serial()),
            Some(1)
        );
        assert_eq!(state.steps(), 0);
        assert!(state.settle().is_ok(), "the refusal is answered once");
        assert!(!state.is_poisoned());
    }

    #[test]
    fn a_refused_staging_copy_unstages_only_its_own_backward() {
        let (tape, _) = two_tapes();
        let mut state = staged_on(tape);
        state.queue_staging(refused_token(), 1);
        assert!(state.settle().is_err());
        assert!(state.staged_gradients().is_none());
        assert!(state.pending_forward().is_some());
    }

    #[test]
    fn a_device_level_failure_latches_once() {
        let mut state = StepState::default();
        let token = FailureToken::new();
        let launch = ServerError::KernelLaunchFailed {
            kernel: "step".into(),
            message: "trap".into(),
        };
        PendingToken::new(token.clone(), 0).fail(launch);
        state.commit_step(token, sgd_run(1));
        assert!(matches!(
            state.settle(),
            Err(BackendError::KernelLaunchFailed(_))
        ));
        assert!(state.is_poisoned());
        let again = state.fail(BackendError::Unknown("again".into()));
        assert!(matches!(
            again.poison_cause(),
            Some(BackendError::KernelLaunchFailed(message)) if message.contains("trap")
        ));
    }
}
