//! A seeded, deterministic simulation of `DeviceParamStore` against the f64
//! reference: per seed, one optimizer family (SGD, Adam, AdamW, RMSprop,
//! Adagrad, LAMB, or the AMP form of SGD, Adam or AdamW), a fault plan with
//! a trap, a failed transfer and a failed reservation at seeded positions,
//! and a seeded sequence of training steps, abandoned forwards, refused
//! steps of another family and AMP steps with non-finite gradients.
//!
//! Some actions checkpoint the store through a checkpoint file and carry
//! on with a store restored from it.
//!
//! After every step the store either reads back the reference's post-step
//! values (within `cistern_optim::parity`'s tolerance, the step count
//! equal) or refuses every call with `StorePoisoned`; a refused store is
//! restored from its last checkpoint (the reference rewound with it), or
//! rebuilt from its last good values where none was taken, on a recovered
//! device.
//!
//! It drives the real `ComputeClient` on `Device::Cpu(0)`: the store is
//! built on the client's public API and cannot run over `ServerCore`
//! directly. One client makes the run deterministic: the server numbers
//! launches, transfers and reservations in the order they are sent.
//!
//! `CISTERN_STORE_SIM_SEEDS=N`, `CISTERN_STORE_SIM_STEPS=N` run more;
//! `CISTERN_STORE_SIM_SEED=N` replays one seed.

#[path = "store/common.rs"]
mod common;

use cistern_client::{
    AutodiffError, BackendError, ComputeClient, DeviceParamStore, Gradients, StoreCheckpoint, Tape,
    Tensor, read_checkpoint, write_checkpoint,
};
use cistern_memory::SplitMix64;
use cistern_optim::OptimizerConfig::{self, Adagrad, Adam, AdamW, Lamb, RmsProp, Sgd};
use cistern_optim::parity::{PARAM_FLOOR, TOLERANCE, max_relative_error};
use cistern_optim::reference::{self, ReferenceState};
use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, GradScaler, GradScalerConfig, LambConfig,
    RmsPropConfig, SgdConfig,
};
use cistern_runtime::{ContextState, DeviceOptions, FaultPlan};

use common::{Model, flat, flat32, loss, model, open_with, segments, step_with};

const SEEDS: u64 = 30;
const STEPS: usize = 40;

/// What a run saw, so a green run is not a vacuous one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    steps_checked: u64,
    amp_skips: u64,
    refused_steps: u64,
    abandoned: u64,
    operation_local: u64,
    poisoned: u64,
    recoveries: u64,
    restores: u64,
    recovered_from_checkpoint: u64,
}

/// A checkpoint that read back whole, and the reference as it stood.
#[derive(Clone)]
struct Saved {
    checkpoint: StoreCheckpoint,
    reference: ReferenceState,
    reference_steps: u64,
    scaler: GradScaler,
    host_scaler: GradScaler,
}

/// One seed's world: the client, the store and the reference beside it.
struct Sim {
    rng: SplitMix64,
    client: ComputeClient,
    model: Model,
    config: OptimizerConfig,
    amp: bool,
    store: DeviceParamStore,
    reference: ReferenceState,
    reference_steps: u64,
    scaler: GradScaler,
    host_scaler: GradScaler,
    /// The values the store last read back, to rebuild it from.
    last_good: Vec<Tensor<f32>>,
    /// The last checkpoint, to restore from.
    saved: Option<Saved>,
    counts: Counts,
    /// Every outcome, in order: the run's trace.
    trace: Vec<String>,
}

/// A failed invariant.
type Failure = String;

fn configs() -> Vec<(OptimizerConfig, bool)> {
    vec![
        (
            Sgd(SgdConfig {
                lr: 0.01,
                momentum: 0.9,
                nesterov: true,
                ..Default::default()
            }),
            false,
        ),
        (
            Adam(AdamConfig {
                weight_decay: 0.01,
                amsgrad: true,
                ..Default::default()
            }),
            false,
        ),
        (AdamW(AdamWConfig::default()), false),
        (
            RmsProp(RmsPropConfig {
                lr: 1e-4,
                centered: true,
                momentum: 0.9,
                ..Default::default()
            }),
            false,
        ),
        (
            Adagrad(AdagradConfig {
                lr: 1e-3,
                lr_decay: 0.1,
                ..Default::default()
            }),
            false,
        ),
        (
            Lamb(LambConfig {
                lr: 1e-3,
                ..Default::default()
            }),
            false,
        ),
        (
            Sgd(SgdConfig {
                lr: 0.002,
                momentum: 0.9,
                ..Default::default()
            }),
            true,
        ),
        (Adam(AdamConfig::default()), true),
        (AdamW(AdamWConfig::default()), true),
    ]
}

