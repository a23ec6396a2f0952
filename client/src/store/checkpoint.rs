//! The store's state out and in: its parameters and its optimizer's state
//! downloaded as a [`StoreCheckpoint`], and a store restored from one on
//! any device, whose next step is the original's, bit for bit.

use cistern_optim::{GradScalerConfig, OptimizerConfig};
use cistern_runtime::{AllocationPolicy, ScaleRule};

use std::io::{Seek, Write};

use super::amp::DeviceAmpState;
use super::checkpoint_file::{CheckpointError, PartWriter, header_of};
use super::state::OptimizerRun;
use super::store::DeviceParamStore;
use crate::compute::{Buffer, f32_bytes};
use crate::error::BackendError;
use crate::tape::{Tape, Tensor};

/// Bytes per download of a streamed checkpoint: small enough that the
/// allocator reuses its memory (no fresh pages to fault in per read),
/// large enough that a read's round trip is nothing beside its copy.
const STREAMED_CHUNK: u64 = 8 << 20;

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
    /// The device form of AMP's words, once a
    /// [`step_amp_on_device`](DeviceParamStore::step_amp_on_device) ran.
    pub device_amp: Option<DeviceAmpCheckpoint>,
}

/// The device form of AMP as it stood: its rule (fixed by its first step)
/// and its words (scale, tracker, skips, steps).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceAmpCheckpoint {
    /// The scale's multiplier after `growth_interval` clean steps.
    pub growth_factor: f64,
    /// The scale's multiplier after a skipped step.
    pub backoff_factor: f64,
    /// Clean steps before the scale grows.
    pub growth_interval: u32,
    /// The words the device held.
    pub state: DeviceAmpState,
}

impl DeviceParamStore {
    /// The store's parameters and optimizer state (with the device form
    /// of AMP's words), downloaded once every queued step ran (a failed
    /// one latches the store and is returned).
    pub fn checkpoint(&self) -> Result<StoreCheckpoint, BackendError> {
        self.enter()?;
        let optimizer = match self.state.optimizer() {
            None => None,
            Some(run) => {
                let (device_amp, steps) = self.amp_and_steps(run)?;
                Some(OptimizerCheckpoint {
                    config: run.config.clone(),
                    steps,
                    state: run
                        .state
                        .iter()
                        .map(|buffer| self.download_floats(buffer))
                        .collect::<Result<_, _>>()?,
                    device_amp,
                })
            }
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
            let device_amp = match &optimizer.device_amp {
                None => None,
                Some(amp) => {
                    let words = store.reserved_amp_words()?;
                    let DeviceAmpState {
                        scale,
                        growth_tracker,
                        skipped,
                        steps,
                    } = amp.state;
                    store.seed_amp_words(&words, scale, growth_tracker, skipped, steps)?;
                    Some(ScaleRule {
                        growth_factor: amp.growth_factor,
                        backoff_factor: amp.backoff_factor,
                        growth_interval: amp.growth_interval,
                    })
                }
            };
            store.state.restore_optimizer(OptimizerRun {
                config: optimizer.config.clone(),
                state,
                steps: optimizer.steps,
                device_amp,
            });
        }
        Ok(store)
    }

