//! Each kernel of the catalogue as CUDA launches: which `cistern_*`
//! function, its grid, its arguments. Matched exhaustively: a kernel with
//! no CUDA version answers `Unsupported` in its own arm.

use std::ffi::c_void;

use cistern_kernels::{
    Activation, BatchedGemmSpec, ClassInput, ClassLossSpec, GemmSpec, MAX_RANK, Reduction,
};
use cistern_optim::OptimizerConfig;
use cudarc::driver::sys::CUstream;

use super::context::Module;
use super::ffi;
use super::lamb::LambBuffers;
use super::optimizer::step_plan;
use super::scratch::Scratch;
use super::status::{fault, launch_error};
use crate::backend::stream::{BoundLaunch, KernelFault, LaunchError};
use crate::error::ServerError;
use crate::kernel::Kernel;
use crate::optimizer::OptimizerArgs;

/// A resolved range of device memory: its address and length in bytes.
/// The manager frees memory only once every stream that used it has
/// completed past its last use, so the address stays valid while queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CudaSlice {
    pub(super) address: u64,
    pub(super) len: u64,
}

impl CudaSlice {
    fn floats(&self) -> u64 {
        self.len / 4
    }
}

/// `values` padded in front with `fill` to the broadcast kernels' rank
/// (`broadcast.cu`); a longer list (refused by the contract) is malformed.
fn padded(values: &[u64], fill: u64) -> Result<[Arg; MAX_RANK], LaunchError> {
    let lead = MAX_RANK
        .checked_sub(values.len())
        .ok_or_else(|| malformed("a broadcast of more than 6 dimensions"))?;
    let mut args = [Arg::U64(fill); MAX_RANK];
    for (slot, &value) in args[lead..].iter_mut().zip(values) {
        *slot = Arg::U64(value);
    }
    Ok(args)
}

/// Threads per block of every kernel (the reductions assume it).
pub(super) const BLOCK: u32 = 256;
/// The most blocks a grid-stride kernel is given.
pub(super) const MAX_GRID: u64 = 8192;

/// One kernel argument, kept in a 64-bit slot the kernel reads its own
/// width from (little-endian: a 4-byte argument is the slot's first bytes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Arg {
    Pointer(u64),
    U64(u64),
    F32(f32),
    F64(f64),
    I32(i32),
    U32(u32),
}

impl Arg {
    fn slot(self) -> u64 {
        match self {
            Arg::Pointer(value) | Arg::U64(value) => value,
            Arg::F32(value) => u64::from(value.to_bits()),
            Arg::F64(value) => value.to_bits(),
            Arg::I32(value) => u64::from(value as u32),
            Arg::U32(value) => u64::from(value),
        }
    }
}

/// A class loss's arguments after its pointers (`classify.cu`): rows,
/// classes, log-probabilities, reduction (0 none, 1 mean, 2 sum),
/// ignore_index, label smoothing.
fn class_loss_args(spec: &ClassLossSpec) -> [Arg; 6] {
    let reduction = match spec.reduction {
        Reduction::None => 0,
        Reduction::Mean => 1,
        Reduction::Sum => 2,
    };
    [
        Arg::U64(spec.rows as u64),
        Arg::U64(spec.classes as u64),
        Arg::I32((spec.input == ClassInput::LogProbabilities).into()),
        Arg::I32(reduction),
        Arg::I32(spec.ignore_index),
        Arg::F32(spec.label_smoothing),
    ]
}

/// Rows and columns of C one `cistern_gemm` block computes (`gemm.cu`).
const GEMM_TILE: u64 = 64;
/// Rows and columns of C one `cistern_gemm_large` block computes.
const GEMM_LARGE_TILE: u64 = 128;
/// The fewest 128×128 tiles for which `cistern_gemm_large` is chosen: below
/// it, the large tiles would leave most of a big GPU's multiprocessors idle
/// (an H200 has 132), and 64×64 tiles spread the product further.
const GEMM_LARGE_MIN_TILES: u64 = 128;

/// The `tile`×`tile` tiles covering an `m×n` C (edge tiles included): the
/// blocks a GEMM kernel of that tile wants (it strides over tiles past the
/// grid's cap); `None` when the count overflows.
fn gemm_tiles(m: u64, n: u64, tile: u64) -> Option<u64> {
    m.div_ceil(tile).checked_mul(n.div_ceil(tile))
}