fn scaler() -> GradScaler {
    let config = GradScalerConfig {
        init_scale: 1024.0,
        growth_interval: 3,
        ..GradScalerConfig::default()
    };
    match GradScaler::new(config) {
        Ok(scaler) => scaler,
        Err(error) => panic!("a valid scaler config: {error:?}"),
    }
}

/// Another family's config, which a store whose family is fixed refuses.
fn another_family(config: &OptimizerConfig) -> OptimizerConfig {
    match config {
        Sgd(_) => Adagrad(AdagradConfig::default()),
        _ => Sgd(SgdConfig::default()),
    }
}

fn autodiff(error: AutodiffError) -> BackendError {
    match error {
        AutodiffError::Backend(error) => error,
        other => BackendError::InvalidArgument(other.to_string()),
    }
}

/// Operation-local failures: nothing is poisoned, a retry may pass.
fn operation_local(error: &BackendError) -> bool {
    matches!(
        error,
        BackendError::TransferFailed(_) | BackendError::DeviceAllocationFailed(_)
    ) || error.is_transient()
        || matches!(error, BackendError::OutOfMemory { .. })
}

impl Sim {
    fn new(seed: u64) -> Result<Sim, Failure> {
        let mut rng = SplitMix64::new(seed ^ 0x5707_E51A);
        let all = configs();
        let (config, amp) = all[rng.below(all.len() as u64) as usize].clone();
        // About 25 launches a step: the trap lands somewhere in the run.
        let plan = FaultPlan::none()
            .with_trap_at_launch(1 + rng.below(1_000))
            .with_failed_transfer(1 + rng.below(200))
            .with_failed_reservation(1 + rng.below(300));
        let client = open_with(DeviceOptions::with_memory_limit(64 << 20).with_faults(plan));
        let model = model(seed);
        let mut trace = Vec::new();
        let store = build(&client, &model.params, &mut trace)?;
        Ok(Sim {
            rng,
            reference: ReferenceState::new(&config, flat(&model.params)),
            last_good: model.params.clone(),
            saved: None,
            client,
            model,
            config,
            amp,
            store,
            reference_steps: 0,
            scaler: scaler(),
            host_scaler: scaler(),
            counts: Counts::default(),
            trace,
        })
    }

    /// One seeded action, then the invariant.
    fn step(&mut self) -> Result<(), Failure> {
        let outcome = match self.rng.below(100) {
            0..70 => self.train(false),
            70..80 => self.train(true),
            80..92 => self.abandon(),
            _ => self.checkpoint_and_restore(),
        };
        self.trace.push(format!("{outcome:?}"));
        if let Err(error) = &outcome
            && !self.store.is_poisoned()
            && operation_local(error)
        {
            self.counts.operation_local += 1;
            // Put back what a refusal left pending; a latched store
            // refuses this too.
            let _ = self.store.abandon_pending_forward();
        }
        self.check()
    }

