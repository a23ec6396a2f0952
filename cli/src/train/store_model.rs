//! The model on the device: its parameters in one `DeviceParamStore`, and
//! the device chain over them that predicts.

use cistern_client::{
    ChainLayer, ComputeClient, DeviceParamStore, ResidentLeaf, StoreCheckpoint, Tape, Tensor,
};
use cistern_parallel::ReplicaGroup;
use cistern_runtime::Activation;

use super::distributed::Placement;
use super::failure::Failure;
use super::model::Layout;

/// Rows per prediction chunk: fixed, so that a saved model predicts the
/// very same values as the store it was saved from.
const CHUNK_ROWS: usize = 512;

/// An MLP whose parameters live in a [`DeviceParamStore`], one slot per
/// tensor of [`Layout::tensors`], in order: one store, or one per replica
/// of a [`ReplicaGroup`].
#[derive(Debug)]
pub struct StoreModel {
    /// Its shape.
    pub layout: Layout,
    client: ComputeClient,
    holder: Holder,
}

/// The store, or the group holding a store per replica.
#[derive(Debug)]
enum Holder {
    One(Box<DeviceParamStore>),
    Group(ReplicaGroup),
}

impl StoreModel {
    /// Uploads `values` (one per tensor of the layout) into a new store on
    /// `client`'s device, in one upload.
    pub fn upload(
        client: &ComputeClient,
        layout: Layout,
        values: &[Vec<f32>],
    ) -> Result<Self, Failure> {
        let tensors = tensors(&layout, values)?;
        let refs: Vec<&Tensor<f32>> = tensors.iter().collect();
        let tape = Tape::new(client);
        let store = DeviceParamStore::new(&tape, &refs)?;
        Ok(StoreModel {
            layout,
            client: client.clone(),
            holder: Holder::One(Box::new(store)),
        })
    }

    /// A store on `client`'s device restored from `checkpoint` (its
    /// parameters and optimizer state), whose next step is the
    /// checkpointed store's.
    pub fn restore(
        client: &ComputeClient,
        layout: Layout,
        checkpoint: &StoreCheckpoint,
    ) -> Result<Self, Failure> {
        let store = DeviceParamStore::restore(&Tape::new(client), checkpoint)?;
        Ok(StoreModel {
            layout,
            client: client.clone(),
            holder: Holder::One(Box::new(store)),
        })
    }

    /// A replica group of `placement` holding rank 0's `values` on every
    /// replica.
    pub fn upload_group(
        placement: Placement,
        layout: Layout,
        values: &[Vec<f32>],
    ) -> Result<Self, Failure> {
        let tensors = tensors(&layout, values)?;
        let client = placement
            .clients
            .first()
            .cloned()
            .ok_or_else(|| Failure::Usage("a replica group needs a device".into()))?;
        let group = ReplicaGroup::new(placement.engine, placement.clients, &tensors)?;
        Ok(StoreModel {
            layout,
            client,
            holder: Holder::Group(group),
        })
    }

    /// A replica group of `placement`, every replica restored from
    /// `checkpoint` (every rank reads the same one).
    pub fn restore_group(
        placement: Placement,
        layout: Layout,
        checkpoint: &StoreCheckpoint,
    ) -> Result<Self, Failure> {
        let client = placement
            .clients
            .first()
            .cloned()
            .ok_or_else(|| Failure::Usage("a replica group needs a device".into()))?;
        let group = ReplicaGroup::restore(placement.engine, placement.clients, checkpoint)?;
        Ok(StoreModel {
            layout,
            client,
            holder: Holder::Group(group),
        })
    }

    /// The client of its (first) device.
    pub fn client(&self) -> &ComputeClient {
        &self.client
    }

    /// The store (of this process's first replica, in a group), for reads
    /// and predictions.
    pub fn store(&self) -> &DeviceParamStore {
        match &self.holder {
            Holder::One(store) => store,
            Holder::Group(group) => group.replicas()[0].store(),
        }
    }

    /// The store, for a step that updates it; a group's replicas step
    /// through the group only.
    pub fn store_mut(&mut self) -> Result<&mut DeviceParamStore, Failure> {
        match &mut self.holder {
            Holder::One(store) => Ok(store),
            Holder::Group(_) => Err(Failure::Usage(
                "a replica group's stores step through the group".into(),
            )),
        }
    }

    /// The replica group, when it trains as one.
    pub fn group_mut(&mut self) -> Option<&mut ReplicaGroup> {
        match &mut self.holder {
            Holder::One(_) => None,
            Holder::Group(group) => Some(group),
        }
    }

    /// This process's rank in its group (0 on one device): rank 0 alone
    /// prints, plots and saves.
    pub fn rank(&self) -> usize {
        match &self.holder {
            Holder::One(_) => 0,
            Holder::Group(group) => group.rank(),
        }
    }

    /// Whether a replica group trains it (of any size, one included).
    pub fn is_group(&self) -> bool {
        matches!(self.holder, Holder::Group(_))
    }

    /// Replicas its group recovered in place (0 on one device).
    pub fn recoveries(&self) -> u64 {
        match &self.holder {
            Holder::One(_) => 0,
            Holder::Group(group) => group.recoveries(),
        }
    }

    /// How many replicas train it (1 on one device).
    pub fn replicas(&self) -> usize {
        match &self.holder {
            Holder::One(_) => 1,
            Holder::Group(group) => group.count(),
        }
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
        let leaves = self.store().snapshot_resident_params(&tape)?;
        let chain = self.chain(&leaves);
        let mut outputs = Vec::with_capacity(features.len() / width.max(1));
        for chunk in features.chunks(CHUNK_ROWS * width) {
            let input = Tensor::new([chunk.len() / width, width], chunk.to_vec())
                .map_err(|e| Failure::Usage(format!("the features: {e}")))?;
            let output = self.store().predict_device_chain(&chain, &input)?;
            outputs.extend(output.into_data());
        }
        Ok(outputs)
    }

    /// Every parameter tensor, in layout order, in one download.
    pub fn parameters(&self) -> Result<Vec<Vec<f32>>, Failure> {
        Ok(self
            .store()
            .sync_to_host()?
            .into_iter()
            .map(Tensor::into_data)
            .collect())
    }
}

/// `values` as the layout's tensors.
fn tensors(layout: &Layout, values: &[Vec<f32>]) -> Result<Vec<Tensor<f32>>, Failure> {
    layout
        .tensors()
        .into_iter()
        .zip(values)
        .map(|((_, shape), data)| Tensor::new(shape, data.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Failure::Usage(format!("the model's parameters: {e}")))
}
