//! Kernel launches as the server receives them: which kernel, what it binds,
//! and its arguments.
//!
//! Each kernel declares its signature (the access of each binding, its
//! element size, its argument kind), so the server checks every launch the
//! same way before anything runs. New kernels add a variant here, a size
//! rule in `server/validate.rs` and a body in each backend.
//!
//! How a launch fails, and what poisons:
//! - a malformed binding (count, bounds, alignment, size, aliasing of a
//!   written range) is `InvalidProgram`, an invalid argument value (an
//!   optimizer config field, the step count, a segment table) is
//!   `InvalidArgument`; both are refused before anything runs;
//! - a kernel that refuses its data while running (LAMB's non-finite
//!   norms) changed nothing: its owner gets `InvalidArgument` through the
//!   launch's token and the stream's latch, and the context stays active;
//! - only a trap, a panic inside a kernel or a sticky device status poisons
//!   the context.

use cistern_kernels::{Activation, GemmSpec, KernelId};
use serde::{Deserialize, Serialize};

use crate::command::BufferRef;
use crate::optimizer::{OptimizerArgs, SegmentTable};

/// A kernel every backend provides. New variants go last (serialized by position).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kernel {
    /// Writes `KernelArgs::Fill { value }` to every `f32` of its one binding.
    Fill,
    /// Copies its first binding's bytes to its second.
    Copy,
    /// Copies `f32`s from its first binding to its second (the recovery probe's kernel).
    Identity,
    /// Does nothing but count one run on the device (benchmarks prove it ran).
    Empty,
    /// Faults on the device, as a hardware trap does: poisons the context (tests).
    Trap,
    /// `x ← factor·x` over its one binding.
    Scale,
    /// In-place axpy `a ← a + alpha·c`: bindings `a` (written), `c`.
    Axpy,
    /// `out ← a + b`: bindings `a`, `b`, `out`.
    Add,
    /// `out ← a ⊙ b`: bindings `a`, `b`, `out`.
    Mul,
    /// `y ← act(x)`: bindings `x`, `y`.
    ActivationForward,
    /// `grad_in ← grad_out · act'(x)`: bindings `x`, `grad_out`, `grad_in`.
    ActivationBackward,
    /// `C ← act(op(A)·op(B) + bias)`: bindings `a`, `b`, `bias` (when the
    /// arguments say so), `c`.
    Gemm,
    /// Column sums of a row-major matrix (bias gradient): bindings `x`, `out`.
    ColumnSum,
    /// Mean squared error into one `f32`: bindings `pred`, `target`, `out`.
    MseLoss,
    /// Gradient of the MSE loss: bindings `pred`, `target`, `grad`.
    MseLossBackward,
    /// Per-segment sums: bindings `x`, `out` (one `f32` per segment).
    SegmentSum,
    /// Per-segment sums of squares: bindings `x`, `out` (one `f32` per segment).
    SegmentSumSquares,
    /// AMP: `grads ← grads·inv_scale`, setting the found-inf flag on any
    /// non-finite gradient: bindings `grads`, `found_inf` (one `f32`).
    AmpUnscale,
    /// One fused optimizer step over a segment table: bindings `params`,
    /// `grads`, `found_inf` (when AMP), then the state buffers in
    /// [`cistern_optim::StateLayout`] order.
    OptimizerStep,
}

/// How a kernel uses one binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Access {
    /// Only read.
    Read,
    /// Written (and possibly read): may not overlap any other binding.
    Write,
}

use Access::{Read as R, Write as W};

/// Optimizer bindings: params, grads, then up to three state buffers; the
/// AMP form reads the flag after the grads.
const OPTIMIZER: [Access; 5] = [W, R, W, W, W];
const OPTIMIZER_AMP: [Access; 6] = [W, R, R, W, W, W];