/// The GEMM kernel for an `m×n` C and the blocks it wants.
fn gemm_kernel(m: u64, n: u64) -> Option<(&'static str, u64)> {
    let large = gemm_tiles(m, n, GEMM_LARGE_TILE)?;
    if large >= GEMM_LARGE_MIN_TILES {
        return Some(("cistern_gemm_large", large));
    }
    Some(("cistern_gemm", gemm_tiles(m, n, GEMM_TILE)?))
}

/// The blocks of a launch wanting `wanted`: at least one, at most
/// [`MAX_GRID`] (every kernel strides over what lies past its grid).
pub(super) fn grid_of(wanted: u64) -> u32 {
    u32::try_from(wanted.clamp(1, MAX_GRID)).unwrap_or(1)
}

/// Launches one kernel on a stream.
pub(super) struct Launcher<'a> {
    pub(super) module: &'a Module,
    pub(super) stream: CUstream,
    /// The stream's scratch memory (LAMB's sums), of context epoch `epoch`.
    pub(super) scratch: &'a mut Scratch,
    pub(super) epoch: u64,
}

impl Launcher<'_> {
    /// Queues kernel `name` on `grid` blocks (clamped by [`grid_of`]).
    pub(super) fn call(&self, name: &str, grid: u64, args: &[Arg]) -> Result<(), LaunchError> {
        let function = self
            .module
            .function(name)
            .ok_or_else(|| fault(name, &ffi::not_found()))?;
        let mut slots: Vec<u64> = args.iter().map(|arg| arg.slot()).collect();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|slot| (slot as *mut u64).cast())
            .collect();
        let grid = grid_of(grid);
        // SAFETY: every `cistern_*` kernel's parameters are, in order, the
        // `args` given for it below (pointers, u64 counts, f32, int), each
        // slot lives until the launch is queued (the driver copies them),
        // and the server checked every binding spans what the sizes say.
        unsafe { ffi::launch(function, grid, BLOCK, self.stream, &mut params) }
            .map_err(|e| launch_error(name, &e))
    }

    /// A grid-stride kernel over `n` elements.
    pub(super) fn stride(&self, name: &str, n: u64, args: &[Arg]) -> Result<(), LaunchError> {
        self.call(name, n.div_ceil(u64::from(BLOCK)), args)
    }

    /// Queues `launch` on the stream.
    pub(super) fn run(&mut self, launch: &BoundLaunch<CudaSlice>) -> Result<(), LaunchError> {
        let b = Bound(launch);
        let p = |index| b.pointer(index);
        match &launch.kernel {
            Kernel::Map { op, scalars } => {
                let definition = op.definition();
                let bindings: Vec<usize> = (0..definition.bindings()).collect();
                let n = b.same_floats(&bindings)?;
                let mut args = bindings
                    .iter()
                    .map(|&i| p(i))
                    .collect::<Result<Vec<_>, _>>()?;
                args.extend(scalars.as_slice().iter().map(|&s| Arg::F32(s)));
                args.push(Arg::U64(n));
                // Four elements a thread through `float4` (map/table.rs).
                self.stride(definition.cuda_entry, n.div_ceil(4), &args)
            }
            Kernel::Copy => {
                let (source, target) = (b.slice(0)?, b.slice(1)?);
                let len = usize::try_from(source.len.min(target.len))
                    .map_err(|_| malformed("copy too long"))?;
                ffi::copy(source.address, target.address, len, self.stream)
                    .map_err(|e| launch_error("copy", &e))
            }
            Kernel::Identity => {
                let n = b.same_floats(&[0, 1])?;
                self.stride("cistern_identity", n, &[p(0)?, p(1)?, Arg::U64(n)])
            }
            Kernel::Empty => self.call("cistern_empty", 1, &[]),
            Kernel::Trap => self.call("cistern_trap", 1, &[]),
            &Kernel::ActivationForward { activation } => {
                let (kind, slope) = activation_code(activation);
                let n = b.same_floats(&[0, 1])?;
                self.stride(
                    "cistern_activation_forward",
                    n,
                    &[kind, slope, p(0)?, p(1)?, Arg::U64(n)],
                )
            }
            &Kernel::ActivationBackward { activation } => {
                let (kind, slope) = activation_code(activation);
                let n = b.same_floats(&[0, 1, 2])?;
                let args = [kind, slope, p(0)?, p(1)?, p(2)?, Arg::U64(n)];
                self.stride("cistern_activation_backward", n, &args)
            }
            Kernel::Gemm { spec, bias } => self.gemm(&b, spec, *bias),
            &Kernel::ColumnSum { rows, cols } => {
                let fits = rows.checked_mul(cols) == Some(b.floats(0)?) && b.floats(1)? == cols;
                if !fits {
                    return Err(refused(
                        "column_sum: x is not rows×cols or out not cols long",
                    ));
                }
                self.stride(
                    "cistern_column_sum",
                    cols,
                    &[p(0)?, Arg::U64(rows), Arg::U64(cols), p(1)?],
                )
            }
            &Kernel::Softmax { rows, cols, log } => {
                let fits = rows.checked_mul(cols) == Some(b.same_floats(&[0, 1])?);
                if !fits {
                    return Err(refused("softmax: x is not rows×cols"));
                }
                let args = [
                    p(0)?,
                    p(1)?,
                    Arg::U64(rows),
                    Arg::U64(cols),
                    Arg::I32(log.into()),
                ];
                self.stride("cistern_softmax", rows, &args)
            }
            &Kernel::SoftmaxBackward { rows, cols, log } => {
                let fits = rows.checked_mul(cols) == Some(b.same_floats(&[0, 1, 2])?);
                if !fits {
                    return Err(refused("softmax_backward: y is not rows×cols"));
                }
                let args = [
                    p(0)?,
                    p(1)?,
                    p(2)?,
                    Arg::U64(rows),
                    Arg::U64(cols),
                    Arg::I32(log.into()),
                ];
                self.stride("cistern_softmax_backward", rows, &args)
            }
            Kernel::ClassLoss(spec) => {
                let weight = if spec.weighted {
                    p(2)?
                } else {
                    Arg::Pointer(0)
                };
                let out = p(2 + usize::from(spec.weighted))?;
                let mut args = vec![p(0)?, p(1)?, weight, out];
                args.extend(class_loss_args(spec));
                let rows = spec.rows as u64;
                match spec.reduction {
                    Reduction::None => self.stride("cistern_class_loss", rows, &args),
                    Reduction::Mean | Reduction::Sum => self.call("cistern_class_loss", 1, &args),
                }
            }
            Kernel::ClassLossBackward(spec) => {
                let weight = if spec.weighted {
                    p(2)?
                } else {
                    Arg::Pointer(0)
                };
                let next = 2 + usize::from(spec.weighted);
                let mut args = vec![p(0)?, p(1)?, weight, p(next)?, p(next + 1)?];
                args.extend(class_loss_args(spec));
                self.stride("cistern_class_loss_backward", spec.rows as u64, &args)
            }
            Kernel::BroadcastBinary(spec) => {
                let n = b.floats(2)?;
                let mut args = vec![p(0)?, p(1)?, p(2)?, Arg::I32(spec.op.code() as i32)];
                args.extend(padded(&spec.shape, 1)?);
                args.extend(padded(&spec.a_strides, 0)?);
                args.extend(padded(&spec.b_strides, 0)?);
                args.push(Arg::U64(n));
                self.stride("cistern_broadcast_binary", n, &args)
            }
            Kernel::StridedSum(spec) => {
                let n = b.floats(1)?;
                let summed = spec.summed.iter().product::<u64>();
                let mut args = vec![p(0)?, p(1)?, Arg::F32(spec.scale)];
                args.extend(padded(&spec.shape, 1)?);
                args.extend(padded(&spec.strides, 0)?);
                args.extend(padded(&spec.summed, 1)?);
                args.extend(padded(&spec.summed_strides, 0)?);
                args.extend([Arg::U64(summed), Arg::U64(n)]);
                self.stride("cistern_strided_sum", n, &args)
            }
            Kernel::LayerNorm(spec) => {
                let (weight, bias, next) = match spec.affine {
                    true => (p(1)?, p(2)?, 3),
                    false => (Arg::Pointer(0), Arg::Pointer(0), 1),
                };
                let args = [
                    p(0)?,
                    weight,
                    bias,
                    p(next)?,
                    p(next + 1)?,
                    Arg::U64(spec.rows),
                    Arg::U64(spec.cols),
                    Arg::F32(spec.eps),
                ];
                self.stride("cistern_layer_norm", spec.rows, &args)
            }
            Kernel::LayerNormBackward(spec) => {
                let (weight, next) = match spec.affine {
                    true => (p(1)?, 2),
                    false => (Arg::Pointer(0), 1),
                };
                let args = [
                    p(0)?,
                    weight,
                    p(next)?,
                    p(next + 1)?,
                    p(next + 2)?,
                    p(next + 3)?,
                    Arg::U64(spec.rows),
                    Arg::U64(spec.cols),
                ];
                self.stride("cistern_layer_norm_backward", spec.rows, &args)
            }
            Kernel::BatchedGemm(spec) => self.batched_gemm(&b, spec),
            Kernel::Dropout(spec) | Kernel::DropoutCounted(spec) => {
                // The counted form binds its counter between `x` and `out`.
                let (name, out) = match launch.kernel {
                    Kernel::DropoutCounted(_) => ("cistern_dropout_counted", 2),
                    _ => ("cistern_dropout", 1),
                };
                let n = b.same_floats(&[0, out])?;
                let mut args = (0..=out).map(p).collect::<Result<Vec<_>, _>>()?;
                args.extend([
                    Arg::U32(spec.seed as u32),
                    Arg::U32((spec.seed >> 32) as u32),
                    Arg::U32(spec.threshold),
                    Arg::F32(spec.scale),
                    Arg::U64(n),
                ]);
                self.stride(name, n, &args)
            }
            Kernel::BatchGather(spec) => {
                let row_words = u64::from(spec.width) + u64::from(spec.target_width);
                let items = u64::from(spec.batch) * row_words;
                let args = [
                    p(0)?,
                    p(1)?,
                    p(2)?,
                    p(3)?,
                    p(4)?,
                    Arg::U32(spec.rows),
                    Arg::U32(spec.width),
                    Arg::U32(spec.target_width),
                    Arg::U32(spec.batch),
                    Arg::U32(spec.seed as u32),
                    Arg::U32((spec.seed >> 32) as u32),
                    Arg::U64(items),
                ];
                self.stride("cistern_batch_gather", items, &args)?;
                self.call("cistern_batch_gather_advance", 1, &[p(2)?])
            }
            Kernel::Embedding(spec) => {
                let n = b.floats(2)?;
                let shape = [
                    Arg::U64(spec.rows),
                    Arg::U64(spec.dim),
                    Arg::U64(spec.vocab),
                ];
                let mut args = vec![p(0)?, p(1)?, p(2)?];
                args.extend(shape);
                self.stride("cistern_embedding", n, &args)
            }
            Kernel::EmbeddingBackward(spec) => {
                let shape = [
                    Arg::U64(spec.rows),
                    Arg::U64(spec.dim),
                    Arg::U64(spec.vocab),
                ];
                let mut args = vec![p(0)?, p(1)?, p(2)?];
                args.extend(shape);
                self.stride("cistern_embedding_backward", spec.dim, &args)
            }
            Kernel::Attention(spec)
            | Kernel::AttentionBackwardQueries(spec)
            | Kernel::AttentionBackwardKeys(spec) => {
                let (name, positions, bindings) = match launch.kernel {
                    Kernel::Attention(_) => ("cistern_attention", spec.queries, 5),
                    Kernel::AttentionBackwardQueries(_) => {
                        ("cistern_attention_backward_queries", spec.queries, 6)
                    }
                    _ => ("cistern_attention_backward_keys", spec.keys, 6),
                };
                let mut args = (0..bindings).map(p).collect::<Result<Vec<_>, _>>()?;
                args.extend([
                    Arg::U64(spec.batch),
                    Arg::U64(spec.heads),
                    Arg::U64(spec.queries),
                    Arg::U64(spec.keys),
                    Arg::U64(spec.head_dim),
                    Arg::U64(u64::from(spec.causal)),
                    Arg::F32(spec.scale),
                ]);
                let rows = spec
                    .batch
                    .saturating_mul(spec.heads)
                    .saturating_mul(positions);
                self.stride(name, rows, &args)
            }
            Kernel::MaxDim(spec) | Kernel::MaxDimBackward(spec) => {
                let (name, n) = match launch.kernel {
                    Kernel::MaxDim(_) => ("cistern_max_dim", spec.outputs()),
                    _ => ("cistern_max_dim_backward", spec.inputs()),
                };
                let n = n.ok_or_else(|| malformed("max_dim: the sizes overflow"))?;
                let shape = [
                    Arg::U64(spec.outer),
                    Arg::U64(spec.dim),
                    Arg::U64(spec.inner),
                ];
                let mut args = vec![p(0)?, p(1)?, p(2)?];
                args.extend(shape);
                self.stride(name, n, &args)
            }
            Kernel::MseLoss => {
                let n = b.same_floats(&[0, 1])?;
                if n == 0 {
                    return Err(refused("mse_loss: the mean of no elements is undefined"));
                }
                self.call("cistern_mse_loss", 1, &[p(0)?, p(1)?, p(2)?, Arg::U64(n)])
            }
            Kernel::SegmentSum { segments } => self.segment_sums(&b, segments, false),
            Kernel::SegmentSumSquares { segments } => self.segment_sums(&b, segments, true),
            &Kernel::AmpUnscale { inv_scale } => {
                let n = b.floats(0)?;
                self.stride(
                    "cistern_amp_unscale",
                    n,
                    &[p(0)?, Arg::F32(inv_scale), p(1)?, Arg::U64(n)],
                )
            }
            Kernel::OptimizerStep(args) => {
                let first_state = if args.found_inf { 3 } else { 2 };
                if let OptimizerConfig::Lamb(config) = &args.config {
                    let flag = args.found_inf.then(|| b.slice(2)).transpose()?;
                    let buffers = b.lamb_buffers(first_state)?;
                    return self.lamb(launch.kernel.name(), config, args, buffers, flag, None);
                }
                let flag = if args.found_inf {
                    p(2)?
                } else {
                    Arg::Pointer(0)
                };
                self.step(&b, args, args.step, flag, Arg::Pointer(0), first_state)
            }
            Kernel::AmpUnscaleByDeviceScale => {
                let n = b.floats(0)?;
                let args = [p(0)?, p(1)?, p(2)?, Arg::U64(n)];
                self.stride("cistern_amp_unscale_by_device_scale", n, &args)
            }
            Kernel::AmpUpdateScale { rule } => {
                let args = [
                    p(0)?,
                    p(1)?,
                    p(2)?,
                    p(3)?,
                    Arg::F64(rule.growth_factor),
                    Arg::F64(rule.backoff_factor),
                    Arg::U32(rule.growth_interval),
                ];
                self.call("cistern_amp_update_scale", 1, &args)
            }
            Kernel::OptimizerStepCounted(args) => {
                if let OptimizerConfig::Lamb(config) = &args.config {
                    // Read back anyway between passes: the host counts.
                    let (flag, count) = (Some(b.slice(2)?), Some(b.slice(3)?));
                    let buffers = b.lamb_buffers(4)?;
                    return self.lamb(launch.kernel.name(), config, args, buffers, flag, count);
                }
                let (flag, count) = (p(2)?, p(3)?);
                // The step reads the count; the advance, queued after it on
                // the same stream, writes it.
                self.step(&b, args, 1, flag, count, 4)?;
                self.call("cistern_step_count_advance", 1, &[flag, count])
            }
        }
    }

    /// `C = act(op(A)·op(B) + bias)` over bindings a, b, [bias], c.
    fn gemm(&self, b: &Bound<'_>, spec: &GemmSpec, bias: bool) -> Result<(), LaunchError> {
        let (m, n, k) = (spec.m as u64, spec.n as u64, spec.k as u64);
        let (kernel, tiles) = gemm_kernel(m, n).ok_or_else(|| refused("gemm: m×n overflows"))?;
        if tiles == 0 {
            return Ok(());
        }
        let (bias, c) = if bias {
            (b.pointer(2)?, b.pointer(3)?)
        } else {
            (Arg::Pointer(0), b.pointer(2)?)
        };
        let (kind, slope) = activation_code(spec.activation);
        let args = [
            b.pointer(0)?,
            b.pointer(1)?,
            bias,
            c,
            Arg::U64(m),
            Arg::U64(n),
            Arg::U64(k),
            Arg::I32(i32::from(spec.transpose_a)),
            Arg::I32(i32::from(spec.transpose_b)),
            kind,
            slope,
        ];
        self.call(kernel, tiles, &args)
    }

    /// Each product of a batch as one GEMM launch, its operands at their
    /// offsets (a kernel of its own would make it one).
    fn batched_gemm(&self, b: &Bound<'_>, spec: &BatchedGemmSpec) -> Result<(), LaunchError> {
        let gemm = &spec.gemm;
        let (m, n, k) = (gemm.m as u64, gemm.n as u64, gemm.k as u64);
        let (kernel, tiles) = gemm_kernel(m, n).ok_or_else(|| refused("gemm: m×n overflows"))?;
        if tiles == 0 {
            return Ok(());
        }
        let (a, bb, c) = (b.slice(0)?, b.slice(1)?, b.slice(2)?);
        let (kind, slope) = activation_code(gemm.activation);
        for (i, (&at_a, &at_b)) in spec.a_offsets.iter().zip(&spec.b_offsets).enumerate() {
            let args = [
                Arg::Pointer(a.address + 4 * at_a),
                Arg::Pointer(bb.address + 4 * at_b),
                Arg::Pointer(0),
                Arg::Pointer(c.address + 4 * (i as u64) * m * n),
                Arg::U64(m),
                Arg::U64(n),
                Arg::U64(k),
                Arg::I32(i32::from(gemm.transpose_a)),
                Arg::I32(i32::from(gemm.transpose_b)),
                kind,
                slope,
            ];
            self.call(kernel, tiles, &args)?;
        }
        Ok(())
    }

    /// One step of `args`' family as step `step` over params, grads and the
    /// state from binding `first_state`: a launch per run of adjacent
    /// segments. `flag` and `count` are device pointers or null.
    fn step(
        &self,
        b: &Bound<'_>,
        args: &OptimizerArgs,
        step: u64,
        flag: Arg,
        count: Arg,
        first_state: usize,
    ) -> Result<(), LaunchError> {
        let plan = step_plan(&args.config, step)
            .ok_or_else(|| malformed("lamb has no step plan: it runs its own passes"))?;
        let (params, grads) = (b.slice(0)?, b.slice(1)?);
        let mut state = vec![None; plan.state_slots];
        for (index, &slot) in plan.layout_slots.iter().enumerate() {
            let buffer = b.slice(first_state + index)?;
            if let Some(entry) = state.get_mut(slot) {
                *entry = Some(buffer);
            }
        }
        for (first, len) in cistern_kernels::segment_runs(&args.segments) {
            let at = |slice: CudaSlice| Arg::Pointer(slice.address + 4 * first);
            let mut kernel_args = vec![at(params), at(grads)];
            kernel_args.extend(state.iter().map(|s| s.map_or(Arg::Pointer(0), at)));
            kernel_args.extend([flag, count]);
            kernel_args.extend(plan.scalars.iter().copied());
            kernel_args.push(Arg::U64(len));
            self.stride(plan.name, len, &kernel_args)?;
        }
        Ok(())
    }

    /// One block per segment, each writing its own output element.
    fn segment_sums(
        &self,
        b: &Bound<'_>,
        segments: &[cistern_kernels::Segment],
        squares: bool,
    ) -> Result<(), LaunchError> {
        let x = b.slice(0)?;
        let out = b.slice(1)?;
        let total = usize::try_from(x.floats()).map_err(|_| malformed("x too long"))?;
        cistern_optim::validate_segments(segments, total).map_err(|e| refused(&e.to_string()))?;
        if out.floats() != segments.len() as u64 {
            return Err(refused("segment sums: out needs one element per segment"));
        }
        for (index, segment) in segments.iter().enumerate() {
            let args = [
                Arg::Pointer(x.address + 4 * segment.offset as u64),
                Arg::U64(segment.len as u64),
                Arg::I32(i32::from(squares)),
                Arg::Pointer(out.address + 4 * index as u64),
            ];
            self.call("cistern_segment_sum", 1, &args)?;
        }
        Ok(())
    }
}

