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

/// A regression problem and the parameters of `tanh(x·W1ᵀ + b1)·W2ᵀ + b2`.
pub struct Model {
    pub x: Tensor<f32>,
    pub y: Tensor<f32>,
    /// W1 (6×4), b1 (6), W2 (3×6), b2 (3).
    pub params: Vec<Tensor<f32>>,
}

/// The model drawn from `seed`.
pub fn model(seed: u64) -> Model {
    let mut rng = SplitMix64::new(seed);
    Model {
        x: random(&mut rng, &[8, 4]),
        y: random(&mut rng, &[8, 3]),
        params: vec![
            random(&mut rng, &[6, 4]),
            random(&mut rng, &[6]),
            random(&mut rng, &[3, 6]),
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