impl Kernel {
    /// The kernel's name, as errors and traces show it.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Fill => "fill",
            Kernel::Copy => "copy",
            Kernel::Identity => "identity",
            Kernel::Empty => "empty",
            Kernel::Trap => "trap",
            Kernel::Scale => "scale",
            Kernel::Axpy => "axpy",
            Kernel::Add => "add",
            Kernel::Mul => "mul",
            Kernel::ActivationForward => "activation_forward",
            Kernel::ActivationBackward => "activation_backward",
            Kernel::Gemm => "gemm",
            Kernel::ColumnSum => "column_sum",
            Kernel::MseLoss => "mse_loss",
            Kernel::MseLossBackward => "mse_loss_backward",
            Kernel::SegmentSum => "segment_sum",
            Kernel::SegmentSumSquares => "segment_sum_squares",
            Kernel::AmpUnscale => "amp_unscale",
            Kernel::OptimizerStep => "optimizer_step",
        }
    }

    /// The access of each binding, in order, for a launch with `args` (the
    /// arguments decide the optional bindings: GEMM's bias, the optimizer's
    /// flag and state buffers).
    pub fn signature(self, args: &KernelArgs) -> &'static [Access] {
        match (self, args) {
            (Kernel::Empty | Kernel::Trap, _) => &[],
            (Kernel::Fill | Kernel::Scale, _) => &[W],
            (Kernel::Copy | Kernel::Identity | Kernel::ActivationForward, _) => &[R, W],
            (Kernel::Axpy, _) => &[W, R],
            (Kernel::Add | Kernel::Mul | Kernel::ActivationBackward, _) => &[R, R, W],
            (Kernel::Gemm, KernelArgs::Gemm { bias: true, .. }) => &[R, R, R, W],
            (Kernel::Gemm, _) => &[R, R, W],
            (Kernel::ColumnSum | Kernel::SegmentSum | Kernel::SegmentSumSquares, _) => &[R, W],
            (Kernel::MseLoss | Kernel::MseLossBackward, _) => &[R, R, W],
            (Kernel::AmpUnscale, _) => &[W, W],
            (Kernel::OptimizerStep, KernelArgs::OptimizerStep(step)) => {
                let state = step.config.state_layout().len();
                if step.found_inf {
                    &OPTIMIZER_AMP[..(3 + state).min(OPTIMIZER_AMP.len())]
                } else {
                    &OPTIMIZER[..(2 + state).min(OPTIMIZER.len())]
                }
            }
            (Kernel::OptimizerStep, _) => &[],
        }
    }

    /// Bytes per element: every binding's offset and size are multiples of it.
    pub fn element_size(self) -> u64 {
        match self {
            Kernel::Copy | Kernel::Empty | Kernel::Trap => 1,
            _ => 4,
        }
    }

    /// Whether `args` are the kind of arguments this kernel takes.
    pub fn accepts(self, args: &KernelArgs) -> bool {
        matches!(
            (self, args),
            (Kernel::Fill, KernelArgs::Fill { .. })
                | (Kernel::Scale, KernelArgs::Scale { .. })
                | (Kernel::Axpy, KernelArgs::Axpy { .. })
                | (
                    Kernel::ActivationForward | Kernel::ActivationBackward,
                    KernelArgs::Activation { .. }
                )
                | (Kernel::Gemm, KernelArgs::Gemm { .. })
                | (Kernel::ColumnSum, KernelArgs::ColumnSum { .. })
                | (Kernel::MseLossBackward, KernelArgs::MseLossBackward { .. })
                | (
                    Kernel::SegmentSum | Kernel::SegmentSumSquares,
                    KernelArgs::Segments { .. }
                )
                | (Kernel::AmpUnscale, KernelArgs::AmpUnscale { .. })
                | (Kernel::OptimizerStep, KernelArgs::OptimizerStep(_))
                | (
                    Kernel::Copy
                        | Kernel::Identity
                        | Kernel::Empty
                        | Kernel::Trap
                        | Kernel::Add
                        | Kernel::Mul
                        | Kernel::MseLoss,
                    KernelArgs::None
                )
        )
    }
}

/// A kernel's scalar arguments, typed per kernel family.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum KernelArgs {
    /// No arguments.
    None,
    /// The value `Fill` writes.
    Fill {
        /// The value.
        value: f32,
    },
    /// `Scale`'s factor.
    Scale {
        /// The factor.
        factor: f32,
    },
    /// `Axpy`'s scalar.
    Axpy {
        /// The multiple of `c` added to `a`.
        alpha: f32,
    },
    /// The activation of `ActivationForward` / `ActivationBackward`.
    Activation {
        /// The activation.
        activation: Activation,
    },
    /// GEMM's shape, transposes and epilogue.
    Gemm {
        /// Shape, transposes, activation (boxed: the widest arguments, and
        /// every launch command is as wide as they are).
        spec: Box<GemmSpec>,
        /// Whether a bias binding (of `n` elements) comes before `c`.
        bias: bool,
    },
    /// `ColumnSum`'s matrix shape.
    ColumnSum {
        /// Rows of the row-major matrix.
        rows: u64,
        /// Columns (the output's length).
        cols: u64,
    },
    /// The upstream gradient of the MSE loss (1 for the loss itself).
    MseLossBackward {
        /// `∂L/∂loss`.
        grad_output: f32,
    },
    /// The segment table of a per-segment reduction.
    Segments {
        /// One segment per output element.
        segments: SegmentTable,
    },
    /// `AmpUnscale`'s factor, `1 / loss scale`.
    AmpUnscale {
        /// The factor.
        inv_scale: f32,
    },
    /// An optimizer step's config, step count and segment table (boxed:
    /// wide, and rare next to element-wise launches).
    OptimizerStep(Box<OptimizerArgs>),
}

