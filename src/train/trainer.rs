//! One training step behind a small trait, so the step can change (the
//! parameter store's captured step, when it lands) without the loop, the
//! output or the saved model changing.

use cistern_client::{ComputeClient, OptimizerState, Tape, Tensor};
use cistern_optim::{OptimizerConfig, Segment};
use cistern_runtime::OptimizerStep;

use super::failure::Failure;
use super::model::DeviceModel;

/// What a training loop needs from a step.
pub trait Trainer {
    /// One step on the batch `features` (`rows × inputs`) and `targets`
    /// (`rows × 1`): forward, MSE loss, backward, optimizer update of the
    /// parameters in place. Returns the batch's loss before the update.
    fn step(&mut self, features: &Tensor<f32>, targets: &Tensor<f32>) -> Result<f32, Failure>;

    /// The model as it stands after the steps taken.
    fn model(&self) -> &DeviceModel;

    /// Steps taken.
    fn steps(&self) -> u64;
}

/// The step of today: the tape's forward and backward over resident
/// parameter buffers, then the runtime's fused optimizer kernel on each
/// parameter tensor in place (one launch per tensor, its own state
/// buffers). Nothing waits for the device but the loss read.
#[derive(Debug)]
pub struct TapeTrainer {
    client: ComputeClient,
    model: DeviceModel,
    config: OptimizerConfig,
    states: Vec<OptimizerState>,
    steps: u64,
}

impl TapeTrainer {
    /// A trainer of `model` with `config`, its optimizer state allocated
    /// on the model's device.
    pub fn new(
        client: &ComputeClient,
        model: DeviceModel,
        config: OptimizerConfig,
    ) -> Result<Self, Failure> {
        let states = model
            .parameters
            .iter()
            .map(|buffer| client.optimizer_state(&config, buffer.size() / 4))
            .collect::<Result<_, _>>()?;
        Ok(TapeTrainer {
            client: client.clone(),
            model,
            config,
            states,
            steps: 0,
        })
    }
}

impl Trainer for TapeTrainer {
    fn step(&mut self, features: &Tensor<f32>, targets: &Tensor<f32>) -> Result<f32, Failure> {
        let step = self.steps + 1;
        let tape = Tape::new(&self.client);
        let leaves = self.model.leaves(&tape)?;
        let input = tape.upload(features)?;
        let target = tape.upload(targets)?;
        let output = self.model.forward(&tape, &leaves, input)?;
        let loss = tape.mse_loss(&output, &target)?;
        let gradients = tape.backward(&loss)?;
        let mut tokens = Vec::with_capacity(leaves.len());
        for ((leaf, buffer), state) in leaves.iter().zip(&self.model.parameters).zip(&self.states) {
            let gradient = gradients.get(leaf)?.ok_or_else(|| {
                Failure::Usage("a parameter the loss does not reach has no gradient".into())
            })?;
            let bytes = buffer.size();
            let command = OptimizerStep::new(
                self.config.clone(),
                step,
                vec![Segment::new(0, (bytes / 4) as usize)],
                buffer.whole(),
                gradient.buffer().range(0, bytes),
                state.bindings(),
            );
            tokens.push(self.client.optimizer_step(tape.stream(), command)?);
        }
        // The read waits for the stream, so the updates queued before it ran.
        let value = loss.item()?;
        for token in tokens {
            token.wait()?;
        }
        self.steps = step;
        Ok(value)
    }

    fn model(&self) -> &DeviceModel {
        &self.model
    }

    fn steps(&self) -> u64 {
        self.steps
    }
}
