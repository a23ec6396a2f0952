//! `DeviceParamStore` training steps in the stress mix. Each client keeps
//! a small store of its own and steps it with seeded gradients, one
//! optimizer family per store (SGD, Adam, AdamW, RMSprop, Adagrad, LAMB,
//! then the AMP forms of SGD, Adam and AdamW; each new store takes the
//! next). After every step
//! the store either reads back what `cistern_optim`'s f64 reference
//! computes from the same gradients (within `cistern_optim::parity`'s
//! tolerance, the step count and the loss scaler equal), or it is latched
//! and refuses every call; anything else is a mismatch. A latched store is
//! rebuilt from its last good values once the error's handling (a
//! recovery, dropping stale handles) is done.

use cistern_client::{AutodiffError, BackendError, DeviceParamStore, Gradients, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_optim::OptimizerConfig::{self, Adagrad, Adam, AdamW, Lamb, RmsProp, Sgd};
use cistern_optim::parity::{PARAM_FLOOR, TOLERANCE, max_relative_error};
use cistern_optim::reference::{self, ReferenceState};
use cistern_optim::{
    AdagradConfig, AdamConfig, AdamWConfig, GradScaler, GradScalerConfig, LambConfig,
    RmsPropConfig, Segment, SgdConfig,
};

use super::{Next, RETRY_ATTEMPTS, Stopped, Worker};
use crate::stress::counters::Counters;
use crate::stress::handling::store_handling;

/// The store's tensors: two small layers' weights and biases.
const SHAPES: [&[usize]; 4] = [&[8, 16], &[8], &[4, 8], &[4]];
/// Steps a store takes before the client builds one of the next family.
const STEPS_PER_STORE: u64 = 16;
/// The share of AMP steps (in percent) given a non-finite gradient.
const NON_FINITE_PERCENT: u64 = 10;

/// An optimizer family a store steps with: its config and whether its steps are AMP's.
#[derive(Clone, Debug)]
struct Family {
    config: OptimizerConfig,
    amp: bool,
}

/// The families a client's stores take in turn; learning rates small
/// enough that no parameter crosses 0 within a store's steps.
fn families() -> [Family; 9] {
    let plain = |config| Family { config, amp: false };
    let amp = |config| Family { config, amp: true };
    [
        plain(Sgd(SgdConfig {
            lr: 0.005,
            momentum: 0.9,
            nesterov: true,
            ..SgdConfig::default()
        })),
        plain(Adam(AdamConfig {
            lr: 1e-3,
            weight_decay: 0.01,
            amsgrad: true,
            ..AdamConfig::default()
        })),
        plain(AdamW(AdamWConfig {
            lr: 1e-3,
            ..AdamWConfig::default()
        })),
        plain(RmsProp(RmsPropConfig {
            lr: 1e-4,
            centered: true,
            momentum: 0.9,
            ..RmsPropConfig::default()
        })),
        plain(Adagrad(AdagradConfig {
            lr: 1e-3,
            lr_decay: 0.1,
            ..AdagradConfig::default()
        })),
        plain(Lamb(LambConfig {
            lr: 1e-3,
            ..LambConfig::default()
        })),
        amp(Sgd(SgdConfig {
            lr: 0.002,
            momentum: 0.9,
            ..SgdConfig::default()
        })),
        amp(Adam(AdamConfig {
            lr: 1e-3,
            ..AdamConfig::default()
        })),
        amp(AdamW(AdamWConfig {
            lr: 1e-3,
            ..AdamWConfig::default()
        })),
    ]
}

fn scaler() -> Option<GradScaler> {
    GradScaler::new(GradScalerConfig {
        init_scale: 1024.0,
        growth_interval: 3,
        ..GradScalerConfig::default()
    })
    .ok()
}

/// A client's store and, beside it, everything its steps are checked against.
pub(crate) struct StoreRun {
    /// `None` before the first build, after a latch, and between families.
    store: Option<DeviceParamStore>,
    /// Which of [`families`] the store steps with.
    family: usize,
    /// Whether the next build replaces a latched or stale store.
    latched: bool,
    /// The context generation when the store was built: once the client
    /// has seen a later one, an invalidate took the store's memory.
    built_in: u64,
    /// The values the store last read back: what a new store starts from.
    last_good: Vec<Tensor<f32>>,
    /// The reference after each step since the store was built (the first
    /// before any): a step the device refused as transient after it was
    /// queued is put back by the store, and the reference goes back with it.
    history: Vec<ReferenceState>,
    scaler: Option<GradScaler>,
    host_scaler: Option<GradScaler>,
}

impl StoreRun {
    /// Client `client`'s run under `seed`: parameters drawn away from 0,
    /// the first family picked by the client's index.
    pub(crate) fn new(seed: u64, client: usize) -> Option<StoreRun> {
        let mut rng = SplitMix64::derived(seed ^ 0x5707_E000, client as u64);
        let last_good = SHAPES
            .iter()
            .map(|shape| {
                let numel = shape.iter().product();
                Tensor::new(shape.to_vec(), rng.non_zero_f32s(numel, 1.0)).ok()
            })
            .collect::<Option<Vec<_>>>()?;
        let family = client % families().len();
        Some(StoreRun {
            history: vec![ReferenceState::new(
                &families()[family].config,
                flat(&last_good),
            )],
            store: None,
            family,
            latched: false,
            built_in: 0,
            last_good,
            scaler: scaler(),
            host_scaler: scaler(),
        })
    }

    /// The steps the reference took since the store was built.
    fn reference_steps(&self) -> u64 {
        self.history.len().saturating_sub(1) as u64
    }

    fn family(&self) -> Family {
        let all = families();
        all[self.family % all.len()].clone()
    }

    /// Drops the store (`latched`: it was latched or stale, and the next one
    /// is a rebuild); the next one steps with the next family.
    fn retire(&mut self, latched: bool) {
        self.store = None;
        self.latched = latched;
        self.family += 1;
    }

    /// A fresh store's companions: the reference from the last good
    /// values, no steps, fresh scalers.
    fn start(&mut self, store: DeviceParamStore) {
        self.history = vec![ReferenceState::new(
            &self.family().config,
            flat(&self.last_good),
        )];
        self.scaler = scaler();
        self.host_scaler = scaler();
        self.store = Some(store);
    }
}

impl Worker<'_> {
    /// One `StoreStep` of the workload: build the store if there is none,
    /// step it with gradients drawn from `seed`, and check it.
    pub(super) fn store_step(&mut self, seed: u64) -> Result<(), Stopped> {
        let run = match self.store.take() {
            Some(run) => Some(run),
            None => StoreRun::new(self.shared.config.seed, self.index),
        };
        let Some(mut run) = run else {
            self.store_mismatch("the store's parameters could not be drawn".into());
            return Ok(());
        };
        let result = self.drive_store(&mut run, seed);
        self.store = Some(run);
        result
    }

    fn drive_store(&mut self, run: &mut StoreRun, seed: u64) -> Result<(), Stopped> {
        self.retire_if_stale(run);
        if run.store.is_none() && !self.build_store(run)? {
            return Ok(());
        }
        if !self.settle_store(run)? {
            return self.check_store(run);
        }
        let counters = &self.shared.counters;
        Counters::bump(&counters.store_steps);
        let family = run.family();
        let (grads, non_finite) = draw_gradients(seed, family.amp);
        let (client, stream) = (self.client.clone(), self.stream);
        let stepped = match (run.store.as_mut(), run.scaler.as_mut()) {
            (Some(store), scaler) => self.watched(|| {
                let tape = Tape::on_stream(&client, stream);
                step_store(&tape, store, &family, &grads, scaler)
            }),
            (None, _) => return Ok(()),
        };
        match stepped {
            Ok(skipped) => {
                if skipped != non_finite {
                    self.store_mismatch(format!(
                        "an AMP step skipped: {skipped}, with non-finite gradients: {non_finite}"
                    ));
                }
                if skipped {
                    Counters::bump(&counters.store_amp_skips);
                } else {
                    self.reference_step(run, &family, &grads);
                }
                if let Some(host) = run.host_scaler.as_mut().filter(|_| family.amp) {
                    let _ = host.update(non_finite);
                }
            }
            Err(error) => {
                self.handle_store(&error, 0)?;
                if run.store.as_ref().is_some_and(|store| !store.is_poisoned()) {
                    // Refused without harm: the check shows nothing changed
                    // (the next step puts back the pending forward).
                    Counters::bump(&counters.store_declined);
                }
            }
        }
        self.retire_if_stale(run);
        self.check_store(run)
    }

    /// A store built before the generation the client is in now lost its
    /// memory to an invalidate: it must refuse to read (never show bytes),
    /// and goes, to be rebuilt from its last good values.
    fn retire_if_stale(&mut self, run: &mut StoreRun) {
        let Some(store) = run.store.as_ref() else {
            return;
        };
        if run.built_in >= self.generation {
            return;
        }
        // An expected refusal, not counted as an error.
        if let Ok(values) = self.watched(|| store.sync_to_host()) {
            self.store_mismatch(format!(
                "a store of generation {} read back {} tensors in generation {}",
                run.built_in,
                values.len(),
                self.generation
            ));
        }
        Counters::bump(&self.shared.counters.store_stale);
        run.retire(true);
    }

    /// Before a step: drops a forward left pending by a refused step, and
    /// settles the store's queued work (putting back a step the device
    /// refused as transient, and the reference with it). Whether the store
    /// is ready for a step.
    fn settle_store(&mut self, run: &mut StoreRun) -> Result<bool, Stopped> {
        let mut attempt = 0;
        loop {
            let Some(store) = run.store.as_mut() else {
                return Ok(false);
            };
            match self.watched(|| store.abandon_pending_forward()) {
                Ok(_) => {
                    let steps = store.steps();
                    if self.follow_put_back(run, steps) {
                        return Ok(true);
                    }
                    run.retire(true);
                    return Ok(false);
                }
                Err(error) => match self.handle_store(&error, attempt)? {
                    Next::Retry if !store.is_poisoned() => attempt += 1,
                    _ => return Ok(false),
                },
            }
        }
    }

    /// Takes the reference back to the store's step count `steps`, if the
    /// store put back steps; a count the reference never had is a mismatch
    /// (and the caller retires the store, so one mismatch is counted once).
    /// Whether the two agree now.
    fn follow_put_back(&mut self, run: &mut StoreRun, steps: u64) -> bool {
        let taken = run.reference_steps();
        if steps == taken {
            return true;
        }
        if steps > taken {
            self.store_mismatch(format!(
                "the store counts {steps} steps, the reference {taken}"
            ));
            return false;
        }
        Counters::add(&self.shared.counters.store_put_back, taken - steps);
        run.history.truncate(steps as usize + 1);
        true
    }

    /// Builds the client's store from its last good values, handling each
    /// failure; whether there is a store now.
    fn build_store(&mut self, run: &mut StoreRun) -> Result<bool, Stopped> {
        let mut attempt = 0;
        loop {
            let generation = self.client.device_state().generation;
            let tape = Tape::on_stream(&self.client, self.stream);
            let params: Vec<&Tensor<f32>> = run.last_good.iter().collect();
            match self.watched(|| DeviceParamStore::new(&tape, &params)) {
                // A recovery during the build: which generation the store
                // is of is not known, so it goes at once.
                Ok(_) if self.client.device_state().generation != generation => {
                    if attempt + 1 >= RETRY_ATTEMPTS {
                        return Ok(false);
                    }
                    attempt += 1;
                }
                Ok(store) => {
                    let counters = &self.shared.counters;
                    Counters::bump(if run.latched {
                        &counters.store_rebuilds
                    } else {
                        &counters.store_builds
                    });
                    run.latched = false;
                    run.built_in = generation;
                    self.generation = self.generation.max(generation);
                    run.start(store);
                    return Ok(true);
                }
                Err(error) => match self.handle_store(&error, attempt)? {
                    Next::Retry => attempt += 1,
                    Next::Done => return Ok(false),
                },
            }
        }
    }

    fn reference_step(&mut self, run: &mut StoreRun, family: &Family, grads: &[Tensor<f32>]) {
        let inv_scale = match (family.amp, &run.host_scaler) {
            (true, Some(scaler)) => f64::from(scaler.inv_scale()),
            _ => 1.0,
        };
        let grads: Vec<f64> = flat(grads).iter().map(|g| g * inv_scale).collect();
        let Some(mut next) = run.history.last().cloned() else {
            return;
        };
        let step = run.reference_steps() + 1;
        match reference::step(&family.config, step, &segments(), &grads, &mut next) {
            Ok(()) => run.history.push(next),
            Err(error) => self.store_mismatch(format!("the reference refused its step: {error:?}")),
        }
    }

    /// The invariant after a step: the store reads back the reference's
    /// values, or it is latched and refuses every call (and goes, to be
    /// rebuilt).
    fn check_store(&mut self, run: &mut StoreRun) -> Result<(), Stopped> {
        let Some(store) = run.store.as_ref() else {
            return Ok(());
        };
        let mut attempt = 0;
        let read = loop {
            if store.is_poisoned() {
                break None;
            }
            match self.watched(|| store.sync_to_host()) {
                Ok(values) => break Some(values),
                Err(error) => match self.handle_store(&error, attempt)? {
                    Next::Retry if !store.is_poisoned() => attempt += 1,
                    // Latched (checked below), or not read this time: the
                    // next step's check covers this one's too.
                    _ => break None,
                },
            }
        };
        let counters = &self.shared.counters;
        match read {
            Some(_) if store.is_poisoned() => {
                self.store_mismatch("a latched store returned its bytes".into());
            }
            Some(values) => self.compare(run, values),
            None if store.is_poisoned() => {
                if let Err(call) = refuses_every_call(&self.client, self.stream, store) {
                    self.store_mismatch(format!("a latched store's {call}"));
                }
                Counters::bump(&counters.store_refused);
                run.retire(true);
            }
            None => {}
        }
        Ok(())
    }

    /// Compares what the store read back with the reference; the values
    /// become the reference's (so f32 rounding does not accumulate) and the
    /// last good ones. A store done with its family goes.
    fn compare(&mut self, run: &mut StoreRun, values: Vec<Tensor<f32>>) {
        let Some(store) = run.store.as_ref() else {
            return;
        };
        let steps = store.steps();
        if !self.follow_put_back(run, steps) {
            run.retire(true);
            return;
        }
        let got: Vec<f32> = values.iter().flat_map(|t| t.data().to_vec()).collect();
        let Some(reference) = run.history.last_mut() else {
            return;
        };
        let error = max_relative_error(&got, &reference.params, PARAM_FLOOR);
        if error > TOLERANCE || run.scaler != run.host_scaler {
            self.store_mismatch(format!(
                "after {steps} steps of {:?} the store is {error} from the reference; its \
                 scaler {:?} (the reference's {:?})",
                run.family(),
                run.scaler,
                run.host_scaler
            ));
            // Rebuilt from the last values that matched.
            run.retire(true);
            return;
        }
        Counters::bump(&self.shared.counters.store_verified);
        // Each step is compared from the store's own last values, so f32
        // rounding does not accumulate over a store's steps.
        reference.params = flat(&values);
        run.last_good = values;
        if steps >= STEPS_PER_STORE {
            run.retire(false);
        }
    }

    /// Counts a store `error` and handles it, on the `attempt`th try.
    fn handle_store(&mut self, error: &BackendError, attempt: u32) -> Result<Next, Stopped> {
        self.record_store(error);
        self.act(store_handling(error), error.code(), attempt, None, error)
    }

    fn store_mismatch(&self, line: String) {
        Counters::bump(&self.shared.counters.store_mismatches);
        self.shared
            .problem(format!("client {}: store mismatch: {line}", self.index));
    }
}