/// A byte range of an allocation that a kernel binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Binding {
    /// The allocation.
    pub buffer: BufferRef,
    /// First byte bound, from the allocation's start.
    pub offset: u64,
    /// Bytes bound.
    pub size: u64,
}

/// One kernel call: the server checks it (bindings against the kernel's
/// signature, sizes, alignment, aliasing, arguments) before anything runs,
/// and answers `InvalidProgram` for malformed bindings, `InvalidArgument`
/// for invalid arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelLaunch {
    /// The kernel.
    pub kernel: Kernel,
    /// Its bindings, in the order of its signature.
    pub bindings: Vec<Binding>,
    /// Its arguments.
    pub args: KernelArgs,
}

impl KernelLaunch {
    fn new(kernel: Kernel, bindings: Vec<Binding>, args: KernelArgs) -> Self {
        KernelLaunch {
            kernel,
            bindings,
            args,
        }
    }

    /// The access of each binding this launch must have.
    pub fn signature(&self) -> &'static [Access] {
        self.kernel.signature(&self.args)
    }

    /// The `cistern-kernels` catalogue entry this launch runs.
    pub fn id(&self) -> KernelId {
        match (self.kernel, &self.args) {
            (Kernel::Fill, _) => KernelId::Fill,
            (Kernel::Copy, _) => KernelId::Copy,
            (Kernel::Identity, _) => KernelId::Identity,
            (Kernel::Empty, _) => KernelId::Empty,
            (Kernel::Trap, _) => KernelId::Trap,
            (Kernel::Scale, _) => KernelId::Scale,
            (Kernel::Axpy, _) => KernelId::Axpy,
            (Kernel::Add, _) => KernelId::Add,
            (Kernel::Mul, _) => KernelId::Mul,
            (Kernel::ActivationForward, KernelArgs::Activation { activation }) => {
                activation_id(*activation, true)
            }
            (Kernel::ActivationBackward, KernelArgs::Activation { activation }) => {
                activation_id(*activation, false)
            }
            (Kernel::ActivationForward | Kernel::ActivationBackward, _) => KernelId::Identity,
            (Kernel::Gemm, _) => KernelId::Gemm,
            (Kernel::ColumnSum, _) => KernelId::ColumnSum,
            (Kernel::MseLoss, _) => KernelId::MseLoss,
            (Kernel::MseLossBackward, _) => KernelId::MseLossBackward,
            (Kernel::SegmentSum, _) => KernelId::SegmentSum,
            (Kernel::SegmentSumSquares, _) => KernelId::SegmentSumSquares,
            (Kernel::AmpUnscale, _) => KernelId::AmpUnscale,
            (Kernel::OptimizerStep, KernelArgs::OptimizerStep(step)) => step.kernel_id(),
            (Kernel::OptimizerStep, _) => KernelId::AdamStep,
        }
    }

    /// `Fill`: every `f32` of `target` becomes `value`.
    pub fn fill(target: Binding, value: f32) -> Self {
        Self::new(Kernel::Fill, vec![target], KernelArgs::Fill { value })
    }

    /// `Copy`: `source`'s bytes to `target`.
    pub fn copy(source: Binding, target: Binding) -> Self {
        Self::new(Kernel::Copy, vec![source, target], KernelArgs::None)
    }

    /// `Identity`: `source`'s `f32`s to `target`.
    pub fn identity(source: Binding, target: Binding) -> Self {
        Self::new(Kernel::Identity, vec![source, target], KernelArgs::None)
    }

    /// `Empty`: a launch that does nothing but count one run.
    pub fn empty() -> Self {
        Self::new(Kernel::Empty, Vec::new(), KernelArgs::None)
    }

    /// `Trap`: a launch that faults on the device and poisons its context.
    pub fn trap() -> Self {
        Self::new(Kernel::Trap, Vec::new(), KernelArgs::None)
    }

    /// `Scale`: `x ← factor·x`.
    pub fn scale(x: Binding, factor: f32) -> Self {
        Self::new(Kernel::Scale, vec![x], KernelArgs::Scale { factor })
    }

    /// `Axpy`: `a ← a + alpha·c` (equal sizes).
    pub fn axpy(a: Binding, alpha: f32, c: Binding) -> Self {
        Self::new(Kernel::Axpy, vec![a, c], KernelArgs::Axpy { alpha })
    }

    /// `Add`: `out ← a + b` (equal sizes).
    pub fn add(a: Binding, b: Binding, out: Binding) -> Self {
        Self::new(Kernel::Add, vec![a, b, out], KernelArgs::None)
    }

    /// `Mul`: `out ← a ⊙ b` (equal sizes).
    pub fn mul(a: Binding, b: Binding, out: Binding) -> Self {
        Self::new(Kernel::Mul, vec![a, b, out], KernelArgs::None)
    }

    /// `ActivationForward`: `y ← act(x)` (equal sizes).
    pub fn activation_forward(activation: Activation, x: Binding, y: Binding) -> Self {
        let args = KernelArgs::Activation { activation };
        Self::new(Kernel::ActivationForward, vec![x, y], args)
    }

    /// `ActivationBackward`: `grad_in ← grad_out · act'(x)` (equal sizes).
    pub fn activation_backward(
        activation: Activation,
        x: Binding,
        grad_out: Binding,
        grad_in: Binding,
    ) -> Self {
        let args = KernelArgs::Activation { activation };
        Self::new(Kernel::ActivationBackward, vec![x, grad_out, grad_in], args)
    }

    /// `Gemm`: `c ← act(op(a)·op(b) + bias)` as `spec` describes.
    pub fn gemm(spec: GemmSpec, a: Binding, b: Binding, bias: Option<Binding>, c: Binding) -> Self {
        let args = KernelArgs::Gemm {
            spec: Box::new(spec),
            bias: bias.is_some(),
        };
        let bindings = match bias {
            Some(bias) => vec![a, b, bias, c],
            None => vec![a, b, c],
        };
        Self::new(Kernel::Gemm, bindings, args)
    }

    /// `ColumnSum`: `out[j] ← Σ_i x[i][j]` over a `rows×cols` matrix.
    pub fn column_sum(x: Binding, rows: u64, cols: u64, out: Binding) -> Self {
        let args = KernelArgs::ColumnSum { rows, cols };
        Self::new(Kernel::ColumnSum, vec![x, out], args)
    }

    /// `MseLoss`: `out[0] ← Σ (pred − target)² / n`.
    pub fn mse_loss(pred: Binding, target: Binding, out: Binding) -> Self {
        Self::new(Kernel::MseLoss, vec![pred, target, out], KernelArgs::None)
    }

    /// `MseLossBackward`: `grad ← grad_output · 2(pred − target) / n`.
    pub fn mse_loss_backward(
        pred: Binding,
        target: Binding,
        grad_output: f32,
        grad: Binding,
    ) -> Self {
        let args = KernelArgs::MseLossBackward { grad_output };
        Self::new(Kernel::MseLossBackward, vec![pred, target, grad], args)
    }

    /// `SegmentSum`: `out[s] ← Σ x[segment s]`.
    pub fn segment_sum(x: Binding, segments: impl Into<SegmentTable>, out: Binding) -> Self {
        let args = KernelArgs::Segments {
            segments: segments.into(),
        };
        Self::new(Kernel::SegmentSum, vec![x, out], args)
    }

    /// `SegmentSumSquares`: `out[s] ← Σ x[segment s]²`.
    pub fn segment_sum_squares(
        x: Binding,
        segments: impl Into<SegmentTable>,
        out: Binding,
    ) -> Self {
        let args = KernelArgs::Segments {
            segments: segments.into(),
        };
        Self::new(Kernel::SegmentSumSquares, vec![x, out], args)
    }

    /// `AmpUnscale`: `grads ← grads·inv_scale`; sets `found_inf` (one `f32`)
    /// to 1 on a non-finite gradient and never clears it.
    pub fn amp_unscale(grads: Binding, inv_scale: f32, found_inf: Binding) -> Self {
        let args = KernelArgs::AmpUnscale { inv_scale };
        Self::new(Kernel::AmpUnscale, vec![grads, found_inf], args)
    }
}

