//! Device chains: a list of linear layers over the store's parameters, run
//! as one launch batch on the store's stream (inference here; the train
//! step in `chain_step.rs`). `ResidentInput`: an input uploaded for them.

use cistern_runtime::{Activation, AllocationPolicy, Binding, KernelLaunch};

use super::chain_plan::{LayerPlan, fused};
use super::device_check::retry_transient;
use super::forward::ResidentLeaf;
use super::store::DeviceParamStore;
use crate::compute::{Buffer, ComputeClient, bytes_f32, f32_bytes};
use crate::error::BackendError;
use crate::shape::ShapeError;
use crate::tape::{Tensor, WeightLayout};

/// One layer of a chain: `act(x·W + b)` with the weight leaf (`[in, out]`,
/// as [`DeviceParamStore::linear_forward`]'s), an optional
/// bias leaf (both from [`DeviceParamStore::snapshot_resident_params`] or
/// `register_resident_params`) and the activation.
pub type ChainLayer<'t> = (ResidentLeaf<'t>, Option<ResidentLeaf<'t>>, Activation);

/// A `rows×cols` input uploaded by [`DeviceParamStore::upload_resident_input`]:
/// bound to that store and its device.
#[derive(Clone, Debug)]
pub struct ResidentInput {
    pub(super) id: u64,
    pub(super) store: u64,
    pub(super) client: ComputeClient,
    pub(super) buffer: Buffer,
    pub(super) shape: Vec<usize>,
}

impl ResidentInput {
    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
}

