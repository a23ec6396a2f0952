//! Each kernel of the catalogue as wgpu dispatches, one arm per kernel.
//!
//! A launch becomes a [`Plan`]; a kernel this device cannot run at this
//! size (a binding past the largest storage binding where the kernel is not
//! element-wise, a grid too large) is refused as `UnsupportedOperation`
//! before anything runs, and the device stays healthy.

use cistern_kernels::{
    Activation, AttentionSpec, BroadcastSpec, ClassInput, ClassLossSpec, EmbeddingSpec, GatherSpec,
    LayerNormSpec, MapOp, MaxDimSpec, Reduction, SumSpec,
};
use cistern_optim::{LambConfig, OptimizerConfig};

use super::context::GpuContext;
use super::dispatch::{Dispatch, PER_INVOCATION, Params, unsupported};
use super::pipelines::{Entry, Module};
use super::slice::GpuSlice;
use crate::backend::stream::{BoundLaunch, KernelFault, LaunchError};
use crate::error::ServerError;
use crate::kernel::Kernel;
use crate::optimizer::OptimizerArgs;

/// What a launch does on the device.
#[derive(Debug)]
pub(super) enum Plan<'a> {
    /// Nothing to run (an empty range).
    Nothing,
    /// Dispatches in order, in one submission.
    Dispatches(Vec<Dispatch>),
    /// Dispatches in order, each in a submission of its own (long work cut
    /// so that no submission runs long).
    Submissions(Vec<Dispatch>),
    /// A copy of bytes: source, target.
    Copy(GpuSlice, GpuSlice),
    /// A LAMB step: passes with host decisions between them (`lamb.rs`).
    Lamb(&'a LambConfig, &'a OptimizerArgs),
    /// A counted LAMB step: the flag and count read back, then a LAMB step.
    CountedLamb(&'a LambConfig, &'a OptimizerArgs),
}

const fn entry(module: Module, name: &'static str, buffers: u32) -> Entry {
    Entry {
        module,
        name,
        buffers,
        table: false,
        per_invocation: 1,
    }
}

/// A streaming entry point: `PER_INVOCATION` elements an invocation.
const fn streaming(name: &'static str, buffers: u32) -> Entry {
    Entry {
        per_invocation: PER_INVOCATION,
        ..entry(Module::Elementwise, name, buffers)
    }
}

const AMP_UNSCALE: Entry = streaming("amp_unscale", 2);
const FORWARD: Entry = entry(Module::Elementwise, "forward", 2);
const BACKWARD: Entry = entry(Module::Elementwise, "backward", 3);
const COLUMN_SUM: Entry = entry(Module::Reduce, "column_sum", 2);
const MSE_LOSS: Entry = entry(Module::Reduce, "mse_loss", 3);
const SOFTMAX: Entry = entry(Module::Reduce, "softmax_rows", 2);
const SOFTMAX_BACKWARD: Entry = entry(Module::Reduce, "softmax_rows_backward", 3);
const CLASS_LOSS_ROWS: Entry = entry(Module::Reduce, "class_loss_rows", 4);
const CLASS_LOSS_TOTAL: Entry = entry(Module::Reduce, "class_loss_total", 4);
const CLASS_LOSS_BACKWARD: Entry = entry(Module::Reduce, "class_loss_backward", 5);
const LAYER_NORM: Entry = entry(Module::Reduce, "layer_norm", 5);
const LAYER_NORM_BACKWARD: Entry = entry(Module::Reduce, "layer_norm_backward", 6);
const EMBEDDING: Entry = entry(Module::Reduce, "embedding", 3);
const DROPOUT: Entry = entry(Module::Reduce, "dropout", 2);
const DROPOUT_COUNTED: Entry = entry(Module::Reduce, "dropout_counted", 3);
const EMBEDDING_BACKWARD: Entry = entry(Module::Reduce, "embedding_backward", 3);
const BATCH_GATHER: Entry = entry(Module::Reduce, "batch_gather", 5);
const BATCH_GATHER_ADVANCE: Entry = entry(Module::Reduce, "batch_gather_advance", 1);
const MAX_DIM: Entry = entry(Module::Reduce, "max_dim", 3);
const MAX_DIM_BACKWARD: Entry = entry(Module::Reduce, "max_dim_backward", 3);
const ATTENTION: Entry = entry(Module::Reduce, "attention", 5);
const ATTENTION_BACKWARD_QUERIES: Entry = entry(Module::Reduce, "attention_backward_queries", 6);
const ATTENTION_BACKWARD_KEYS: Entry = entry(Module::Reduce, "attention_backward_keys", 6);
const BROADCAST_BINARY: Entry = Entry {
    table: true,
    ..entry(Module::Strided, "broadcast_binary", 3)
};
const STRIDED_SUM: Entry = Entry {
    table: true,
    ..entry(Module::Strided, "strided_sum", 2)
};
const SEGMENT_SUM: Entry = Entry {
    table: true,
    ..entry(Module::Reduce, "segment_sum", 2)
};