fn activation_id(activation: Activation, forward: bool) -> KernelId {
    let (f, b) = match activation {
        Activation::Identity => (KernelId::Identity, KernelId::Identity),
        Activation::Relu => (KernelId::ReluForward, KernelId::ReluBackward),
        Activation::LeakyRelu { .. } => (KernelId::LeakyReluForward, KernelId::LeakyReluBackward),
        Activation::Gelu => (KernelId::GeluForward, KernelId::GeluBackward),
        Activation::GeluTanh => (KernelId::GeluTanhForward, KernelId::GeluTanhBackward),
        Activation::Tanh => (KernelId::TanhForward, KernelId::TanhBackward),
        Activation::Sigmoid => (KernelId::SigmoidForward, KernelId::SigmoidBackward),
    };
    if forward { f } else { b }
}

#[cfg(test)]
mod tests {
    use cistern_kernels::Segment;
    use cistern_memory::AllocationId;
    use cistern_optim::{AdamConfig, OptimizerConfig, SgdConfig};

    use super::*;
    use crate::ServerId;
    use crate::optimizer::OptimizerStep;

    fn binding() -> Binding {
        Binding {
            buffer: BufferRef {
                server: ServerId(0),
                id: AllocationId(0),
                generation: 0,
            },
            offset: 0,
            size: 4,
        }
    }

