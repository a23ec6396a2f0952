//! A classifier on the device: an MLP whose last layer gives one logit per
//! class, its parameters in one `DeviceParamStore`, trained with
//! cross-entropy through the store's device chain (SGD) or the tape.

use cistern_client::{
    BackendError, ChainLayer, ChainLoss, ComputeClient, CrossEntropyOptions, DatasetLoss,
    DatasetTargets, DeviceParamStore, ResidentDataset, ResidentLeaf, StoreCheckpoint, Tape, Tensor,
    TrainStepLoss,
};
use cistern_optim::{OptimizerConfig, SgdConfig};
use cistern_runtime::Activation;

use super::super::failure::Failure;
use super::super::model::Layout;

/// Rows per prediction chunk: fixed, so that a saved model predicts the
/// very same values as the store it was saved from.
const CHUNK_ROWS: usize = 512;

/// An MLP classifier: `layout.widths` ends with the class count.
#[derive(Debug)]
pub struct Classifier {
    /// Its shape.
    pub layout: Layout,
    client: ComputeClient,
    store: DeviceParamStore,
}

impl Classifier {
    /// Uploads `values` (one per tensor of the layout) into a new store on
    /// `client`'s device, in one upload.
    pub fn upload(
        client: &ComputeClient,
        layout: Layout,
        values: &[Vec<f32>],
    ) -> Result<Self, Failure> {
        let tensors = layout
            .tensors()
            .into_iter()
            .zip(values)
            .map(|((_, shape), data)| Tensor::new(shape, data.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Failure::Usage(format!("the model's parameters: {e}")))?;
        let refs: Vec<&Tensor<f32>> = tensors.iter().collect();
        let store = DeviceParamStore::new(&Tape::new(client), &refs)?;
        Ok(Classifier {
            layout,
            client: client.clone(),
            store,
        })
    }

    /// A store on `client`'s device restored from `checkpoint`, whose next
    /// step is the checkpointed store's.
    pub fn restore(
        client: &ComputeClient,
        layout: Layout,
        checkpoint: &StoreCheckpoint,
    ) -> Result<Self, Failure> {
        let store = DeviceParamStore::restore(&Tape::new(client), checkpoint)?;
        Ok(Classifier {
            layout,
            client: client.clone(),
            store,
        })
    }

    /// The store, for checkpoints.
    pub fn store(&self) -> &DeviceParamStore {
        &self.store
    }

    /// Classes: the width of the last layer.
    pub fn classes(&self) -> usize {
        self.layout.widths.last().copied().unwrap_or(0)
    }

    fn activation(&self, index: usize) -> Activation {
        if index + 2 < self.layout.widths.len() {
            self.layout.activation.kernel()
        } else {
            Activation::Identity
        }
    }

    fn chain<'t>(&self, leaves: &[ResidentLeaf<'t>]) -> Vec<ChainLayer<'t>> {
        (leaves.chunks(2).enumerate())
            .map(|(index, pair)| {
                (
                    pair[0].clone(),
                    pair.get(1).cloned(),
                    self.activation(index),
                )
            })
            .collect()
    }

    /// One SGD step through the store's device chain (forward,
    /// cross-entropy, backward, update as one replayed graph); the batch's
    /// loss before the update.
    pub fn chain_step(
        &mut self,
        features: &Tensor<f32>,
        labels: &[i64],
        options: &CrossEntropyOptions,
        config: &SgdConfig,
    ) -> Result<f32, Failure> {
        let loss = ChainLoss::CrossEntropy {
            targets: labels,
            options,
        };
        self.step_chain(|store, chain| {
            store.train_step_device_chain_with_loss(chain, features, loss, config)
        })
    }

    /// `features` (`rows×width`) and `labels` uploaded once as a resident
    /// dataset for [`dataset_step`](Self::dataset_step), drawn in batches
    /// of `batch` under `seed`.
    pub fn upload_dataset(
        &self,
        features: &Tensor<f32>,
        labels: &[i64],
        batch: usize,
        seed: u64,
    ) -> Result<ResidentDataset, Failure> {
        let targets = DatasetTargets::Classes(labels);
        Ok(self
            .store
            .upload_resident_dataset(features, targets, batch, seed)?)
    }

    /// [`chain_step`](Self::chain_step) on the dataset's next batch, drawn
    /// on the device: the step moves no bytes but its loss read.
    pub fn dataset_step(
        &mut self,
        dataset: &ResidentDataset,
        options: &CrossEntropyOptions,
        config: &SgdConfig,
    ) -> Result<f32, Failure> {
        let loss = DatasetLoss::CrossEntropy(options);
        self.step_chain(|store, chain| {
            store.train_step_device_chain_dataset(chain, dataset, loss, config)
        })
    }

    /// One chain step `send` makes over the current parameters, and its
    /// loss read (the step's one synchronisation).
    fn step_chain(
        &mut self,
        send: impl FnOnce(
            &mut DeviceParamStore,
            &[ChainLayer<'_>],
        ) -> Result<TrainStepLoss, BackendError>,
    ) -> Result<f32, Failure> {
        let tape = Tape::new(&self.client);
        let leaves = self.store.snapshot_resident_params(&tape)?;
        let chain = self.chain(&leaves);
        let sent = send(&mut self.store, &chain)?;
        Ok(self.store.read_train_step_loss(&sent)?)
    }

    /// One step through the tape (`cross_entropy`) and the store's fused
    /// step of `config`'s family; the batch's loss before the update.
    pub fn tape_step(
        &mut self,
        features: &Tensor<f32>,
        labels: &[i64],
        options: &CrossEntropyOptions,
        config: &OptimizerConfig,
    ) -> Result<f32, Failure> {
        let tape = Tape::new(&self.client);
        let activations: Vec<Activation> = (0..self.layout.widths.len() - 1)
            .map(|index| self.activation(index))
            .collect();
        let store = &mut self.store;
        let leaves = store.register_resident_params(&tape)?;
        let mut h = tape.upload(features)?;
        for (pair, activation) in leaves.chunks(2).zip(activations) {
            h = store.linear_forward_with_activation(
                &tape,
                &h,
                &pair[0],
                pair.get(1),
                activation,
            )?;
        }
        let targets = tape.class_targets(labels)?;
        let loss = tape.cross_entropy(&h, &targets, options)?;
        let gradients = store.backward(&tape, &loss)?;
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

    /// The logits (`rows × classes`, row-major) of row-major `features`.
    pub fn logits(&self, features: &[f32]) -> Result<Vec<f32>, Failure> {
        self.predict(features, false)
    }

    /// The class probabilities (a softmax on the device) of `features`.
    pub fn probabilities(&self, features: &[f32]) -> Result<Vec<f32>, Failure> {
        self.predict(features, true)
    }

    fn predict(&self, features: &[f32], probabilities: bool) -> Result<Vec<f32>, Failure> {
        let width = self.layout.widths[0];
        let tape = Tape::new(&self.client);
        let leaves = self.store.snapshot_resident_params(&tape)?;
        let chain = self.chain(&leaves);
        let mut outputs = Vec::with_capacity(features.len() / width.max(1) * self.classes());
        for chunk in features.chunks(CHUNK_ROWS * width) {
            let input = Tensor::new([chunk.len() / width, width], chunk.to_vec())
                .map_err(|e| Failure::Usage(format!("the features: {e}")))?;
            let output = match probabilities {
                true => self
                    .store
                    .predict_device_chain_probabilities(&chain, &input)?,
                false => self.store.predict_device_chain(&chain, &input)?,
            };
            outputs.extend(output.into_data());
        }
        Ok(outputs)
    }

    /// Every parameter tensor, in layout order, in one download.
    pub fn parameters(&self) -> Result<Vec<Vec<f32>>, Failure> {
        Ok(self
            .store
            .sync_to_host()?
            .into_iter()
            .map(Tensor::into_data)
            .collect())
    }
}