/// The entry point of an element-wise kernel, made from its definition
/// (`cistern_kernels::map`); its vec4 twin is in `Module::MapVec4`.
fn map_entry(op: MapOp) -> Entry {
    let definition = op.definition();
    Entry {
        module: Module::Map,
        buffers: definition.bindings() as u32,
        ..streaming(definition.wgsl_entry, 0)
    }
}

/// An activation's op code and its slope (leaky relu's; 0 otherwise).
pub(super) fn activation_code(activation: Activation) -> (u32, f32) {
    match activation {
        Activation::Identity => (0, 0.0),
        Activation::Relu => (1, 0.0),
        Activation::LeakyRelu { negative_slope } => (2, negative_slope),
        Activation::Gelu => (3, 0.0),
        Activation::GeluTanh => (4, 0.0),
        Activation::Tanh => (5, 0.0),
        Activation::Sigmoid => (6, 0.0),
    }
}

/// Elements of `f32`s in `slice`.
fn elements(slice: &GpuSlice) -> u64 {
    slice.size / 4
}

impl GpuContext {
    /// The plan of `launch`; `Kernel::Empty` and `Kernel::Trap` are the
    /// caller's (they never reach the device).
    pub(super) fn plan<'a>(
        &self,
        launch: &'a BoundLaunch<GpuSlice>,
    ) -> Result<Plan<'a>, LaunchError> {
        let b = |index: usize| {
            launch.bindings.get(index).ok_or_else(|| {
                LaunchError::Fault(KernelFault::Malformed(format!(
                    "{} has no binding {index}",
                    launch.kernel.name()
                )))
            })
        };
        let refused = LaunchError::Refused;
        let each = |entry, chunked: &[&GpuSlice], op, floats: &[f32]| {
            let n = chunked.first().map_or(0, |slice| elements(slice));
            self.elementwise(entry, chunked, &[], n, Params::new(op, floats))
                .map(Plan::Dispatches)
                .map_err(refused)
        };
        match &launch.kernel {
            Kernel::Map { op, scalars } => {
                let bindings = (0..op.definition().bindings())
                    .map(b)
                    .collect::<Result<Vec<_>, _>>()?;
                each(map_entry(*op), &bindings, 0, scalars.as_slice())
            }
            Kernel::Copy | Kernel::Identity => Ok(Plan::Copy(b(0)?.clone(), b(1)?.clone())),
            Kernel::Empty | Kernel::Trap => Ok(Plan::Nothing),
            &Kernel::ActivationForward { activation } => {
                let (code, slope) = activation_code(activation);
                each(FORWARD, &[b(0)?, b(1)?], code, &[slope])
            }
            &Kernel::ActivationBackward { activation } => {
                let (code, slope) = activation_code(activation);
                each(BACKWARD, &[b(0)?, b(1)?, b(2)?], code, &[slope])
            }
            Kernel::Gemm { spec, bias } => {
                let bias = if *bias { Some(b(2)?) } else { None };
                let c = b(launch.bindings.len().saturating_sub(1))?;
                self.gemm(spec, b(0)?, b(1)?, bias, c).map_err(refused)
            }
            &Kernel::ColumnSum { rows, cols } => {
                let windows = vec![self.window(b(0)?), self.window(b(1)?)];
                let windows = windows
                    .into_iter()
                    .collect::<Result<_, _>>()
                    .map_err(refused)?;
                let mut params = Params::new(0, &[]);
                params.u[8] = u32_of(rows).map_err(refused)?;
                let dispatch = self.dispatch(COLUMN_SUM, windows, None, params, cols);
                Ok(Plan::Dispatches(vec![dispatch.map_err(refused)?]))
            }
            Kernel::MseLoss => {
                let (pred, target, out) = (b(0)?, b(1)?, b(2)?);
                let windows = [pred, target, out].map(|slice| self.window(slice));
                let windows = windows
                    .into_iter()
                    .collect::<Result<_, _>>()
                    .map_err(refused)?;
                let mut dispatch = self
                    .dispatch(MSE_LOSS, windows, None, Params::new(0, &[]), elements(pred))
                    .map_err(refused)?;
                dispatch.groups = [1, 1, 1];
                Ok(Plan::Dispatches(vec![dispatch]))
            }
            Kernel::SegmentSum { segments } => {
                self.segment_sum(b(0)?, segments, b(1)?, 0).map_err(refused)
            }
            Kernel::SegmentSumSquares { segments } => {
                self.segment_sum(b(0)?, segments, b(1)?, 1).map_err(refused)
            }
            &Kernel::AmpUnscale { inv_scale } => {
                let flag = self.window(b(1)?).map_err(refused)?;
                let grads = b(0)?;
                let params = Params::new(0, &[inv_scale]);
                self.elementwise(AMP_UNSCALE, &[grads], &[flag], elements(grads), params)
                    .map(Plan::Dispatches)
                    .map_err(refused)
            }
            Kernel::OptimizerStep(step) => match &step.config {
                OptimizerConfig::Lamb(config) => Ok(Plan::Lamb(config, step)),
                _ => self.optimizer_step(step, &launch.bindings),
            },
            Kernel::AmpUnscaleByDeviceScale => self.unscale_by_device_scale(&launch.bindings),
            Kernel::AmpUpdateScale { rule } => self.update_scale(rule, &launch.bindings),
            Kernel::OptimizerStepCounted(step) => self.counted_step(step, &launch.bindings),
            &Kernel::Softmax { rows, cols, log } => {
                let slices = [b(0)?, b(1)?];
                let params = softmax_params(rows, cols, log).map_err(refused)?;
                self.rows_dispatch(SOFTMAX, &slices, None, params)
                    .map_err(refused)
            }
            &Kernel::SoftmaxBackward { rows, cols, log } => {
                let slices = [b(0)?, b(1)?, b(2)?];
                let params = softmax_params(rows, cols, log).map_err(refused)?;
                self.rows_dispatch(SOFTMAX_BACKWARD, &slices, None, params)
                    .map_err(refused)
            }
            Kernel::ClassLoss(spec) => {
                let weight = spec.weighted.then(|| b(2)).transpose()?;
                let out = b(2 + usize::from(spec.weighted))?;
                let slices = [b(0)?, b(1)?, out];
                let (entry, one_group) = match spec.reduction {
                    Reduction::None => (CLASS_LOSS_ROWS, false),
                    Reduction::Mean | Reduction::Sum => (CLASS_LOSS_TOTAL, true),
                };
                let params = class_loss_params(spec).map_err(refused)?;
                let mut plan = self
                    .rows_dispatch(entry, &slices, Some(weight), params)
                    .map_err(refused)?;
                if let (true, Plan::Dispatches(dispatches)) = (one_group, &mut plan) {
                    dispatches.iter_mut().for_each(|d| d.groups = [1, 1, 1]);
                }
                Ok(plan)
            }
            Kernel::ClassLossBackward(spec) => {
                let weight = spec.weighted.then(|| b(2)).transpose()?;
                let next = 2 + usize::from(spec.weighted);
                let slices = [b(0)?, b(1)?, b(next)?, b(next + 1)?];
                let params = class_loss_params(spec).map_err(refused)?;
                self.rows_dispatch(CLASS_LOSS_BACKWARD, &slices, Some(weight), params)
                    .map_err(refused)
            }
            Kernel::BroadcastBinary(spec) => {
                let slices = [b(0)?, b(1)?, b(2)?];
                self.broadcast_binary(spec, &slices).map_err(refused)
            }
            Kernel::StridedSum(spec) => {
                let slices = [b(0)?, b(1)?];
                self.strided_sum(spec, &slices).map_err(refused)
            }
            Kernel::LayerNorm(spec) => {
                let (affine, next) = match spec.affine {
                    true => (Some([b(1)?, b(2)?]), 3),
                    false => (None, 1),
                };
                let slices = [b(0)?, b(next)?, b(next + 1)?];
                self.layer_norm(spec, slices, affine).map_err(refused)
            }
            Kernel::LayerNormBackward(spec) => {
                let weight = spec.affine.then(|| b(1)).transpose()?;
                let next = 1 + usize::from(spec.affine);
                let rest = [b(next)?, b(next + 1)?, b(next + 2)?, b(next + 3)?];
                self.layer_norm_backward(spec, b(0)?, weight, rest)
                    .map_err(refused)
            }
            Kernel::BatchedGemm(spec) => {
                let (a, c, out) = (b(0)?, b(1)?, b(2)?);
                let gemm = &spec.gemm;
                let (mk, kn) = ((gemm.m * gemm.k) as u64, (gemm.k * gemm.n) as u64);
                let mn = (gemm.m * gemm.n) as u64;
                let mut all = Vec::new();
                let pairs = spec.a_offsets.iter().zip(&spec.b_offsets);
                for (i, (&at_a, &at_b)) in pairs.enumerate() {
                    let plan = self
                        .gemm(
                            gemm,
                            &a.part(4 * at_a, 4 * mk),
                            &c.part(4 * at_b, 4 * kn),
                            None,
                            &out.part(4 * i as u64 * mn, 4 * mn),
                        )
                        .map_err(refused)?;
                    if let Plan::Submissions(dispatches) | Plan::Dispatches(dispatches) = plan {
                        all.extend(dispatches);
                    }
                }
                Ok(Plan::Submissions(all))
            }
            Kernel::Dropout(spec) | Kernel::DropoutCounted(spec) => {
                let n = elements(b(0)?);
                if n == 0 {
                    return Ok(Plan::Nothing);
                }
                let (entry, bound) = match launch.kernel {
                    Kernel::DropoutCounted(_) => (DROPOUT_COUNTED, 3),
                    _ => (DROPOUT, 2),
                };
                let windows = (0..bound)
                    .map(|i| self.window(b(i)?).map_err(refused))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut params = Params::new(0, &[spec.scale]);
                params.u[8] = spec.seed as u32;
                params.u[9] = (spec.seed >> 32) as u32;
                params.u[10] = spec.threshold;
                let dispatch = self
                    .dispatch(entry, windows, None, params, n)
                    .map_err(refused)?;
                Ok(Plan::Dispatches(vec![dispatch]))
            }
            Kernel::BatchGather(spec) => {
                let slices = [b(0)?, b(1)?, b(2)?, b(3)?, b(4)?];
                self.batch_gather(spec, &slices).map_err(refused)
            }
            Kernel::Embedding(spec) => {
                let slices = [b(0)?, b(1)?, b(2)?];
                let items = spec.outputs().unwrap_or(0);
                self.embedding(EMBEDDING, spec, &slices, items)
                    .map_err(refused)
            }
            Kernel::EmbeddingBackward(spec) => {
                let slices = [b(0)?, b(1)?, b(2)?];
                self.embedding(EMBEDDING_BACKWARD, spec, &slices, spec.dim)
                    .map_err(refused)
            }
            Kernel::MaxDim(spec) => {
                let slices = [b(0)?, b(1)?, b(2)?];
                let items = spec.outputs().unwrap_or(u64::MAX);
                self.max_dim(MAX_DIM, spec, &slices, items).map_err(refused)
            }
            Kernel::MaxDimBackward(spec) => {
                let slices = [b(0)?, b(1)?, b(2)?];
                let items = spec.inputs().unwrap_or(u64::MAX);
                self.max_dim(MAX_DIM_BACKWARD, spec, &slices, items)
                    .map_err(refused)
            }
            Kernel::Attention(spec) => {
                let slices = [b(0)?, b(1)?, b(2)?, b(3)?, b(4)?];
                let rows = spec.queries;
                self.attention(ATTENTION, spec, &slices, rows)
                    .map_err(refused)
            }
            Kernel::AttentionBackwardQueries(spec) => {
                let slices = [b(0)?, b(1)?, b(2)?, b(3)?, b(4)?, b(5)?];
                let rows = spec.queries;
                self.attention(ATTENTION_BACKWARD_QUERIES, spec, &slices, rows)
                    .map_err(refused)
            }
            Kernel::AttentionBackwardKeys(spec) => {
                let slices = [b(0)?, b(1)?, b(2)?, b(3)?, b(4)?, b(5)?];
                let rows = spec.keys;
                self.attention(ATTENTION_BACKWARD_KEYS, spec, &slices, rows)
                    .map_err(refused)
            }
        }
    }

    /// A layer normalisation, one invocation per row (`norm.wgsl`); zero
    /// windows stand for the weight and bias where it is not affine.
    fn layer_norm(
        &self,
        spec: &LayerNormSpec,
        [x, y, stats]: [&GpuSlice; 3],
        affine: Option<[&GpuSlice; 2]>,
    ) -> Result<Plan<'static>, ServerError> {
        let (weight, bias) = match affine {
            Some([weight, bias]) => (self.window(weight)?, self.window(bias)?),
            None => (self.zero_window(), self.zero_window()),
        };
        let windows = vec![
            self.window(x)?,
            weight,
            bias,
            self.window(y)?,
            self.window(stats)?,
        ];
        let params = layer_norm_params(spec)?;
        let dispatch = self.dispatch(LAYER_NORM, windows, None, params, spec.rows)?;
        Ok(Plan::Dispatches(vec![dispatch]))
    }

    /// Its backward: `rest` is the stats, `grad_y`, `grad_x`, `weighted`.
    fn layer_norm_backward(
        &self,
        spec: &LayerNormSpec,
        x: &GpuSlice,
        weight: Option<&GpuSlice>,
        rest: [&GpuSlice; 4],
    ) -> Result<Plan<'static>, ServerError> {
        let weight = match weight {
            Some(weight) => self.window(weight)?,
            None => self.zero_window(),
        };
        let mut windows = vec![self.window(x)?, weight];
        for slice in rest {
            windows.push(self.window(slice)?);
        }
        let params = layer_norm_params(spec)?;
        let dispatch = self.dispatch(LAYER_NORM_BACKWARD, windows, None, params, spec.rows)?;
        Ok(Plan::Dispatches(vec![dispatch]))
    }

    /// A resident dataset's batch, one invocation per word of `x` and `y`,
    /// then the counter advanced by a dispatch of its own.
    fn batch_gather(
        &self,
        spec: &GatherSpec,
        slices: &[&GpuSlice; 5],
    ) -> Result<Plan<'static>, ServerError> {
        let windows = slices
            .iter()
            .map(|slice| self.window(slice))
            .collect::<Result<Vec<_>, _>>()?;
        let items = u64::from(spec.batch) * (u64::from(spec.width) + u64::from(spec.target_width));
        let mut params = Params::new(0, &[]);
        params.u[8] = spec.rows;
        params.u[9] = spec.width;
        params.u[10] = spec.target_width;
        params.u[11] = spec.batch;
        params.u[12] = spec.seed as u32;
        params.u[13] = (spec.seed >> 32) as u32;
        let counter = vec![self.window(slices[2])?];
        let gather = self.dispatch(BATCH_GATHER, windows, None, params, items)?;
        let advance = self.dispatch(BATCH_GATHER_ADVANCE, counter, None, Params::new(0, &[]), 1)?;
        Ok(Plan::Dispatches(vec![gather, advance]))
    }

    /// An embedding lookup or its backward over `items` invocations.
    fn embedding(
        &self,
        entry: Entry,
        spec: &EmbeddingSpec,
        slices: &[&GpuSlice; 3],
        items: u64,
    ) -> Result<Plan<'static>, ServerError> {
        if items == 0 {
            return Ok(Plan::Nothing);
        }
        let windows = slices
            .iter()
            .map(|slice| self.window(slice))
            .collect::<Result<Vec<_>, _>>()?;
        u32_of(spec.table().unwrap_or(u64::MAX))?;
        u32_of(spec.outputs().unwrap_or(u64::MAX))?;
        let mut params = Params::new(0, &[]);
        params.u[8] = u32_of(spec.rows)?;
        params.u[9] = u32_of(spec.dim)?;
        params.u[10] = u32_of(spec.vocab)?;
        params.u[13] = f32::NAN.to_bits();
        let dispatch = self.dispatch(entry, windows, None, params, items)?;
        Ok(Plan::Dispatches(vec![dispatch]))
    }

    /// A maximum over one dimension or its backward over `items`
    /// invocations (`max.wgsl`).
    fn max_dim(
        &self,
        entry: Entry,
        spec: &MaxDimSpec,
        slices: &[&GpuSlice; 3],
        items: u64,
    ) -> Result<Plan<'static>, ServerError> {
        u32_of(spec.inputs().unwrap_or(u64::MAX))?;
        if items == 0 {
            return Ok(Plan::Nothing);
        }
        let windows = slices
            .iter()
            .map(|slice| self.window(slice))
            .collect::<Result<Vec<_>, _>>()?;
        let mut params = Params::new(0, &[]);
        params.u[8] = u32_of(spec.outer)?;
        params.u[9] = u32_of(spec.dim)?;
        params.u[10] = u32_of(spec.inner)?;
        let dispatch = self.dispatch(entry, windows, None, params, items)?;
        Ok(Plan::Dispatches(vec![dispatch]))
    }

    /// An attention kernel (`attention.wgsl`): one invocation per row of
    /// `positions` (the queries or the keys) of every sequence and head.
    fn attention(
        &self,
        entry: Entry,
        spec: &AttentionSpec,
        slices: &[&GpuSlice],
        positions: u64,
    ) -> Result<Plan<'static>, ServerError> {
        for elements in [spec.query_elements(), spec.key_elements(), spec.weights()] {
            u32_of(elements.unwrap_or(u64::MAX))?;
        }
        let windows = slices
            .iter()
            .map(|slice| self.window(slice))
            .collect::<Result<Vec<_>, _>>()?;
        let mut params = Params::new(0, &[spec.scale]);
        params.u[8] = u32_of(spec.batch)?;
        params.u[9] = u32_of(spec.heads)?;
        params.u[10] = u32_of(spec.queries)?;
        params.u[11] = u32_of(spec.keys)?;
        params.u[12] = u32_of(spec.head_dim)?;
        params.u[13] = u32::from(spec.causal);
        let rows = spec
            .batch
            .saturating_mul(spec.heads)
            .saturating_mul(positions);
        let dispatch = self.dispatch(entry, windows, None, params, rows)?;
        Ok(Plan::Dispatches(vec![dispatch]))
    }

    /// A broadcast binary operation: one invocation per output element,
    /// the shape and strides in the table (`broadcast.wgsl`).
    fn broadcast_binary(
        &self,
        spec: &BroadcastSpec,
        slices: &[&GpuSlice; 3],
    ) -> Result<Plan<'static>, ServerError> {
        let n = elements(slices[2]);
        if n == 0 {
            return Ok(Plan::Nothing);
        }
        let words = [&spec.shape, &spec.a_strides, &spec.b_strides]
            .into_iter()
            .flatten()
            .map(|&value| u32_of(value))
            .collect::<Result<Vec<_>, _>>()?;
        let mut params = Params::new(spec.op.code(), &[]);
        params.u[8] = spec.shape.len() as u32;
        self.table_dispatch(BROADCAST_BINARY, slices, &words, params, n)
    }

    /// A strided sum: one invocation per output element, the dimensions and
    /// strides in the table (`broadcast.wgsl`).
    fn strided_sum(
        &self,
        spec: &SumSpec,
        slices: &[&GpuSlice; 2],
    ) -> Result<Plan<'static>, ServerError> {
        let n = elements(slices[1]);
        if n == 0 {
            return Ok(Plan::Nothing);
        }
        let lists = [
            &spec.shape,
            &spec.strides,
            &spec.summed,
            &spec.summed_strides,
        ];
        let words = lists
            .into_iter()
            .flatten()
            .map(|&value| u32_of(value))
            .collect::<Result<Vec<_>, _>>()?;
        let summed = u32_of(spec.summed.iter().product::<u64>())?;
        let mut params = Params::new(0, &[spec.scale]);
        params.u[8] = spec.shape.len() as u32;
        params.u[9] = spec.summed.len() as u32;
        params.u[10] = summed;
        self.table_dispatch(STRIDED_SUM, slices, &words, params, n)
    }

    /// One dispatch of `entry` over `slices` with `words` as its table, one
    /// invocation per item.
    fn table_dispatch(
        &self,
        entry: Entry,
        slices: &[&GpuSlice],
        words: &[u32],
        params: Params,
        items: u64,
    ) -> Result<Plan<'static>, ServerError> {
        let windows = slices
            .iter()
            .map(|slice| self.window(slice))
            .collect::<Result<Vec<_>, _>>()?;
        let table = self.table(words);
        let dispatch = self.dispatch(entry, windows, Some(table), params, items)?;
        Ok(Plan::Dispatches(vec![dispatch]))
    }

    /// One dispatch of a row-wise `entry`, one invocation per row
    /// (`params.u[8]`), over `slices` in order; a class loss's optional
    /// weight (`Some`) is bound third, a zero window where absent.
    fn rows_dispatch(
        &self,
        entry: Entry,
        slices: &[&GpuSlice],
        weight: Option<Option<&GpuSlice>>,
        params: Params,
    ) -> Result<Plan<'static>, ServerError> {
        let mut windows = slices
            .iter()
            .map(|slice| self.window(slice))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(weight) = weight {
            let window = match weight {
                Some(slice) => self.window(slice)?,
                None => self.zero_window(),
            };
            windows.insert(2, window);
        }
        let rows = u64::from(params.u[8]);
        let dispatch = self.dispatch(entry, windows, None, params, rows)?;
        Ok(Plan::Dispatches(vec![dispatch]))
    }

    pub(super) fn segment_sum(
        &self,
        x: &GpuSlice,
        segments: &[cistern_kernels::Segment],
        out: &GpuSlice,
        op: u32,
    ) -> Result<Plan<'static>, ServerError> {
        let mut words = Vec::with_capacity(2 * segments.len());
        for segment in segments {
            words.push(u32_of(segment.offset as u64)?);
            words.push(u32_of(segment.len as u64)?);
        }
        let windows = vec![self.window(x)?, self.window(out)?];
        let table = self.table(&words);
        let count = segments.len() as u64;
        let mut dispatch = self.dispatch(
            SEGMENT_SUM,
            windows,
            Some(table),
            Params::new(op, &[]),
            count,
        )?;
        // One workgroup per segment.
        dispatch.groups = self.groups_for(count * super::dispatch::WORKGROUP)?;
        Ok(Plan::Dispatches(vec![dispatch]))
    }
}

