//! Train steps whose batch is already on the device: over two resident
//! inputs (`x`, `y`), or drawn from a `ResidentDataset`, uploaded once,
//! whose batches a kernel gathers on the device from a seeded permutation
//! per epoch and a step counter in device memory. A recorded step over a
//! dataset moves no bytes between host and device but its loss read.

use std::sync::atomic::{AtomicU64, Ordering};

use cistern_optim::SgdConfig;
use cistern_runtime::{GatherSpec, KernelLaunch};

use super::chain::{ChainLayer, ResidentInput};
use super::chain_plan::LossPlan;
use super::chain_step::{Feed, TrainStepLoss, class_loss_plan};
use super::store::DeviceParamStore;
use crate::compute::{Buffer, ComputeClient, bytes_f32, f32_bytes};
use crate::error::BackendError;
use crate::shape::ShapeError;
use crate::tape::{CrossEntropyOptions, Tensor};

/// A fresh id for a resident input or dataset (what a recorded step is bound to).
pub(super) fn next_resident_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A resident dataset's targets, as uploaded.
#[derive(Clone, Copy, Debug)]
pub enum DatasetTargets<'a> {
    /// `rows×outputs` values, for MSE.
    Values(&'a Tensor<f32>),
    /// One class index per row (`0 ≤ index < 2^31`), for cross-entropy.
    Classes(&'a [i64]),
}

/// The loss of a train step over a resident dataset.
#[derive(Clone, Copy, Debug)]
pub enum DatasetLoss<'a> {
    /// Mean squared error against the dataset's values.
    Mse,
    /// Cross-entropy of the logits against the dataset's classes, with
    /// PyTorch's options (reduction mean or sum).
    CrossEntropy(&'a CrossEntropyOptions),
}

/// A dataset uploaded once by [`DeviceParamStore::upload_resident_dataset`]
/// for that store's chain steps. Each step draws the next `batch` rows of
/// a seeded permutation of the rows, a new one each epoch (`rows / batch`
/// full batches; the rest of an epoch's rows is not drawn), from a step
/// counter held on the device.
#[derive(Debug)]
pub struct ResidentDataset {
    pub(super) id: u64,
    store: u64,
    client: ComputeClient,
    features: Buffer,
    targets: Buffer,
    counter: Buffer,
    spec: GatherSpec,
    /// One past the largest class, for class targets.
    classes: Option<usize>,
}

impl ResidentDataset {
    /// Rows of the dataset.
    pub fn rows(&self) -> usize {
        self.spec.rows as usize
    }

    /// Features per row.
    pub fn width(&self) -> usize {
        self.spec.width as usize
    }

    /// Rows per batch.
    pub fn batch(&self) -> usize {
        self.spec.batch as usize
    }

    /// Full batches per epoch.
    pub fn per_epoch(&self) -> usize {
        self.spec.per_epoch() as usize
    }

    /// The dataset row at position `i` of the batch drawn at step `step`:
    /// the draw the device makes, computed on the host.
    pub fn row(&self, step: u32, i: usize) -> Option<usize> {
        let i = u32::try_from(i).ok().filter(|&i| i < self.spec.batch)?;
        Some(self.spec.row(step, i) as usize)
    }

    /// The launch that gathers the current step's batch into `x` and `y`
    /// and advances the counter.
    pub(super) fn gather(&self, x: &Buffer, y: &Buffer) -> KernelLaunch {
        KernelLaunch::batch_gather(
            self.spec,
            self.features.whole(),
            self.targets.whole(),
            self.counter.whole(),
            x.whole(),
            y.whole(),
        )
    }
}

impl DeviceParamStore {
    /// Uploads a dataset (`features` `rows×width`; `targets` one row of
    /// values or one class per row) on the store's stream, once, for
    /// [`train_step_device_chain_dataset`]. Batches of `batch` rows are
    /// drawn under `seed`; the counter starts at step 0.
    ///
    /// An empty dataset, a batch of 0 or past the rows, targets whose rows
    /// differ from the features', a negative class or sizes past 2^32
    /// words are `InvalidArgument`, before anything is uploaded.
    ///
    /// [`train_step_device_chain_dataset`]: Self::train_step_device_chain_dataset
    pub fn upload_resident_dataset(
        &self,
        features: &Tensor<f32>,
        targets: DatasetTargets<'_>,
        batch: usize,
        seed: u64,
    ) -> Result<ResidentDataset, BackendError> {
        self.enter()?;
        let invalid = BackendError::InvalidArgument;
        let (rows, width) = match features.shape() {
            &[rows, width] if rows > 0 && width > 0 => (rows, width),
            shape => {
                return Err(invalid(format!(
                    "a dataset's features are a non-empty matrix; got shape {shape:?}"
                )));
            }
        };
        let (words, target_width, classes) = match targets {
            DatasetTargets::Values(values) => {
                let outputs = values.shape().get(1).copied().unwrap_or(0);
                ShapeError::check_dims(&[rows, outputs.max(1)], values.shape())?;
                (f32_bytes(values.data()), outputs, None)
            }
            DatasetTargets::Classes(classes) => {
                ShapeError::check_dims(&[rows], &[classes.len()])?;
                let mut bytes = Vec::with_capacity(4 * rows);
                for (row, &class) in classes.iter().enumerate() {
                    let index = i32::try_from(class)
                        .ok()
                        .filter(|&c| c >= 0)
                        .ok_or_else(|| {
                            invalid(format!("row {row}: class {class} is not in 0..2^31"))
                        })?;
                    bytes.extend_from_slice(&index.to_ne_bytes());
                }
                let bound = classes.iter().max().map_or(0, |&c| c as usize + 1);
                (bytes, 1, Some(bound))
            }
        };
        let narrow = |value: usize, what: &str| {
            u32::try_from(value).map_err(|_| invalid(format!("{what} {value} is past 2^32")))
        };
        let spec = GatherSpec {
            rows: narrow(rows, "rows")?,
            width: narrow(width, "width")?,
            target_width: narrow(target_width, "target width")?,
            batch: narrow(batch, "batch")?,
            seed,
        };
        spec.validate()
            .map_err(|error| invalid(format!("resident dataset: {error}")))?;
        let stream = self.stream.id;
        let features_buffer = self.reserve_floats(rows * width)?;
        let targets_buffer = self.reserve_floats(rows * target_width)?;
        let counter = self.reserve_floats(1)?;
        let sent = self
            .client
            .write_on(stream, &features_buffer, 0, &f32_bytes(features.data()))
            .and_then(|()| self.client.write_on(stream, &targets_buffer, 0, &words))
            .and_then(|()| {
                self.client
                    .write_on(stream, &counter, 0, &0u32.to_ne_bytes())
            });
        sent.map_err(|error| self.state.fail(BackendError::from(error)))?;
        Ok(ResidentDataset {
            id: next_resident_id(),
            store: self.id,
            client: self.client.clone(),
            features: features_buffer,
            targets: targets_buffer,
            counter,
            spec,
            classes,
        })
    }

    /// Sets the dataset's step counter (a resumed run's position): one
    /// 4-byte write. A step past 2^32 is `InvalidArgument`.
    pub fn seek_resident_dataset(
        &self,
        dataset: &ResidentDataset,
        step: u64,
    ) -> Result<(), BackendError> {
        self.enter()?;
        self.check_dataset_owner(dataset)?;
        let step = u32::try_from(step).map_err(|_| {
            BackendError::InvalidArgument(format!("step {step} is past a dataset's 2^32 steps"))
        })?;
        self.client
            .write_on(self.stream.id, &dataset.counter, 0, &step.to_ne_bytes())
            .map_err(|error| self.state.fail(BackendError::from(error)))
    }

    /// The dataset's step counter: how many batches were drawn (one read).
    pub fn resident_dataset_position(
        &self,
        dataset: &ResidentDataset,
    ) -> Result<u64, BackendError> {
        self.enter()?;
        self.check_dataset_owner(dataset)?;
        let read = self.client.read_on(self.stream.id, &dataset.counter, 0, 4);
        let bytes = self.after_wait(read)?;
        Ok(bytes_f32(&bytes)
            .first()
            .map_or(0, |word| u64::from(word.to_bits())))
    }

    /// One SGD train step of `chain` on the dataset's next batch, drawn on
    /// the device: as [`train_step_device_chain_with_loss`], with the
    /// gather the step's first launch, so a replayed step moves no bytes.
    /// A dataset of another store is `InvalidArgument`, of another device
    /// `DeviceMismatch`; an MSE over class targets, a cross-entropy over
    /// values, or a class past the last layer's width `InvalidArgument`.
    ///
    /// [`train_step_device_chain_with_loss`]: Self::train_step_device_chain_with_loss
    pub fn train_step_device_chain_dataset(
        &mut self,
        chain: &[ChainLayer<'_>],
        dataset: &ResidentDataset,
        loss: DatasetLoss<'_>,
        config: &SgdConfig,
    ) -> Result<TrainStepLoss, BackendError> {
        let feed = Feed::Dataset {
            data: dataset,
            loss,
        };
        self.chain_step_with_retry(chain, feed, config)
    }

    /// One SGD train step of `chain` (MSE) on inputs already on the
    /// device, as the original API's step over `ResidentInput`s: `x`
    /// copied into the step's workspace on the device, no upload. Inputs
    /// of another store are `InvalidArgument`, of another device
    /// `DeviceMismatch`; a `y` not of the last layer's shape `ShapeMismatch`.
    pub fn train_step_device_chain_resident(
        &mut self,
        chain: &[ChainLayer<'_>],
        x: &ResidentInput,
        y: &ResidentInput,
        config: &SgdConfig,
    ) -> Result<TrainStepLoss, BackendError> {
        self.chain_step_with_retry(chain, Feed::Resident { x, y }, config)
    }

    /// The dataset's checks for a step whose last layer is `width` wide.
    pub(super) fn check_dataset(
        &self,
        dataset: &ResidentDataset,
        loss: DatasetLoss<'_>,
        width: usize,
    ) -> Result<LossPlan, BackendError> {
        self.check_dataset_owner(dataset)?;
        let invalid = BackendError::InvalidArgument;
        match (loss, dataset.classes) {
            (DatasetLoss::Mse, None) => {
                ShapeError::check_dims(&[width], &[dataset.spec.target_width as usize])?;
                Ok(LossPlan::Mse)
            }
            (DatasetLoss::CrossEntropy(options), Some(bound)) => {
                if bound > width {
                    return Err(invalid(format!(
                        "the dataset holds class {}; the last layer has {width} outputs",
                        bound - 1
                    )));
                }
                class_loss_plan(options, dataset.batch(), width)
            }
            (DatasetLoss::Mse, Some(_)) => Err(invalid(
                "an MSE step over a dataset of classes: upload values, or step cross-entropy"
                    .into(),
            )),
            (DatasetLoss::CrossEntropy(_), None) => Err(invalid(
                "a cross-entropy step over a dataset of values: upload classes, or step MSE".into(),
            )),
        }
    }

    /// `DeviceMismatch` for a dataset of another device, `InvalidArgument`
    /// for one of another store.
    fn check_dataset_owner(&self, dataset: &ResidentDataset) -> Result<(), BackendError> {
        if !dataset.client.same_server(&self.client) {
            return Err(BackendError::DeviceMismatch);
        }
        if dataset.store != self.id {
            return Err(BackendError::InvalidArgument(
                "the dataset was uploaded for another parameter store".into(),
            ));
        }
        Ok(())
    }
}