    /// Register, forward, backward, then the family's step (first, when
    /// `refuse_first`, a step of another family, which must be refused and
    /// change nothing). AMP steps replace a gradient by a non-finite value
    /// one time in five.
    fn train(&mut self, refuse_first: bool) -> Result<(), BackendError> {
        let tape = Tape::new(&self.client);
        let leaves = self.store.register_resident_params(&tape)?;
        let value = loss(&self.store, &tape, &leaves, &self.model)?;
        let value = if self.amp {
            tape.scale(&value, self.scaler.scale()).map_err(autodiff)?
        } else {
            value
        };
        let gradients = self.store.backward(&tape, &value).map_err(autodiff)?;
        let mut staged: Vec<Tensor<f32>> = self
            .store
            .resident_grads_to_host()?
            .into_iter()
            .flatten()
            .collect();
        if refuse_first && self.store.steps() > 0 && !self.amp {
            match step_with(&mut self.store, &gradients, &another_family(&self.config)) {
                Err(BackendError::InvalidArgument(_)) => self.counts.refused_steps += 1,
                other => {
                    return Err(BackendError::Unknown(format!(
                        "a step of another family answered {other:?}"
                    )));
                }
            }
        }
        if !self.amp {
            step_with(&mut self.store, &gradients, &self.config)?;
            self.reference_step(&flat(&staged));
            return Ok(());
        }
        let host;
        let used = if self.rng.chance_percent(20) {
            let mut first = staged[0].clone().into_data();
            first[0] = [f32::INFINITY, f32::NAN, f32::NEG_INFINITY][self.rng.below(3) as usize];
            staged[0] = Tensor::new(staged[0].shape(), first)?;
            let pairs = leaves.iter().map(|leaf| leaf.var()).zip(staged.clone());
            host = Gradients::from_host(&tape, pairs).map_err(autodiff)?;
            &host
        } else {
            &gradients
        };
        let skipped = match &self.config {
            Sgd(config) => self.store.step_amp(used, config, &mut self.scaler),
            Adam(config) => self.store.step_adam_amp(used, config, &mut self.scaler),
            AdamW(config) => self.store.step_adamw_amp(used, config, &mut self.scaler),
            other => panic!("no AMP form of {other:?}"),
        }
        .map_err(autodiff)?;
        let grads = flat(&staged);
        let found_inf = grads.iter().any(|g| !g.is_finite());
        if skipped != found_inf {
            return Err(BackendError::Unknown(format!(
                "the AMP step skipped: {skipped}, non-finite gradients: {found_inf}"
            )));
        }
        if found_inf {
            self.counts.amp_skips += 1;
        } else {
            let inv_scale = f64::from(self.host_scaler.inv_scale());
            let unscaled: Vec<f64> = grads.iter().map(|g| g * inv_scale).collect();
            self.reference_step(&unscaled);
        }
        let _ = self.host_scaler.update(found_inf);
        if self.scaler != self.host_scaler {
            return Err(BackendError::Unknown(format!(
                "the scaler is {:?}, the reference's {:?}",
                self.scaler, self.host_scaler
            )));
        }
        Ok(())
    }

    fn reference_step(&mut self, grads: &[f64]) {
        self.reference_steps += 1;
        let segments = segments(&self.model.params);
        if let Err(error) = reference::step(
            &self.config,
            self.reference_steps,
            &segments,
            grads,
            &mut self.reference,
        ) {
            panic!(
                "the reference refused step {}: {error:?}",
                self.reference_steps
            );
        }
    }

    /// A forward registered and abandoned: nothing changes.
    fn abandon(&mut self) -> Result<(), BackendError> {
        let tape = Tape::new(&self.client);
        let leaves = self.store.register_resident_params(&tape)?;
        loss(&self.store, &tape, &leaves, &self.model)?;
        if !self.store.abandon_pending_forward()? {
            return Err(BackendError::Unknown(
                "a registered forward was not pending".into(),
            ));
        }
        self.counts.abandoned += 1;
        Ok(())
    }

    /// The store's checkpoint, through a file and back, restored into a
    /// new store that replaces it; kept, with the reference, to recover
    /// from. A failed restore leaves the store as it was.
    fn checkpoint_and_restore(&mut self) -> Result<(), BackendError> {
        let checkpoint = self.store.checkpoint()?;
        let unknown =
            |error: cistern_client::CheckpointError| BackendError::Unknown(error.to_string());
        let mut file = Vec::new();
        let run = serde_json::json!({"steps": self.reference_steps});
        write_checkpoint(&mut file, &checkpoint, &run).map_err(unknown)?;
        let read = read_checkpoint(&file).map_err(unknown)?;
        if read.store != checkpoint || read.run != run {
            return Err(BackendError::Unknown(
                "the checkpoint file changed the checkpoint".into(),
            ));
        }
        self.store = DeviceParamStore::restore(&Tape::new(&self.client), &read.store)?;
        self.saved = Some(Saved {
            checkpoint: read.store,
            reference: self.reference.clone(),
            reference_steps: self.reference_steps,
            scaler: self.scaler.clone(),
            host_scaler: self.host_scaler.clone(),
        });
        self.counts.restores += 1;
        Ok(())
    }

