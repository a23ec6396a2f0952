//! `--model vit`: the vision transformer of `crate::vit` on its store,
//! trained through the tape (dropout on) and evaluated without dropout.
//! Each row of features is one 8×8 digit, row-major: 8 tokens of 8.

use cistern_client::{ComputeClient, CrossEntropyOptions, DeviceParamStore, Tape, Tensor, Var};
use cistern_memory::SplitMix64;
use cistern_optim::OptimizerConfig;

use super::super::failure::Failure;
use crate::vit::{self, CLASSES, PIXELS, ROWS, VitSteps};

/// Images per evaluation chunk.
const CHUNK: usize = 256;
/// Dropout seeds a step may use (a forward takes 4).
const SEEDS_PER_STEP: u64 = 1 << 20;

/// The vision transformer's parameters on the device, and its steps.
#[derive(Debug)]
pub struct Vit {
    client: ComputeClient,
    store: DeviceParamStore,
    /// The steps: recorded on a tape on the store's stream, or replayed
    /// as a graph (`vit::VitSteps`).
    steps: VitSteps,
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
        let mut store = DeviceParamStore::new(&Tape::new(client), &refs)?;
        let steps = VitSteps::new(client, &mut store, seed.wrapping_mul(SEEDS_PER_STEP), true)?;
        Ok(Vit {
            client: client.clone(),
            store,
            steps,
            parameters,
        })
    }

    /// The parameters' count.
    pub fn parameter_count(&self) -> usize {
        self.parameters
    }

    /// One step (dropout on) of `config`'s family; the batch's loss before
    /// the update.
    pub fn tape_step(
        &mut self,
        features: &Tensor<f32>,
        labels: &[i64],
        options: &CrossEntropyOptions,
        config: &OptimizerConfig,
    ) -> Result<f32, Failure> {
        let rows = labels.len();
        if features.len() != rows * ROWS * PIXELS {
            return Err(Failure::Usage(format!(
                "{} features for {rows} images of {} pixels",
                features.len(),
                ROWS * PIXELS
            )));
        }
        let loss = self
            .steps
            .step(&mut self.store, features.data(), labels, options, config)?;
        Ok(loss)
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