/// A softmax's parameters (`classify.wgsl`); a matrix whose elements do
/// not fit a shader's u32 is unsupported.
fn softmax_params(rows: u64, cols: u64, log: bool) -> Result<Params, ServerError> {
    u32_of(rows.saturating_mul(cols))?;
    let mut params = Params::new(0, &[]);
    params.u[8] = u32_of(rows)?;
    params.u[9] = u32_of(cols)?;
    params.u[10] = if log { 4 } else { 0 };
    Ok(params)
}

/// A layer normalisation's parameters (`norm.wgsl`); a matrix whose
/// elements do not fit a shader's u32 is unsupported.
fn layer_norm_params(spec: &LayerNormSpec) -> Result<Params, ServerError> {
    u32_of(spec.elements().unwrap_or(u64::MAX))?;
    u32_of(spec.rows.saturating_mul(2))?;
    let mut params = Params::new(0, &[spec.eps]);
    params.u[8] = u32_of(spec.rows)?;
    params.u[9] = u32_of(spec.cols)?;
    params.u[10] = u32::from(spec.affine);
    Ok(params)
}

/// A class loss's parameters (`classify.wgsl`); a matrix whose elements
/// do not fit a shader's u32 is unsupported.
fn class_loss_params(spec: &ClassLossSpec) -> Result<Params, ServerError> {
    let elements = (spec.rows as u64).saturating_mul(spec.classes as u64);
    u32_of(elements)?;
    let mut params = Params::new(0, &[spec.label_smoothing]);
    params.u[8] = u32_of(spec.rows as u64)?;
    params.u[9] = u32_of(spec.classes as u64)?;
    let log_probabilities = spec.input == ClassInput::LogProbabilities;
    params.u[10] = u32::from(spec.weighted) | (u32::from(log_probabilities) << 1);
    params.u[11] = match spec.reduction {
        Reduction::None => 0,
        Reduction::Mean => 1,
        Reduction::Sum => 2,
    };
    params.u[12] = spec.ignore_index as u32;
    params.u[13] = f32::NAN.to_bits();
    Ok(params)
}