    /// The store reads back the reference's values, or refuses every call
    /// and is rebuilt.
    fn check(&mut self) -> Result<(), Failure> {
        let mut read = self.store.sync_to_host();
        if matches!(&read, Err(error) if operation_local(error)) && !self.store.is_poisoned() {
            self.counts.operation_local += 1;
            read = self.store.sync_to_host();
        }
        match read {
            Ok(values) => {
                if self.store.is_poisoned() {
                    return Err("a poisoned store returned its bytes".into());
                }
                let got = flat32(&values);
                let error = max_relative_error(&got, &self.reference.params, PARAM_FLOOR);
                if error > TOLERANCE {
                    return Err(format!(
                        "after {} steps of {:?} (amp: {}) the store is {error} from the reference",
                        self.reference_steps, self.config, self.amp
                    ));
                }
                if self.store.steps() != self.reference_steps {
                    return Err(format!(
                        "the store counts {} steps, the reference {}",
                        self.store.steps(),
                        self.reference_steps
                    ));
                }
                self.counts.steps_checked += 1;
                // Each step is compared from the store's own last values,
                // so f32 rounding does not accumulate over a long run.
                self.reference.params = flat(&values);
                self.last_good = values;
                Ok(())
            }
            Err(error) => {
                self.trace.push(format!("refused: {error:?}"));
                self.refuses_every_call(&error)?;
                self.counts.poisoned += 1;
                self.recover()
            }
        }
    }

    /// After a failed read the store is latched: every entry point answers
    /// `StorePoisoned`.
    fn refuses_every_call(&mut self, first: &BackendError) -> Result<(), Failure> {
        if !self.store.is_poisoned() {
            return Err(format!(
                "a read failed with {first:?} but the store is not latched"
            ));
        }
        let poisoned = |what: &str, result: Result<(), BackendError>| match result {
            Err(BackendError::StorePoisoned { .. }) => Ok(()),
            other => Err(format!("a poisoned store's {what} answered {other:?}")),
        };
        poisoned("sync_to_host", self.store.sync_to_host().map(|_| ()))?;
        poisoned("wait_device", self.store.wait_device())?;
        poisoned(
            "resident_grads_to_host",
            self.store.resident_grads_to_host().map(|_| ()),
        )?;
        poisoned(
            "abandon_pending_forward",
            self.store.abandon_pending_forward().map(|_| ()),
        )?;
        let tape = Tape::new(&self.client);
        poisoned(
            "register_resident_params",
            self.store.register_resident_params(&tape).map(|_| ()),
        )?;
        poisoned(
            "snapshot_resident_params",
            self.store.snapshot_resident_params(&tape).map(|_| ()),
        )
    }

    /// Invalidates a poisoned device and restores the store from its last
    /// checkpoint, rewinding the reference with it; without one, rebuilds
    /// it from its last good values with a fresh optimizer state and
    /// reference.
    fn recover(&mut self) -> Result<(), Failure> {
        if let Ok(ContextState::Poisoned { generation, .. }) = self.client.context_state() {
            match self.client.invalidate(generation) {
                Ok(ContextState::Active { .. }) => {}
                other => return Err(format!("the recovery answered {other:?}")),
            }
        }
        if let Some(saved) = self.saved.clone() {
            self.store = restore(&self.client, &saved.checkpoint, &mut self.trace)?;
            self.reference = saved.reference;
            self.reference_steps = saved.reference_steps;
            self.scaler = saved.scaler;
            self.host_scaler = saved.host_scaler;
            self.counts.recoveries += 1;
            self.counts.recovered_from_checkpoint += 1;
            return Ok(());
        }
        self.store = build(&self.client, &self.last_good, &mut self.trace)?;
        self.reference = ReferenceState::new(&self.config, flat(&self.last_good));
        self.reference_steps = 0;
        self.scaler = scaler();
        self.host_scaler = scaler();
        self.counts.recoveries += 1;
        Ok(())
    }
}