    fn one_launch_per_kernel() -> Vec<KernelLaunch> {
        let b = binding();
        let mut launches = vec![
            KernelLaunch::fill(b, 1.0),
            KernelLaunch::copy(b, b),
            KernelLaunch::identity(b, b),
            KernelLaunch::empty(),
            KernelLaunch::trap(),
            KernelLaunch::scale(b, 2.0),
            KernelLaunch::axpy(b, 2.0, b),
            KernelLaunch::add(b, b, b),
            KernelLaunch::mul(b, b, b),
            KernelLaunch::gemm(GemmSpec::default(), b, b, Some(b), b),
            KernelLaunch::column_sum(b, 1, 1, b),
            KernelLaunch::mse_loss(b, b, b),
            KernelLaunch::mse_loss_backward(b, b, 1.0, b),
            KernelLaunch::segment_sum(b, vec![Segment::new(0, 1)], b),
            KernelLaunch::segment_sum_squares(b, vec![Segment::new(0, 1)], b),
            KernelLaunch::amp_unscale(b, 0.5, b),
        ];
        for activation in [
            Activation::Relu,
            Activation::LeakyRelu {
                negative_slope: 0.1,
            },
            Activation::Gelu,
            Activation::GeluTanh,
            Activation::Tanh,
            Activation::Sigmoid,
        ] {
            launches.push(KernelLaunch::activation_forward(activation, b, b));
            launches.push(KernelLaunch::activation_backward(activation, b, b, b));
        }
        for config in [
            OptimizerConfig::Sgd(SgdConfig::default()),
            OptimizerConfig::Adam(AdamConfig::default()),
            OptimizerConfig::AdamW(Default::default()),
            OptimizerConfig::RmsProp(Default::default()),
            OptimizerConfig::Adagrad(Default::default()),
            OptimizerConfig::Lamb(Default::default()),
        ] {
            let state = vec![b; config.state_layout().len()];
            launches.push(OptimizerStep::new(config, 1, vec![], b, b, state).into_launch());
        }
        launches
    }

    #[test]
    fn every_catalogue_kernel_is_reachable_by_a_launch() {
        let reached: Vec<KernelId> = one_launch_per_kernel().iter().map(|l| l.id()).collect();
        for id in KernelId::ALL {
            assert!(reached.contains(id), "{} has no launch", id.name());
        }
    }

    #[test]
    fn every_constructor_matches_its_kernels_signature_and_arguments() {
        for launch in one_launch_per_kernel() {
            assert!(launch.kernel.accepts(&launch.args), "{launch:?}");
            assert_eq!(
                launch.signature().len(),
                launch.bindings.len(),
                "{launch:?}"
            );
        }
    }

    #[test]
    fn the_amp_optimizer_step_reads_its_flag_after_the_gradients() {
        let b = binding();
        let config = OptimizerConfig::Adam(AdamConfig {
            amsgrad: true,
            ..Default::default()
        });
        let launch = OptimizerStep::new(config, 1, vec![], b, b, vec![b; 3])
            .with_found_inf(b)
            .into_launch();
        assert_eq!(launch.signature(), &[W, R, R, W, W, W]);
        assert_eq!(launch.bindings.len(), 6);
    }
}