/// One gradient per slot of [`SHAPES`], uniform in [-1, 1), drawn from
/// `seed`; for an AMP step, one time in ten, with a non-finite first
/// element (and `true`).
fn draw_gradients(seed: u64, amp: bool) -> (Vec<Tensor<f32>>, bool) {
    let mut rng = SplitMix64::new(seed);
    let mut grads: Vec<Tensor<f32>> = SHAPES
        .iter()
        .filter_map(|shape| {
            let numel = shape.iter().product();
            Tensor::new(shape.to_vec(), rng.symmetric_f32s(numel)).ok()
        })
        .collect();
    let non_finite = amp && rng.chance_percent(NON_FINITE_PERCENT);
    let poisoned = [f32::INFINITY, f32::NAN, f32::NEG_INFINITY][rng.below(3) as usize];
    if non_finite && let Some(first) = grads.first_mut() {
        let shape = first.shape().to_vec();
        let mut data = first.clone().into_data();
        if let Some(value) = data.first_mut() {
            *value = poisoned;
        }
        if let Ok(tensor) = Tensor::new(shape, data) {
            *first = tensor;
        }
    }
    (grads, non_finite)
}

/// Registers the store's parameters on `tape`, hands it `grads` and takes
/// one step of `family`: whether an AMP step was skipped on the device.
fn step_store(
    tape: &Tape,
    store: &mut DeviceParamStore,
    family: &Family,
    grads: &[Tensor<f32>],
    scaler: Option<&mut GradScaler>,
) -> Result<bool, BackendError> {
    let leaves = store.register_resident_params(tape)?;
    let pairs = leaves
        .iter()
        .map(|leaf| leaf.var())
        .zip(grads.iter().cloned());
    let gradients = Gradients::from_host(tape, pairs).map_err(backend)?;
    match (&family.config, family.amp, scaler) {
        (Sgd(config), false, _) => store.step(&gradients, config).map(|()| false),
        (Adam(config), false, _) => store.step_adam(&gradients, config).map(|()| false),
        (AdamW(config), false, _) => store.step_adamw(&gradients, config).map(|()| false),
        (RmsProp(config), false, _) => store.step_rmsprop(&gradients, config).map(|()| false),
        (Adagrad(config), false, _) => store.step_adagrad(&gradients, config).map(|()| false),
        (Lamb(config), false, _) => store.step_lamb(&gradients, config).map(|()| false),
        (Sgd(config), true, Some(scaler)) => {
            store.step_amp(&gradients, config, scaler).map_err(backend)
        }
        (Adam(config), true, Some(scaler)) => store
            .step_adam_amp(&gradients, config, scaler)
            .map_err(backend),
        (AdamW(config), true, Some(scaler)) => store
            .step_adamw_amp(&gradients, config, scaler)
            .map_err(backend),
        (config, _, _) => Err(BackendError::InvalidArgument(format!(
            "no AMP step of {config:?}, or no scaler"
        ))),
    }
}

