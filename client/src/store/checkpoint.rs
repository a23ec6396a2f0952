//! The store's state out and in: its parameters and its optimizer's state
//! downloaded as a [`StoreCheckpoint`], and a store restored from one on
//! any device, whose next step is the original's, bit for bit.

use cistern_optim::OptimizerConfig;
use cistern_runtime::AllocationPolicy;

use super::state::OptimizerRun;
use super::store::DeviceParamStore;
use crate::compute::{Buffer, f32_bytes};
use crate::error::BackendError;
use crate::tape::{Tape, Tensor};

/// What a store needs to resume: its parameters and, once it stepped, its
/// optimizer's state. Plain host data: keep it, send it, restore it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreCheckpoint {
    /// Each slot's shape, in registration order.
    pub shapes: Vec<Vec<usize>>,
    /// The parameters, concatenated in slot order.
    pub params: Vec<f32>,
    /// The optimizer's state; `None` before the first step.
    pub optimizer: Option<OptimizerCheckpoint>,
}

/// An optimizer's state: its family and configuration, the steps it took
/// and its state buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerCheckpoint {
    /// The latest step's configuration (its family fixes the state).
    pub config: OptimizerConfig,
    /// Steps applied.
    pub steps: u64,
    /// One buffer per entry of the config's state layout, in its order,
    /// each as long as the parameters.
    pub state: Vec<Vec<f32>>,
}

impl DeviceParamStore {
    /// The store's parameters and optimizer state, downloaded once every
    /// queued step ran (a failed one latches the store and is returned).
    /// A store whose step count is on the device (an AMP step with no
    /// synchronisation ran) is `InvalidArgument`: its checkpoint would
    /// lack the device's scale and count.
    pub fn checkpoint(&self) -> Result<StoreCheckpoint, BackendError> {
        self.enter()?;
        let optimizer = match self.state.optimizer() {
            None => None,
            Some(run) if run.device_amp.is_some() => {
                return Err(BackendError::InvalidArgument(
                    "this store's step count is on the device (an AMP step with no \
                     synchronisation ran): a checkpoint needs synchronising steps"
                        .into(),
                ));
            }
            Some(run) => Some(OptimizerCheckpoint {
                config: run.config.clone(),
                steps: run.steps,
                state: run
                    .state
                    .iter()
                    .map(|buffer| self.download_floats(buffer))
                    .collect::<Result<_, _>>()?,
            }),
        };
        Ok(StoreCheckpoint {
            shapes: self.shapes(),
            params: self.download_floats(&self.params)?,
            optimizer,
        })
    }

    /// A store on `tape`'s device holding `checkpoint`: its next step
    /// equals the checkpointed store's next step on the same backend, bit
    /// for bit. Parameters that do not fill the shapes, a state buffer
    /// missing, extra or of the wrong length, or an invalid configuration
    /// is `InvalidArgument` naming it; nothing is kept on a refusal.
    pub fn restore(tape: &Tape, checkpoint: &StoreCheckpoint) -> Result<Self, BackendError> {
        let tensors = tensors_of(checkpoint)?;
        let optimizer = match &checkpoint.optimizer {
            Some(optimizer) => Some(check_optimizer(optimizer, checkpoint.params.len())?),
            None => None,
        };
        let refs: Vec<&Tensor<f32>> = tensors.iter().collect();
        let mut store = DeviceParamStore::new(tape, &refs)?;
        if let Some(optimizer) = optimizer {
            let state = optimizer
                .state
                .iter()
                .map(|values| store.upload_floats(values))
                .collect::<Result<Vec<Buffer>, _>>()?;
            store.state.restore_optimizer(OptimizerRun {
                config: optimizer.config.clone(),
                state,
                steps: optimizer.steps,
                device_amp: None,
            });
        }
        Ok(store)
    }

    fn download_floats(&self, buffer: &Buffer) -> Result<Vec<f32>, BackendError> {
        let read = self
            .client
            .read_on(self.stream.id, buffer, 0, buffer.size());
        Ok(crate::compute::bytes_f32(&self.after_wait(read)?))
    }

    fn upload_floats(&self, values: &[f32]) -> Result<Buffer, BackendError> {
        let bytes = self.layout.bytes();
        let buffer = self
            .client
            .reserve_with(bytes, AllocationPolicy::Allow, self.stream.id)?;
        self.client
            .write_on(self.stream.id, &buffer, 0, &f32_bytes(values))?;
        Ok(buffer)
    }
}

/// The checkpoint's parameters cut into its shapes.
fn tensors_of(checkpoint: &StoreCheckpoint) -> Result<Vec<Tensor<f32>>, BackendError> {
    let mut tensors = Vec::with_capacity(checkpoint.shapes.len());
    let mut start = 0usize;
    for (slot, shape) in checkpoint.shapes.iter().enumerate() {
        let len = shape.iter().product::<usize>();
        let data = checkpoint.params.get(start..start + len).ok_or_else(|| {
            BackendError::InvalidArgument(format!(
                "checkpoint params: {} floats do not fill slot {slot} (shape {shape:?})",
                checkpoint.params.len()
            ))
        })?;
        tensors.push(Tensor::new(shape.clone(), data.to_vec())?);
        start += len;
    }
    if start != checkpoint.params.len() {
        return Err(BackendError::InvalidArgument(format!(
            "checkpoint params: {} floats for shapes of {start}",
            checkpoint.params.len()
        )));
    }
    Ok(tensors)
}

/// The optimizer part's own checks: a valid config and one buffer of the
/// parameters' length per entry of its state layout.
fn check_optimizer(
    optimizer: &OptimizerCheckpoint,
    numel: usize,
) -> Result<&OptimizerCheckpoint, BackendError> {
    optimizer.config.validate().map_err(|error| {
        BackendError::InvalidArgument(format!("checkpoint optimizer config: {error}"))
    })?;
    let layout = optimizer.config.state_layout().buffers;
    if layout.len() != optimizer.state.len() {
        return Err(BackendError::InvalidArgument(format!(
            "checkpoint optimizer state: {} buffers, the config's layout has {}",
            optimizer.state.len(),
            layout.len()
        )));
    }
    for (buffer, values) in layout.iter().zip(&optimizer.state) {
        if values.len() != numel {
            return Err(BackendError::InvalidArgument(format!(
                "checkpoint optimizer state `{}`: {} floats, the parameters have {numel}",
                buffer.name,
                values.len()
            )));
        }
    }
    Ok(optimizer)
}
