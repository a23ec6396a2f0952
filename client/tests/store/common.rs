//! What every store test shares: the tape tests' client and helpers, a
//! two-layer model whose parameters live in a store, and one training step.

#![allow(dead_code)]

#[path = "../tape/common.rs"]
mod tape_common;

pub use tape_common::{ok, open, open_with, random, wide};

use cistern_client::{
    BackendError, ComputeClient, DeviceParamStore, Gradients, ResidentLeaf, Tape, Tensor, Var,
};
use cistern_memory::SplitMix64;
use cistern_runtime::Activation;

/// A regression problem and the parameters of `tanh(x·W1 + b1)·W2 + b2`
/// (weights `[in, out]`, the store's layout).
pub struct Model {
    pub x: Tensor<f32>,
    pub y: Tensor<f32>,
    /// W1 (4×6), b1 (6), W2 (6×3), b2 (3).
    pub params: Vec<Tensor<f32>>,
}

/// The model drawn from `seed`.
pub fn model(seed: u64) -> Model {
    let mut rng = SplitMix64::new(seed);
    Model {
        x: random(&mut rng, &[8, 4]),
        y: random(&mut rng, &[8, 3]),
        params: vec![
            random(&mut rng, &[4, 6]),
            random(&mut rng, &[6]),
            random(&mut rng, &[6, 3]),
            random(&mut rng, &[3]),
        ],
    }
}

/// A store of `model`'s parameters on `client`.
pub fn store(client: &ComputeClient, model: &Model) -> DeviceParamStore {
    let tape = Tape::new(client);
    let params: Vec<&Tensor<f32>> = model.params.iter().collect();
    ok(DeviceParamStore::new(&tape, &params), "the store")
}

/// The model's loss on `tape` with the store's `leaves`.
pub fn loss<'t>(
    store: &DeviceParamStore,
    tape: &'t Tape,
    leaves: &[ResidentLeaf<'t>],
    model: &Model,
) -> Result<Var<'t>, BackendError> {
    let (w1, b1, w2, b2) = (&leaves[0], &leaves[1], &leaves[2], &leaves[3]);
    let x = tape.upload(&model.x).map_err(backend)?;
    let y = tape.upload(&model.y).map_err(backend)?;
    let h = store.linear_forward_with_activation(tape, &x, w1, Some(b1), Activation::Tanh)?;
    let pred = store.linear_forward(tape, &h, w2, Some(b2))?;
    tape.mse_loss(&pred, &y).map_err(backend)
}

fn backend(error: cistern_client::AutodiffError) -> BackendError {
    match error {
        cistern_client::AutodiffError::Backend(error) => error,
        other => BackendError::InvalidArgument(other.to_string()),
    }
}

/// Registers, runs the forward and the store's backward on a new tape,
/// then hands the store and the gradients to `then`.
pub fn with_gradients<R>(
    client: &ComputeClient,
    store: &mut DeviceParamStore,
    model: &Model,
    then: impl FnOnce(&mut DeviceParamStore, &Gradients<'_>) -> R,
) -> R {
    let tape = Tape::new(client);
    let leaves = ok(store.register_resident_params(&tape), "register");
    let loss = ok(loss(store, &tape, &leaves, model), "forward");
    let gradients = ok(store.backward(&tape, &loss), "backward");
    then(store, &gradients)
}

/// `tensors` concatenated, in f64.
pub fn flat(tensors: &[Tensor<f32>]) -> Vec<f64> {
    tensors.iter().flat_map(wide).collect()
}

/// `tensors` concatenated.
pub fn flat32(tensors: &[Tensor<f32>]) -> Vec<f32> {
    tensors.iter().flat_map(|t| t.data().to_vec()).collect()
}

/// One slot per tensor, packed: the store's segment table.
pub fn segments(params: &[Tensor<f32>]) -> Vec<cistern_optim::Segment> {
    let mut offset = 0;
    params
        .iter()
        .map(|tensor| {
            let segment = cistern_optim::Segment::new(offset, tensor.len());
            offset += tensor.len();
            segment
        })
        .collect()
}

/// The store's step method for `config`'s family.
pub fn step_with(
    store: &mut DeviceParamStore,
    gradients: &Gradients<'_>,
    config: &cistern_optim::OptimizerConfig,
) -> Result<(), BackendError> {
    use cistern_optim::OptimizerConfig::*;
    match config {
        Sgd(config) => store.step(gradients, config),
        Adam(config) => store.step_adam(gradients, config),
        AdamW(config) => store.step_adamw(gradients, config),
        RmsProp(config) => store.step_rmsprop(gradients, config),
        Adagrad(config) => store.step_adagrad(gradients, config),
        Lamb(config) => store.step_lamb(gradients, config),
    }
}

/// 20 steps of `config` through the store, each checked against the
/// reference fed the same gradients (read back from the staging buffer):
/// max relative error ≤ 1e-5 with `cistern_optim::parity`'s floor.
/// Learning rates are small enough that no parameter crosses 0, where the
/// floor would measure f32 rounding instead of the update.
pub fn matches_the_reference_over_20_steps(config: cistern_optim::OptimizerConfig) {
    use cistern_optim::parity::{PARAM_FLOOR, TOLERANCE, max_relative_error};
    use cistern_optim::reference::{self, ReferenceState};
    let client = open();
    let model = model(0x5_6D);
    let mut store = store(&client, &model);
    let segments = segments(&model.params);
    let mut want = ReferenceState::new(&config, flat(&model.params));
    for step in 1..=20 {
        let grads = with_gradients(&client, &mut store, &model, |store, gradients| {
            let staged = ok(store.resident_grads_to_host(), "resident grads");
            let grads: Vec<Tensor<f32>> = staged.into_iter().flatten().collect();
            assert_eq!(grads.len(), 4, "every slot is staged");
            ok(step_with(store, gradients, &config), "step");
            flat(&grads)
        });
        ok(
            reference::step(&config, step, &segments, &grads, &mut want),
            "reference",
        );
        let got = flat32(&ok(store.sync_to_host(), "sync_to_host"));
        let error = max_relative_error(&got, &want.params, PARAM_FLOOR);
        assert!(error <= TOLERANCE, "step {step} of {config:?}: {error}");
    }
    assert_eq!(store.steps(), 20);
}
