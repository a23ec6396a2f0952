//! `--model vit`: the vision transformer of `crate::vit` on its store,
//! trained through the tape (dropout on) and evaluated without dropout.
//! Each row of features is one 8×8 digit, row-major: 8 tokens of 8.

use cistern_client::{ComputeClient, CrossEntropyOptions, DeviceParamStore, Tape, Tensor, Var};
use cistern_memory::SplitMix64;
use cistern_optim::OptimizerConfig;

use super::super::failure::Failure;
use crate::vit::{self, CLASSES, PIXELS, ROWS};

/// Images per evaluation chunk.
const CHUNK: usize = 256;
/// Dropout seeds a step may use (a forward takes 4).
const SEEDS_PER_STEP: u64 = 1 << 20;

/// The vision transformer's parameters on the device, and its dropout seeds.
#[derive(Debug)]
pub struct Vit {
    client: ComputeClient,
    store: DeviceParamStore,
    /// The training steps' tape, on the store's stream (no waits between
    /// streams) and reset for each step to reuse its buffers (none after a
    /// failed step: the next makes a new one).
    tape: Option<Box<Tape>>,
    seed: u64,
    parameters: usize,
}

impl Vit {
    /// A new model on `client`'s device, initialised from `seed`; refuses
    /// data that are not 64-pixel images of 10 classes.
    pub fn new(
        client: &ComputeClient,
        seed: u64,
        width: usize,
        classes: usize,
    ) -> Result<Self, Failure> {
        if width != ROWS * PIXELS || classes != CLASSES {
            return Err(Failure::Usage(format!(
                "--model vit takes 8×8 images of {CLASSES} classes; these data have \
                 {width} features and {classes} classes"
            )));
        }
        let mut rng = SplitMix64::new(seed);
        let params = vit::parameters(&mut rng)
            .map_err(|e| Failure::Usage(format!("the model's parameters: {e}")))?;
        let parameters = params.iter().map(Tensor::len).sum();
        let refs: Vec<&Tensor<f32>> = params.iter().collect();
        let store = DeviceParamStore::new(&Tape::new(client), &refs)?;
        Ok(Vit {
            client: client.clone(),
            store,
            tape: None,
            seed: seed.wrapping_mul(SEEDS_PER_STEP),
            parameters,
        })
    }

    /// The parameters' count.
    pub fn parameter_count(&self) -> usize {
        self.parameters
    }

    /// One step (dropout on) through the tape and the store's fused step of
    /// `config`'s family; the batch's loss before the update.
    pub fn tape_step(
        &mut self,
        features: &Tensor<f32>,
        labels: &[i64],
        options: &CrossEntropyOptions,
        config: &OptimizerConfig,
    ) -> Result<f32, Failure> {
        let reused = self
            .tape
            .take()
            .and_then(|mut tape| tape.reset().ok().map(|()| tape));
        let tape =
            reused.unwrap_or_else(|| Box::new(Tape::on_stream(&self.client, self.store.stream())));
        let loss = self.step_on(&tape, features, labels, options, config)?;
        self.tape = Some(tape);
        Ok(loss)
    }

    /// [`tape_step`](Self::tape_step) recorded on `tape`.
    fn step_on(
        &mut self,
        tape: &Tape,
        features: &Tensor<f32>,
        labels: &[i64],
        options: &CrossEntropyOptions,
        config: &OptimizerConfig,
    ) -> Result<f32, Failure> {
        let leaves = self.store.register_resident_params(tape)?;
        let params: Vec<Var<'_>> = leaves.iter().map(|leaf| leaf.var()).collect();
        let b = labels.len();
        let images = images(features.data(), b)?;
        let images = tape.upload(&images)?;
        let zeros = tape.upload(&zeros(b)?)?;
        self.seed = self.seed.wrapping_add(SEEDS_PER_STEP);
        let mut dropout = vit::Dropout::training(self.seed);
        let logits = vit::forward(tape, &params, &images, &zeros, &mut dropout)?;
        let targets = tape.class_targets(labels)?;
        let loss = tape.cross_entropy(&logits, &targets, options)?;
        let gradients = self.store.backward(tape, &loss)?;
        let store = &mut self.store;
        match config {
            OptimizerConfig::Sgd(c) => store.step(&gradients, c)?,
            OptimizerConfig::Adam(c) => store.step_adam(&gradients, c)?,
            OptimizerConfig::AdamW(c) => store.step_adamw(&gradients, c)?,
            OptimizerConfig::RmsProp(c) => store.step_rmsprop(&gradients, c)?,
            OptimizerConfig::Adagrad(c) => store.step_adagrad(&gradients, c)?,
            OptimizerConfig::Lamb(c) => store.step_lamb(&gradients, c)?,
        }
        Ok(loss.item()?)
    }

    /// The logits (`rows × 10`, row-major) of row-major `features`, no dropout.
    pub fn logits(&self, features: &[f32]) -> Result<Vec<f32>, Failure> {
        let mut outputs = Vec::with_capacity(features.len() / (ROWS * PIXELS) * CLASSES);
        for chunk in features.chunks(CHUNK * ROWS * PIXELS) {
            let b = chunk.len() / (ROWS * PIXELS);
            let tape = Tape::new(&self.client);
            let leaves = self.store.snapshot_resident_params(&tape)?;
            let params: Vec<Var<'_>> = leaves.iter().map(|leaf| leaf.var()).collect();
            let x = tape.upload(&images(chunk, b)?)?;
            let zeros = tape.upload(&zeros(b)?)?;
            let logits = vit::forward(&tape, &params, &x, &zeros, &mut vit::Dropout::off())?;
            outputs.extend(logits.to_host()?.into_data());
        }
        Ok(outputs)
    }

    /// The store, for its state.
    pub fn store(&self) -> &DeviceParamStore {
        &self.store
    }
}

/// `b` images `[b, 8, 8]` of row-major features.
fn images(features: &[f32], b: usize) -> Result<Tensor<f32>, Failure> {
    Tensor::new([b, ROWS, PIXELS], features.to_vec())
        .map_err(|e| Failure::Usage(format!("the images: {e}")))
}

fn zeros(b: usize) -> Result<Tensor<f32>, Failure> {
    vit::zeros(b).map_err(|e| Failure::Usage(format!("the class token's zeros: {e}")))
}