/// `value` as a shader's u32, or an unsupported size.
pub(super) fn u32_of(value: u64) -> Result<u32, ServerError> {
    u32::try_from(value).map_err(|_| unsupported(format!("a size of {value} in a shader")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `elements` f32s `offset` bytes into a fresh buffer.
    fn slice(context: &GpuContext, offset: u64, elements: u64) -> GpuSlice {
        let buffer = context.device.create_buffer(&::wgpu::BufferDescriptor {
            label: None,
            size: 1 << 16,
            usage: ::wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        GpuSlice {
            buffer,
            offset,
            size: 4 * elements,
        }
    }

    /// Each dispatch's module and element count.
    fn shape(dispatches: &[Dispatch]) -> Vec<(Module, u32)> {
        (dispatches.iter())
            .map(|dispatch| (dispatch.entry.module, dispatch.params.u[0]))
            .collect()
    }

    #[test]
    fn aligned_windows_stream_their_bulk_as_vec4s_and_the_tail_element_by_element() {
        let Some(context) = GpuContext::for_tests() else {
            return;
        };
        let n = 4 * 100 + 3;
        let (a, b, c) = (
            slice(&context, 0, n),
            slice(&context, 256, n),
            slice(&context, 512, n),
        );
        for (entry, chunked) in [
            (map_entry(MapOp::Fill), vec![&a]),
            (map_entry(MapOp::Axpy), vec![&a, &b]),
            (map_entry(MapOp::Add), vec![&a, &b, &c]),
        ] {
            let got = context.elementwise(entry, &chunked, &[], n, Params::default());
            let got = got.map(|dispatches| shape(&dispatches));
            let want = vec![(Module::MapVec4, 400), (Module::Map, 3)];
            assert_eq!(got.ok(), Some(want), "{}", entry.name);
        }
    }

    #[test]
    fn a_window_off_a_16_byte_boundary_runs_element_by_element() {
        let Some(context) = GpuContext::for_tests() else {
            return;
        };
        let n = 4 * 100;
        let (a, b) = (slice(&context, 0, n), slice(&context, 260, n));
        let axpy = map_entry(MapOp::Axpy);
        let got = context.elementwise(axpy, &[&a, &b], &[], n, Params::default());
        let got = got.map(|dispatches| shape(&dispatches));
        assert_eq!(got.ok(), Some(vec![(Module::Map, 400)]));
    }

    #[test]
    fn an_entry_without_a_vec4_twin_runs_element_by_element() {
        let Some(context) = GpuContext::for_tests() else {
            return;
        };
        let n = 4 * 100;
        let (grads, flag) = (slice(&context, 0, n), slice(&context, 1024, 1));
        let Ok(flag) = context.window(&flag) else {
            panic!("a one-element window");
        };
        let got = context.elementwise(AMP_UNSCALE, &[&grads], &[flag], n, Params::default());
        let got = got.map(|dispatches| shape(&dispatches));
        assert_eq!(got.ok(), Some(vec![(Module::Elementwise, 400)]));
    }
}