/// A store of `params`, retrying the operation-local failures a fault plan
/// may inject into its upload.
fn build(
    client: &ComputeClient,
    params: &[Tensor<f32>],
    trace: &mut Vec<String>,
) -> Result<DeviceParamStore, Failure> {
    let refs: Vec<&Tensor<f32>> = params.iter().collect();
    let mut last = None;
    for _attempt in 0..3 {
        match DeviceParamStore::new(&Tape::new(client), &refs) {
            Ok(store) => return Ok(store),
            Err(error) if operation_local(&error) => {
                trace.push(format!("build refused: {error:?}"));
                last = Some(error);
            }
            Err(error) => return Err(format!("the store could not be built: {error:?}")),
        }
    }
    Err(format!("the store could not be built: {last:?}"))
}

/// A store restored from `checkpoint`, retrying operation-local failures.
fn restore(
    client: &ComputeClient,
    checkpoint: &StoreCheckpoint,
    trace: &mut Vec<String>,
) -> Result<DeviceParamStore, Failure> {
    let mut last = None;
    for _attempt in 0..3 {
        match DeviceParamStore::restore(&Tape::new(client), checkpoint) {
            Ok(store) => return Ok(store),
            Err(error) if operation_local(&error) => {
                trace.push(format!("restore refused: {error:?}"));
                last = Some(error);
            }
            Err(error) => return Err(format!("the store could not be restored: {error:?}")),
        }
    }
    Err(format!("the store could not be restored: {last:?}"))
}

fn run(seed: u64, steps: usize) -> Result<(Counts, Vec<String>), Failure> {
    let mut sim = Sim::new(seed).map_err(|failure| format!("seed {seed}: {failure}"))?;
    for step in 0..steps {
        sim.step().map_err(|failure| {
            let start = sim.trace.len().saturating_sub(6);
            format!(
                "seed {seed}, step {step}: {failure}\n  last outcomes: {}",
                sim.trace[start..].join("\n    ")
            )
        })?;
    }
    Ok((sim.counts, sim.trace))
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    match text.trim().parse() {
        Ok(value) => Some(value),
        Err(_) => panic!("{name} must be a number, got {text:?}"),
    }
}

#[test]
fn the_store_matches_the_reference_or_refuses_every_call_under_seeded_faults() {
    let steps = env_number("CISTERN_STORE_SIM_STEPS").map_or(STEPS, |steps| steps as usize);
    let seeds: Vec<u64> = match env_number("CISTERN_STORE_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_number("CISTERN_STORE_SIM_SEEDS").unwrap_or(SEEDS)).collect(),
    };
    let mut total = Counts::default();
    let mut failures = Vec::new();
    for &seed in &seeds {
        match run(seed, steps) {
            Ok((counts, _)) => {
                total.steps_checked += counts.steps_checked;
                total.amp_skips += counts.amp_skips;
                total.refused_steps += counts.refused_steps;
                total.abandoned += counts.abandoned;
                total.operation_local += counts.operation_local;
                total.poisoned += counts.poisoned;
                total.recoveries += counts.recoveries;
                total.restores += counts.restores;
                total.recovered_from_checkpoint += counts.recovered_from_checkpoint;
            }
            Err(failure) => failures.push(failure),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed (replay one with CISTERN_STORE_SIM_SEED=N):\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n")
    );
    println!("{} seeds x {steps} steps: {total:?}", seeds.len());
    if seeds.len() as u64 >= SEEDS && steps >= STEPS {
        assert!(total.steps_checked > 100, "{total:?}");
        assert!(total.poisoned > 0 && total.recoveries > 0, "{total:?}");
        assert!(total.operation_local > 0, "{total:?}");
        assert!(total.abandoned > 0 && total.refused_steps > 0, "{total:?}");
        assert!(total.amp_skips > 0, "{total:?}");
        assert!(total.restores > 0, "{total:?}");
        assert!(total.recovered_from_checkpoint > 0, "{total:?}");
    }
}

#[test]
fn the_same_store_seed_replays_the_same_run() {
    for seed in [1, 6] {
        assert_eq!(run(seed, STEPS), run(seed, STEPS), "seed {seed}");
    }
}
