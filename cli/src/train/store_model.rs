//! The model on the device: its parameters in one `DeviceParamStore`, and
//! the device chain over them that predicts.

use cistern_client::{ChainLayer, ComputeClient, DeviceParamStore, ResidentLeaf, Tape, Tensor};
use cistern_runtime::Activation;

use super::failure::Failure;
use super::model::Layout;

/// Rows per prediction chunk: fixed, so that a saved model predicts the
/// very same values as the store it was saved from.
const CHUNK_ROWS: usize = 512;

/// An MLP whose parameters live in a [`DeviceParamStore`], one slot per
/// tensor of [`Layout::tensors`], in order.
#[derive(Debug)]
pub struct StoreModel {
    /// Its shape.
    pub layout: Layout,
    client: ComputeClient,
    store: DeviceParamStore,
}

impl StoreModel {
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
        let tape = Tape::new(client);
        let store = DeviceParamStore::new(&tape, &refs)?;
        Ok(StoreModel {
            layout,
            client: client.clone(),
            store,
        })
    }

    /// The client of its device.
    pub fn client(&self) -> &ComputeClient {
        &self.client
    }

    /// The store, for a step.
    pub fn store(&self) -> &DeviceParamStore {
        &self.store
    }

    /// The store, for a step that updates it.
    pub fn store_mut(&mut self) -> &mut DeviceParamStore {
        &mut self.store
    }

    /// The activation after layer `index` (the output layer has none).
    pub fn activation(&self, index: usize) -> Activation {
        if index + 2 < self.layout.widths.len() {
            self.layout.activation.kernel()
        } else {
            Activation::Identity
        }
    }

    /// The layers as a device chain of `leaves` (weight, bias per layer).
    pub fn chain<'t>(&self, leaves: &[ResidentLeaf<'t>]) -> Vec<ChainLayer<'t>> {
        leaves
            .chunks(2)
            .enumerate()
            .map(|(index, pair)| {
                (
                    pair[0].clone(),
                    pair.get(1).cloned(),
                    self.activation(index),
                )
            })
            .collect()
    }

    /// The model's outputs for row-major `features`, through
    /// `predict_device_chain` in chunks of a fixed number of rows.
    pub fn predict(&self, features: &[f32]) -> Result<Vec<f32>, Failure> {
        let width = self.layout.widths[0];
        let tape = Tape::new(&self.client);
        let leaves = self.store.snapshot_resident_params(&tape)?;
        let chain = self.chain(&leaves);
        let mut outputs = Vec::with_capacity(features.len() / width.max(1));
        for chunk in features.chunks(CHUNK_ROWS * width) {
            let input = Tensor::new([chunk.len() / width, width], chunk.to_vec())
                .map_err(|e| Failure::Usage(format!("the features: {e}")))?;
            let output = self.store.predict_device_chain(&chain, &input)?;
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