    /// Writes this store's checkpoint with the caller's `run` state to
    /// `out` as a checkpoint file, downloaded in chunks, each written (on
    /// a thread of its own) while the next is read. A failed download
    /// latches the store, as [`checkpoint`](Self::checkpoint)'s does, and
    /// is `CheckpointError::Device`.
    pub(super) fn stream_checkpoint<W: Write + Seek + Send>(
        &self,
        out: W,
        run: &serde_json::Value,
    ) -> Result<W, CheckpointError> {
        self.enter().map_err(CheckpointError::Device)?;
        let run_state = self.state.optimizer();
        let (device_amp, steps) = match run_state {
            Some(run) => self.amp_and_steps(run).map_err(CheckpointError::Device)?,
            None => (None, 0),
        };
        let header = header_of(
            &self.shapes(),
            run_state.map(|run| (&run.config, steps, device_amp.as_ref())),
        );
        let buffers: Vec<&Buffer> = std::iter::once(&self.params)
            .chain(run_state.iter().flat_map(|run| run.state.iter()))
            .collect();
        let writer = PartWriter::start(out, &header, run)?;
        std::thread::scope(|scope| {
            let (parts, arriving) = std::sync::mpsc::sync_channel::<Vec<u8>>(2);
            let written = scope.spawn(move || {
                let mut writer = writer;
                for part in arriving {
                    writer.part(&part)?;
                }
                writer.finish()
            });
            let mut downloaded = Ok(());
            let chunks = buffers.iter().flat_map(|buffer| {
                (0..buffer.size())
                    .step_by(STREAMED_CHUNK as usize)
                    .map(move |at| (*buffer, at, STREAMED_CHUNK.min(buffer.size() - at)))
            });
            for (buffer, at, size) in chunks {
                let read = self.client.read_on(self.stream.id, buffer, at, size);
                let bytes = match self.after_wait(read) {
                    Ok(bytes) => bytes,
                    Err(error) => {
                        downloaded = Err(CheckpointError::Device(error));
                        break;
                    }
                };
                // A writer that stopped has its error in `written`.
                if parts.send(bytes).is_err() {
                    break;
                }
            }
            drop(parts);
            let written = written.join().unwrap_or_else(|_| {
                Err(CheckpointError::InvalidArgument(
                    "the writer panicked".into(),
                ))
            });
            downloaded.and(written)
        })
    }

    /// `run`'s device form of AMP (read from the device, once it ran) and
    /// its step count (the device's, where the device counts them).
    fn amp_and_steps(
        &self,
        run: &OptimizerRun,
    ) -> Result<(Option<DeviceAmpCheckpoint>, u64), BackendError> {
        let Some(rule) = run.device_amp else {
            return Ok((None, run.steps));
        };
        let state = self.device_amp_state()?.ok_or_else(|| {
            BackendError::InvalidArgument("the store's device AMP words are missing".into())
        })?;
        let amp = DeviceAmpCheckpoint {
            growth_factor: rule.growth_factor,
            backoff_factor: rule.backoff_factor,
            growth_interval: rule.growth_interval,
            state,
        };
        Ok((Some(amp), u64::from(state.steps)))
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
    let mut rest = checkpoint.params.as_slice();
    for (slot, shape) in checkpoint.shapes.iter().enumerate() {
        let len = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let Some((data, after)) = len.and_then(|len| rest.split_at_checked(len)) else {
            return Err(BackendError::InvalidArgument(format!(
                "checkpoint params: {} floats do not fill slot {slot} (shape {shape:?})",
                checkpoint.params.len()
            )));
        };
        tensors.push(Tensor::new(shape.clone(), data.to_vec())?);
        rest = after;
    }
    if !rest.is_empty() {
        return Err(BackendError::InvalidArgument(format!(
            "checkpoint params: {} floats for shapes of {}",
            checkpoint.params.len(),
            checkpoint.params.len() - rest.len()
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
    if let Some(amp) = &optimizer.device_amp {
        check_device_amp(amp, optimizer)?;
    }
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

/// The device AMP part's checks: an AMP family, a valid rule and scale,
/// and the optimizer's step count.
fn check_device_amp(
    amp: &DeviceAmpCheckpoint,
    optimizer: &OptimizerCheckpoint,
) -> Result<(), BackendError> {
    let refuse = |what: String| Err(BackendError::InvalidArgument(what));
    if !matches!(
        optimizer.config,
        OptimizerConfig::Sgd(_) | OptimizerConfig::Adam(_) | OptimizerConfig::AdamW(_)
    ) {
        return refuse(format!(
            "checkpoint device_amp: {} has no AMP step (sgd, adam or adamw)",
            optimizer.config.name()
        ));
    }
    let config = GradScalerConfig {
        init_scale: f64::from(amp.state.scale),
        growth_factor: amp.growth_factor,
        backoff_factor: amp.backoff_factor,
        growth_interval: amp.growth_interval,
    };
    if let Err(error) = config.validate() {
        return refuse(format!("checkpoint device_amp: {error}"));
    }
    if u64::from(amp.state.steps) != optimizer.steps {
        return refuse(format!(
            "checkpoint device_amp: {} steps on the device, the optimizer's count is {}",
            amp.state.steps, optimizer.steps
        ));
    }
    Ok(())
}