/// The latched `store` answers `StorePoisoned` to every call; the first
/// call that does not is the error.
fn refuses_every_call(
    client: &cistern_client::ComputeClient,
    stream: cistern_runtime::StreamId,
    store: &DeviceParamStore,
) -> Result<(), String> {
    let refused = |what: &str, result: Result<(), BackendError>| match result {
        Err(BackendError::StorePoisoned { .. }) => Ok(()),
        other => Err(format!("{what} answered {other:?}")),
    };
    refused("sync_to_host", store.sync_to_host().map(|_| ()))?;
    refused("wait_device", store.wait_device())?;
    refused(
        "resident_grads_to_host",
        store.resident_grads_to_host().map(|_| ()),
    )?;
    let tape = Tape::on_stream(client, stream);
    refused(
        "snapshot_resident_params",
        store.snapshot_resident_params(&tape).map(|_| ()),
    )?;
    if store.is_poisoned() {
        Ok(())
    } else {
        Err("is_poisoned answered false".into())
    }
}

fn backend(error: AutodiffError) -> BackendError {
    match error {
        AutodiffError::Backend(error) => error,
        other => BackendError::InvalidArgument(other.to_string()),
    }
}

/// `tensors` concatenated, in f64.
fn flat(tensors: &[Tensor<f32>]) -> Vec<f64> {
    tensors
        .iter()
        .flat_map(|t| t.data().iter().map(|&v| f64::from(v)))
        .collect()
}