impl DeviceParamStore {
    /// `input` through `chain` on the device: one upload, the layers
    /// device-resident with no synchronisation between them, one download.
    /// The store's queued work is re-checked after the download.
    ///
    /// A pending forward is `PendingForwardUnconsumed`; a leaf of another
    /// store, an empty chain or an input of rank ≠ 2 `InvalidArgument`;
    /// shapes that do not chain `ShapeMismatch`; `Unsupported` from the
    /// device passes through (no host fallback). While another client
    /// captures, it waits as the train step does (retried for up to 2 s,
    /// then `DeviceContextCaptureInProgress`).
    pub fn predict_device_chain(
        &self,
        chain: &[ChainLayer<'_>],
        input: &Tensor<f32>,
    ) -> Result<Tensor<f32>, BackendError> {
        retry_transient(|| {
            self.enter()?;
            let plan = self.check_chain(chain, input.shape())?;
            let uploaded = self.upload_resident_input(input)?;
            self.run_chain(&plan, &uploaded, false)
        })
    }

    /// [`predict_device_chain`](Self::predict_device_chain) with the
    /// logits turned into probabilities on the device: a row-wise softmax
    /// in the same batch (each row sums to 1).
    pub fn predict_device_chain_probabilities(
        &self,
        chain: &[ChainLayer<'_>],
        input: &Tensor<f32>,
    ) -> Result<Tensor<f32>, BackendError> {
        retry_transient(|| {
            self.enter()?;
            let plan = self.check_chain(chain, input.shape())?;
            let uploaded = self.upload_resident_input(input)?;
            self.run_chain(&plan, &uploaded, true)
        })
    }

    /// The class of each row: the index of its largest logit (the first
    /// of equals, as `torch.argmax`), from
    /// [`predict_device_chain`](Self::predict_device_chain).
    pub fn predict_device_chain_classes(
        &self,
        chain: &[ChainLayer<'_>],
        input: &Tensor<f32>,
    ) -> Result<Vec<usize>, BackendError> {
        let logits = self.predict_device_chain(chain, input)?;
        Ok(argmax_rows(&logits))
    }

    /// [`predict_device_chain`](Self::predict_device_chain) over an input
    /// already on the device: no upload. An input of another store is
    /// `InvalidArgument`, of another device `DeviceMismatch`. Waits out
    /// another client's capture the same way.
    pub fn predict_device_chain_resident(
        &self,
        chain: &[ChainLayer<'_>],
        input: &ResidentInput,
    ) -> Result<Tensor<f32>, BackendError> {
        retry_transient(|| {
            self.enter()?;
            self.check_input(input)?;
            let plan = self.check_chain(chain, &input.shape)?;
            self.run_chain(&plan, input, false)
        })
    }

    /// Uploads `input` (rank 2, else `InvalidArgument`) on the store's
    /// stream, for the chain calls of this store.
    pub fn upload_resident_input(
        &self,
        input: &Tensor<f32>,
    ) -> Result<ResidentInput, BackendError> {
        self.enter()?;
        if input.shape().len() != 2 || input.is_empty() {
            return Err(BackendError::InvalidArgument(format!(
                "a chain input is a non-empty matrix; got shape {:?}",
                input.shape()
            )));
        }
        let buffer = self.reserve_floats(input.len())?;
        let bytes = f32_bytes(input.data());
        self.client
            .write_on(self.stream.id, &buffer, 0, &bytes)
            .map_err(|error| self.state.fail(BackendError::from(error)))?;
        Ok(ResidentInput {
            id: super::dataset::next_resident_id(),
            store: self.id,
            client: self.client.clone(),
            buffer,
            shape: input.shape().to_vec(),
        })
    }

    /// Reads an uploaded input back (one download).
    pub fn download_resident_input(
        &self,
        input: &ResidentInput,
    ) -> Result<Tensor<f32>, BackendError> {
        self.enter()?;
        self.check_input(input)?;
        let read = self
            .client
            .read_on(self.stream.id, &input.buffer, 0, input.buffer.size());
        let bytes = self.after_wait(read)?;
        Ok(Tensor::new(input.shape.clone(), bytes_f32(&bytes))?)
    }

    /// `DeviceMismatch` for an input of another device, `InvalidArgument`
    /// for one of another store.
    pub(super) fn check_input(&self, input: &ResidentInput) -> Result<(), BackendError> {
        if !input.client.same_server(&self.client) {
            return Err(BackendError::DeviceMismatch);
        }
        if input.store != self.id {
            return Err(BackendError::InvalidArgument(
                "the input was uploaded for another parameter store".into(),
            ));
        }
        Ok(())
    }

    /// The chain's checks against an input of `shape`: no pending forward,
    /// leaves of this store, matrices that chain.
    pub(super) fn check_chain(
        &self,
        chain: &[ChainLayer<'_>],
        shape: &[usize],
    ) -> Result<Vec<LayerPlan>, BackendError> {
        self.state.check_no_pending_forward()?;
        if chain.is_empty() {
            return Err(BackendError::InvalidArgument(
                "a chain needs a layer".into(),
            ));
        }
        if shape.len() != 2 || shape.contains(&0) {
            return Err(BackendError::InvalidArgument(format!(
                "a chain input is a non-empty matrix; got shape {shape:?}"
            )));
        }
        let mut width = shape[1];
        let mut plan = Vec::with_capacity(chain.len());
        for (weight, bias, activation) in chain {
            for leaf in std::iter::once(weight).chain(bias) {
                if leaf.store != self.id {
                    return Err(BackendError::InvalidArgument(format!(
                        "slot {} is a leaf of another parameter store",
                        leaf.slot
                    )));
                }
            }
            let (k, n) = match WeightLayout::InOut.in_out(&weight.shape) {
                Some(in_out) => in_out,
                None => {
                    return Err(BackendError::InvalidArgument(format!(
                        "slot {} is not a matrix (shape {:?})",
                        weight.slot, weight.shape
                    )));
                }
            };
            ShapeError::check_dims(&[k], &[width])?;
            if let Some(bias) = bias {
                ShapeError::check_dims(&[n], &bias.shape)?;
            }
            plan.push(LayerPlan {
                weight: weight.slot,
                bias: bias.as_ref().map(|bias| bias.slot),
                n,
                k,
                activation: *activation,
            });
            width = n;
        }
        Ok(plan)
    }

    /// Runs the forward as one batch and downloads the last output.
    fn run_chain(
        &self,
        plan: &[LayerPlan],
        input: &ResidentInput,
        softmax: bool,
    ) -> Result<Tensor<f32>, BackendError> {
        let rows = input.shape[0];
        let mut launches = Vec::new();
        let mut keep = Vec::new();
        let mut x = input.buffer.clone();
        for layer in plan {
            let out = self.reserve_floats(rows * layer.n)?;
            let pre = match fused(layer.activation) {
                true => None,
                false => Some(self.reserve_floats(rows * layer.n)?),
            };
            launches.extend(self.layer_forward(layer, rows, x.whole(), &out, pre.as_ref()));
            keep.extend(pre);
            x = out.clone();
            keep.push(out);
        }
        let width = plan.last().map_or(0, |layer| layer.n);
        if softmax {
            let probabilities = self.reserve_floats(rows * width)?;
            let (r, c) = (rows as u64, width as u64);
            launches.push(KernelLaunch::softmax(
                x.whole(),
                r,
                c,
                false,
                probabilities.whole(),
            ));
            x = probabilities.clone();
            keep.push(probabilities);
        }
        let token = self
            .client
            .launch_batch(self.stream.id, launches)
            .map_err(|error| self.state.fail(BackendError::from(error)))?;
        let read = self.client.read_on(self.stream.id, &x, 0, x.size());
        let bytes = self.after_wait(read)?;
        token
            .wait()
            .map_err(|error| self.state.fail(BackendError::from(error)))?;
        Ok(Tensor::new(vec![rows, width], bytes_f32(&bytes))?)
    }

    /// One layer's forward launches: the GEMM (with the activation fused
    /// when its derivative comes from the output), else the GEMM into `pre`
    /// and the activation into `out`.
    pub(super) fn layer_forward(
        &self,
        layer: &LayerPlan,
        rows: usize,
        x: Binding,
        out: &Buffer,
        pre: Option<&Buffer>,
    ) -> Vec<KernelLaunch> {
        let epilogue = match pre {
            None => layer.activation,
            Some(_) => Activation::Identity,
        };
        let spec = WeightLayout::InOut.forward(rows, layer.n, layer.k, epilogue);
        let weight = self.slot_binding(&self.params, layer.weight);
        let bias = layer.bias.map(|slot| self.slot_binding(&self.params, slot));
        match pre {
            None => vec![KernelLaunch::gemm(spec, x, weight, bias, out.whole())],
            Some(pre) => vec![
                KernelLaunch::gemm(spec, x, weight, bias, pre.whole()),
                KernelLaunch::activation_forward(layer.activation, pre.whole(), out.whole()),
            ],
        }
    }

    /// `slot`'s range of `buffer` (the parameters or the staging buffer).
    pub(super) fn slot_binding(&self, buffer: &Buffer, slot: usize) -> Binding {
        let (offset, size) = self.layout.slot(slot).map_or((0, 0), |slot| slot.bytes());
        buffer.range(offset, size)
    }

    /// A buffer of `count` `f32`s on the store's stream.
    pub(super) fn reserve_floats(&self, count: usize) -> Result<Buffer, BackendError> {
        self.client
            .reserve_with(count as u64 * 4, AllocationPolicy::Allow, self.stream.id)
            .map_err(|error| self.state.fail(BackendError::from(error)))
    }
}

/// The index of each row's largest value (the first of equals; NaN never
/// wins), for a `rows×cols` tensor.
pub fn argmax_rows(values: &Tensor<f32>) -> Vec<usize> {
    let cols = values.shape().last().copied().unwrap_or(0).max(1);
    values
        .data()
        .chunks(cols)
        .map(|row| {
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] || row[best].is_nan() && !v.is_nan() {
                    best = i;
                }
            }
            best
        })
        .collect()
}