/// `Activation`'s code in `activation.cu`, and its slope.
fn activation_code(activation: Activation) -> (Arg, Arg) {
    let (kind, slope) = match activation {
        Activation::Identity => (0, 0.0),
        Activation::Relu => (1, 0.0),
        Activation::LeakyRelu { negative_slope } => (2, negative_slope),
        Activation::Gelu => (3, 0.0),
        Activation::GeluTanh => (4, 0.0),
        Activation::Tanh => (5, 0.0),
        Activation::Sigmoid => (6, 0.0),
    };
    (Arg::I32(kind), Arg::F32(slope))
}

struct Bound<'a>(&'a BoundLaunch<CudaSlice>);

impl Bound<'_> {
    fn slice(&self, index: usize) -> Result<CudaSlice, LaunchError> {
        self.0
            .bindings
            .get(index)
            .copied()
            .ok_or_else(|| malformed(&format!("{} has no binding {index}", self.0.kernel.name())))
    }

    fn pointer(&self, index: usize) -> Result<Arg, LaunchError> {
        Ok(Arg::Pointer(self.slice(index)?.address))
    }

    /// params, grads and the two moments from binding `first_state`.
    fn lamb_buffers(&self, first_state: usize) -> Result<LambBuffers, LaunchError> {
        Ok(LambBuffers {
            params: self.slice(0)?,
            grads: self.slice(1)?,
            exp_avg: self.slice(first_state)?,
            exp_avg_sq: self.slice(first_state + 1)?,
        })
    }

    fn floats(&self, index: usize) -> Result<u64, LaunchError> {
        Ok(self.slice(index)?.floats())
    }

    /// The element count every binding of `indices` shares.
    fn same_floats(&self, indices: &[usize]) -> Result<u64, LaunchError> {
        let first = self.floats(indices.first().copied().unwrap_or(0))?;
        for &index in indices {
            if self.floats(index)? != first {
                return Err(refused(&format!(
                    "{}: bindings differ in length",
                    self.0.kernel.name()
                )));
            }
        }
        Ok(first)
    }
}