/// One slot per tensor of [`SHAPES`], packed: the store's segment table.
fn segments() -> Vec<Segment> {
    let mut offset = 0;
    SHAPES
        .iter()
        .map(|shape| {
            let numel: usize = shape.iter().product();
            let segment = Segment::new(offset, numel);
            offset += numel;
            segment
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_families_are_every_optimizer_then_the_three_amp_forms() {
        let all = families();
        let plain: Vec<_> = all.iter().filter(|f| !f.amp).collect();
        let names: Vec<_> = plain
            .iter()
            .map(|f| {
                format!("{:?}", f.config)
                    .split('(')
                    .next()
                    .map(str::to_string)
            })
            .collect();
        let expected = ["Sgd", "Adam", "AdamW", "RmsProp", "Adagrad", "Lamb"];
        assert_eq!(names, expected.map(|n| Some(n.to_string())));
        assert!(all.iter().all(|f| f.config.validate().is_ok()));
        let amp: Vec<_> = all.iter().filter(|f| f.amp).collect();
        assert_eq!(amp.len(), 3);
        assert!(
            amp.iter()
                .all(|f| matches!(f.config, Sgd(_) | Adam(_) | AdamW(_)))
        );
    }

    #[test]
    fn the_segments_pack_the_shapes_in_order() {
        let segments = segments();
        let numels: Vec<usize> = SHAPES.iter().map(|s| s.iter().product()).collect();
        assert_eq!(segments.len(), numels.len());
        let mut offset = 0;
        for (segment, numel) in segments.iter().zip(numels) {
            assert_eq!((segment.offset, segment.len), (offset, numel));
            offset += numel;
        }
    }

    #[test]
    fn a_client_starts_from_its_own_seeded_parameters_away_from_zero() {
        let (a, b, other) = (
            StoreRun::new(1, 2),
            StoreRun::new(1, 2),
            StoreRun::new(1, 3),
        );
        let (Some(a), Some(b), Some(other)) = (a, b, other) else {
            panic!("the parameters are drawn");
        };
        assert_eq!(a.last_good, b.last_good);
        assert_ne!(a.last_good, other.last_good);
        assert_eq!(a.family, 2);
        assert_eq!(a.reference_steps(), 0);
        assert!(flat(&a.last_good).iter().all(|v| v.abs() >= 0.5));
    }
}