fn malformed(message: &str) -> LaunchError {
    LaunchError::Fault(KernelFault::Malformed(message.to_string()))
}

fn refused(message: &str) -> LaunchError {
    LaunchError::Refused(ServerError::InvalidArgument {
        message: message.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_tiles_cover_edge_rows_and_columns() {
        assert_eq!(gemm_tiles(64, 64, 64), Some(1));
        assert_eq!(gemm_tiles(65, 64, 64), Some(2));
        assert_eq!(gemm_tiles(1, 1, 64), Some(1));
        assert_eq!(gemm_tiles(129, 200, 64), Some(3 * 4));
        assert_eq!(gemm_tiles(129, 200, 128), Some(2 * 2));
        assert_eq!(gemm_tiles(0, 100, 64), Some(0));
        assert_eq!(gemm_tiles(100, 0, 64), Some(0));
        assert_eq!(gemm_tiles(u64::MAX, u64::MAX, 64), None);
    }

    #[test]
    fn products_that_fill_the_device_with_large_tiles_get_the_large_kernel() {
        assert_eq!(
            gemm_kernel(4096, 4096),
            Some(("cistern_gemm_large", 32 * 32))
        );
        assert_eq!(
            gemm_kernel(2048, 1024),
            Some(("cistern_gemm_large", 16 * 8))
        );
        // The MLP's products at batch 256: 64×64 tiles spread them further.
        assert_eq!(gemm_kernel(256, 1024), Some(("cistern_gemm", 4 * 16)));
        assert_eq!(gemm_kernel(1024, 1024), Some(("cistern_gemm", 16 * 16)));
        assert_eq!(gemm_kernel(0, 10), Some(("cistern_gemm", 0)));
        assert_eq!(gemm_kernel(u64::MAX, u64::MAX), None);
    }

    #[test]
    fn a_grid_has_at_least_one_block_and_at_most_the_cap() {
        assert_eq!(grid_of(0), 1);
        assert_eq!(grid_of(5), 5);
        assert_eq!(grid_of(u64::MAX), MAX_GRID as u32);
        // 8192×8192 needs more tiles than the cap: the kernel strides.
        let tiles = gemm_tiles(8192, 8192, GEMM_TILE).unwrap();
        assert!(tiles > MAX_GRID);
        assert_eq!(grid_of(tiles), MAX_GRID as u32);
    }

    #[test]
    fn every_argument_sits_in_the_low_bytes_of_its_slot() {
        assert_eq!(Arg::F32(1.0).slot(), 0x3f80_0000);
        assert_eq!(Arg::F64(1.0).slot(), 0x3ff0_0000_0000_0000);
        assert_eq!(Arg::I32(-1).slot(), 0xffff_ffff);
        assert_eq!(Arg::U32(7).slot(), 7);
        assert_eq!(Arg::Pointer(0xdead_beef).slot(), 0xdead_beef);
    }
}
