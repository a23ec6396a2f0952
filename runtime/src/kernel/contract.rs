//! Every kernel's contract in one place: its name, catalogue id, binding
//! signature, element size and shape rule, one match arm per kernel.
//!
//! The server checks each launch against its contract before anything runs
//! (`server/validate.rs` applies the rules); backends trust it.

use cistern_kernels::map::{MAX_BINDINGS, MapDefinition};
use cistern_kernels::{
    Activation, AttentionSpec, BatchedGemmSpec, BroadcastSpec, ClassInput, ClassLossSpec,
    DropoutSpec, EmbeddingSpec, GatherSpec, GemmSpec, KernelId, LayerNormSpec, MapOp, MaxDimSpec,
    SumSpec,
};
use cistern_optim::validate_segments;
use serde::{Deserialize, Serialize};

use super::Kernel;
use crate::error::ServerError;
use crate::optimizer::{OptimizerArgs, SegmentTable, optimizer_error};

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
/// The counted form: params, grads, the flag, the count, then the state.
const OPTIMIZER_COUNTED: [Access; 7] = [W, R, R, W, W, W, W];

/// Bytes of one `f32`, the element of every numeric kernel.
const F32: u64 = 4;

/// What the server knows of a kernel to check a launch of it.
#[derive(Clone, Copy, Debug)]
pub struct Contract<'a> {
    /// The name errors and traces show.
    pub name: &'static str,
    /// The `cistern-kernels` catalogue entry it runs.
    pub id: KernelId,
    /// The access of each binding, in order; its length is the binding count.
    pub signature: &'static [Access],
    /// Bytes per element: every binding's offset and size are multiples of it.
    pub element_size: u64,
    /// How the bindings' lengths relate to each other and the arguments.
    pub shape: ShapeRule<'a>,
}

/// A rule over a launch's binding lengths (in elements) and argument values.
#[derive(Clone, Copy, Debug)]
pub enum ShapeRule<'a> {
    /// Any lengths.
    Any,
    /// Every binding has the same length.
    Equal,
    /// An element-wise kernel: every binding of one length, and the
    /// scalars its definition names.
    Map {
        /// The kernel.
        op: MapOp,
        /// How many scalars the launch gives.
        scalars: usize,
    },
    /// `pred` and `target` of one non-zero length, `out` of one element.
    MeanOfPairs,
    /// `a` is `m×k`, `b` is `k×n`, the bias `n`, `c` is `m×n`.
    Product {
        /// Shape and transposes.
        spec: &'a GemmSpec,
        /// Whether the third binding is a bias.
        bias: bool,
    },
    /// `x` is `rows×cols`, `out` is `cols`.
    Columns {
        /// Rows of `x`.
        rows: u64,
        /// Columns of `x`.
        cols: u64,
    },
    /// A valid segment table over `x`; one output per segment.
    Segments {
        /// The table.
        segments: &'a SegmentTable,
    },
    /// A one-element found-inf flag after the gradients.
    Flag,
    /// A valid optimizer step: config, step count, and every buffer as long
    /// as the parameters (the flag: one element).
    Step {
        /// The step's arguments.
        step: &'a OptimizerArgs,
    },
    /// Every binding from `first` on holds one element.
    Scalars {
        /// The first one-element binding.
        first: usize,
    },
    /// A valid optimizer step with its count on the device: config, and
    /// every buffer as long as the parameters but the flag and the count
    /// (one element each).
    CountedStep {
        /// The step's arguments (`step` and `found_inf` unused).
        step: &'a OptimizerArgs,
    },
    /// Every binding is a `rows×cols` matrix.
    Rows {
        /// Rows of each matrix.
        rows: u64,
        /// Columns of each matrix.
        cols: u64,
    },
    /// A class loss (or its gradient): the input `rows×classes`, the
    /// targets `rows`, the weight `classes`, the loss (or its gradient)
    /// one element or `rows`, the input's gradient `rows×classes`.
    ClassLoss {
        /// The loss's shape and options.
        spec: &'a ClassLossSpec,
        /// Whether this is the backward (a gradient binding last).
        backward: bool,
    },
    /// A broadcast binary operation: `a` and `b` hold what their strides
    /// reach, `out` the output's elements.
    Broadcast {
        /// The walk and the operation.
        spec: &'a BroadcastSpec,
    },
    /// A strided sum: `x` holds what the strides reach, `out` the output's
    /// elements.
    StridedSum {
        /// The walk and the scale.
        spec: &'a SumSpec,
    },
    /// A layer normalisation (or its backward): matrices `rows×cols`, the
    /// weight and bias `cols`, the stats `2·rows`.
    LayerNorm {
        /// The shape and options.
        spec: &'a LayerNormSpec,
        /// Whether this is the backward.
        backward: bool,
    },
    /// A batch of GEMMs: `a` and `b` hold what the offsets reach, `c` every
    /// product.
    Batched {
        /// The shape and offsets.
        spec: &'a BatchedGemmSpec,
    },
    /// Equal lengths and a valid dropout (counted: `x`, the counter of one
    /// word, `out`).
    Dropout {
        /// The seed, threshold and scale.
        spec: &'a DropoutSpec,
        /// Whether the seed's step comes from a counter binding.
        counted: bool,
    },
    /// A resident dataset's batch gather: the dataset `rows×width` and
    /// `rows×target_width`, the counter one word, the batch's `x` and `y`.
    Gather {
        /// The shape and seed.
        spec: &'a GatherSpec,
    },
    /// An embedding lookup (or its backward): the table `vocab×dim`, the
    /// indices `rows`, the rows looked up `rows×dim`.
    Embedding {
        /// The shape.
        spec: &'a EmbeddingSpec,
        /// Whether this is the backward.
        backward: bool,
    },
    /// Multi-head attention (or a half of its backward): `q` and the
    /// output `batch×queries×heads×head_dim`, `k` and `v` with `keys`
    /// positions, the weights `batch×heads×queries×keys`.
    Attention {
        /// The shape and options.
        spec: &'a AttentionSpec,
        /// The kernel: the forward or a half of the backward.
        part: AttentionPart,
    },
    /// A maximum over one dimension (or its backward): the input
    /// `outer×dim×inner`, the values and indices `outer×inner`.
    MaxDim {
        /// The shape.
        spec: &'a MaxDimSpec,
        /// Whether this is the backward.
        backward: bool,
    },
}

impl Kernel {
    /// This kernel's contract: one arm per kernel, so a kernel's facts sit together.
    pub fn contract(&self) -> Contract<'_> {
        let contract = |name, id, signature, shape| Contract {
            name,
            id,
            signature,
            element_size: F32,
            shape,
        };
        match self {
            Kernel::Map { op, scalars } => contract(
                op.name(),
                KernelId::Map(*op),
                map_signature(op.definition()),
                ShapeRule::Map {
                    op: *op,
                    scalars: scalars.given(),
                },
            ),
            Kernel::Copy => Contract {
                element_size: 1,
                ..contract("copy", KernelId::Copy, &[R, W], ShapeRule::Equal)
            },
            Kernel::Identity => contract("identity", KernelId::Identity, &[R, W], ShapeRule::Equal),
            Kernel::Empty => Contract {
                element_size: 1,
                ..contract("empty", KernelId::Empty, &[], ShapeRule::Any)
            },
            Kernel::Trap => Contract {
                element_size: 1,
                ..contract("trap", KernelId::Trap, &[], ShapeRule::Any)
            },
            Kernel::ActivationForward { activation } => contract(
                "activation_forward",
                activation_id(*activation, true),
                &[R, W],
                ShapeRule::Equal,
            ),
            Kernel::ActivationBackward { activation } => contract(
                "activation_backward",
                activation_id(*activation, false),
                &[R, R, W],
                ShapeRule::Equal,
            ),
            Kernel::Gemm { spec, bias } => contract(
                "gemm",
                KernelId::Gemm,
                if *bias { &[R, R, R, W] } else { &[R, R, W] },
                ShapeRule::Product { spec, bias: *bias },
            ),
            Kernel::ColumnSum { rows, cols } => contract(
                "column_sum",
                KernelId::ColumnSum,
                &[R, W],
                ShapeRule::Columns {
                    rows: *rows,
                    cols: *cols,
                },
            ),
            Kernel::MseLoss => contract(
                "mse_loss",
                KernelId::MseLoss,
                &[R, R, W],
                ShapeRule::MeanOfPairs,
            ),
            Kernel::SegmentSum { segments } => contract(
                "segment_sum",
                KernelId::SegmentSum,
                &[R, W],
                ShapeRule::Segments { segments },
            ),
            Kernel::SegmentSumSquares { segments } => contract(
                "segment_sum_squares",
                KernelId::SegmentSumSquares,
                &[R, W],
                ShapeRule::Segments { segments },
            ),
            Kernel::AmpUnscale { .. } => contract(
                "amp_unscale",
                KernelId::AmpUnscale,
                &[W, W],
                ShapeRule::Flag,
            ),
            Kernel::OptimizerStep(step) => contract(
                "optimizer_step",
                step.kernel_id(),
                optimizer_signature(step),
                ShapeRule::Step { step },
            ),
            Kernel::AmpUnscaleByDeviceScale => contract(
                "amp_unscale_by_device_scale",
                KernelId::AmpUnscaleByDeviceScale,
                &[W, W, R],
                ShapeRule::Scalars { first: 1 },
            ),
            Kernel::AmpUpdateScale { .. } => contract(
                "amp_update_scale",
                KernelId::AmpUpdateScale,
                &[R, W, W, W],
                ShapeRule::Scalars { first: 0 },
            ),
            Kernel::OptimizerStepCounted(step) => {
                let state = step.config.state_layout().len();
                contract(
                    "optimizer_step_counted",
                    step.kernel_id(),
                    &OPTIMIZER_COUNTED[..(4 + state).min(OPTIMIZER_COUNTED.len())],
                    ShapeRule::CountedStep { step },
                )
            }
            &Kernel::Softmax { rows, cols, log } => contract(
                if log { "log_softmax" } else { "softmax" },
                if log {
                    KernelId::LogSoftmax
                } else {
                    KernelId::Softmax
                },
                &[R, W],
                ShapeRule::Rows { rows, cols },
            ),
            &Kernel::SoftmaxBackward { rows, cols, log } => contract(
                if log {
                    "log_softmax_backward"
                } else {
                    "softmax_backward"
                },
                if log {
                    KernelId::LogSoftmaxBackward
                } else {
                    KernelId::SoftmaxBackward
                },
                &[R, R, W],
                ShapeRule::Rows { rows, cols },
            ),
            Kernel::ClassLoss(spec) => {
                let id = match spec.input {
                    ClassInput::Logits => KernelId::CrossEntropy,
                    ClassInput::LogProbabilities => KernelId::NllLoss,
                };
                let signature: &[Access] = if spec.weighted {
                    &[R, R, R, W]
                } else {
                    &[R, R, W]
                };
                let shape = ShapeRule::ClassLoss {
                    spec,
                    backward: false,
                };
                contract(id.name(), id, signature, shape)
            }
            Kernel::ClassLossBackward(spec) => {
                let id = match spec.input {
                    ClassInput::Logits => KernelId::CrossEntropyBackward,
                    ClassInput::LogProbabilities => KernelId::NllLossBackward,
                };
                let signature: &[Access] = if spec.weighted {
                    &[R, R, R, R, W]
                } else {
                    &[R, R, R, W]
                };
                let shape = ShapeRule::ClassLoss {
                    spec,
                    backward: true,
                };
                contract(id.name(), id, signature, shape)
            }
            Kernel::BroadcastBinary(spec) => contract(
                "broadcast_binary",
                KernelId::BroadcastBinary,
                &[R, R, W],
                ShapeRule::Broadcast { spec },
            ),
            Kernel::StridedSum(spec) => contract(
                "strided_sum",
                KernelId::StridedSum,
                &[R, W],
                ShapeRule::StridedSum { spec },
            ),
            Kernel::LayerNorm(spec) => contract(
                "layer_norm",
                KernelId::LayerNorm,
                if spec.affine {
                    &[R, R, R, W, W]
                } else {
                    &[R, W, W]
                },
                ShapeRule::LayerNorm {
                    spec,
                    backward: false,
                },
            ),
            Kernel::LayerNormBackward(spec) => contract(
                "layer_norm_backward",
                KernelId::LayerNormBackward,
                if spec.affine {
                    &[R, R, R, R, W, W]
                } else {
                    &[R, R, R, W, W]
                },
                ShapeRule::LayerNorm {
                    spec,
                    backward: true,
                },
            ),
            Kernel::Embedding(spec) => contract(
                "embedding",
                KernelId::Embedding,
                &[R, R, W],
                ShapeRule::Embedding {
                    spec,
                    backward: false,
                },
            ),
            Kernel::BatchedGemm(spec) => contract(
                "batched_gemm",
                KernelId::BatchedGemm,
                &[R, R, W],
                ShapeRule::Batched { spec },
            ),
            Kernel::Dropout(spec) => contract(
                "dropout",
                KernelId::Dropout,
                &[R, W],
                ShapeRule::Dropout {
                    spec,
                    counted: false,
                },
            ),
            Kernel::DropoutCounted(spec) => contract(
                "dropout_counted",
                KernelId::DropoutCounted,
                &[R, R, W],
                ShapeRule::Dropout {
                    spec,
                    counted: true,
                },
            ),
            Kernel::BatchGather(spec) => contract(
                "batch_gather",
                KernelId::BatchGather,
                &[R, R, W, W, W],
                ShapeRule::Gather { spec },
            ),
            Kernel::EmbeddingBackward(spec) => contract(
                "embedding_backward",
                KernelId::EmbeddingBackward,
                &[R, R, W],
                ShapeRule::Embedding {
                    spec,
                    backward: true,
                },
            ),
            Kernel::MaxDim(spec) => contract(
                "max_dim",
                KernelId::MaxDim,
                &[R, W, W],
                ShapeRule::MaxDim {
                    spec,
                    backward: false,
                },
            ),
            Kernel::MaxDimBackward(spec) => contract(
                "max_dim_backward",
                KernelId::MaxDimBackward,
                &[R, R, W],
                ShapeRule::MaxDim {
                    spec,
                    backward: true,
                },
            ),
            Kernel::Attention(spec) => contract(
                "attention",
                KernelId::Attention,
                &[R, R, R, W, W],
                ShapeRule::Attention {
                    spec,
                    part: AttentionPart::Forward,
                },
            ),
            Kernel::AttentionBackwardQueries(spec) => contract(
                "attention_backward_queries",
                KernelId::AttentionBackwardQueries,
                &[R, R, R, R, W, W],
                ShapeRule::Attention {
                    spec,
                    part: AttentionPart::Queries,
                },
            ),
            Kernel::AttentionBackwardKeys(spec) => contract(
                "attention_backward_keys",
                KernelId::AttentionBackwardKeys,
                &[R, R, R, R, W, W],
                ShapeRule::Attention {
                    spec,
                    part: AttentionPart::Keys,
                },
            ),
        }
    }
}

/// An element-wise kernel's bindings: read but the one it writes, which is
/// its first (in place) or its last.
fn map_signature(definition: &MapDefinition) -> &'static [Access] {
    const WRITES_LAST: [Access; MAX_BINDINGS] = [R, R, R, R, R, W];
    const WRITES_FIRST: [Access; MAX_BINDINGS] = [W, R, R, R, R, R];
    let bindings = definition.bindings().min(MAX_BINDINGS);
    if definition.in_place {
        &WRITES_FIRST[..bindings]
    } else {
        &WRITES_LAST[MAX_BINDINGS - bindings..]
    }
}

fn optimizer_signature(step: &OptimizerArgs) -> &'static [Access] {
    let state = step.config.state_layout().len();
    if step.found_inf {
        &OPTIMIZER_AMP[..(3 + state).min(OPTIMIZER_AMP.len())]
    } else {
        &OPTIMIZER[..(2 + state).min(OPTIMIZER.len())]
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

impl ShapeRule<'_> {
    /// Checks the argument values that do not depend on the bindings (an
    /// optimizer's config and step count): the server asks this first.
    pub fn check_arguments(&self) -> Result<(), ServerError> {
        if let ShapeRule::Map { op, scalars } = *self {
            let takes = op.definition().scalars;
            if scalars != takes.len() {
                return Err(ServerError::InvalidArgument {
                    message: format!(
                        "{} takes {} scalars ({}), not {scalars}",
                        op.name(),
                        takes.len(),
                        takes.join(", ")
                    ),
                });
            }
        }
        if let ShapeRule::ClassLoss { spec, .. } = self {
            return spec
                .validate()
                .map_err(|error| ServerError::InvalidArgument {
                    message: format!("class loss: {error}"),
                });
        }
        let walk = match self {
            ShapeRule::Broadcast { spec } => Some(spec.validate()),
            ShapeRule::StridedSum { spec } => Some(spec.validate()),
            ShapeRule::LayerNorm { spec, .. } => Some(spec.validate()),
            ShapeRule::Dropout { spec, .. } => Some(spec.validate()),
            ShapeRule::Gather { spec } => Some(spec.validate()),
            ShapeRule::Batched { spec } => Some(spec.validate()),
            ShapeRule::MaxDim { spec, .. } => Some(spec.validate()),
            ShapeRule::Attention { spec, .. } => Some(spec.validate()),
            _ => None,
        };
        if let Some(checked) = walk {
            return checked.map_err(|error| ServerError::InvalidArgument {
                message: error.to_string(),
            });
        }
        if let ShapeRule::CountedStep { step } = self {
            let kernel = step.kernel_id().name();
            return step
                .config
                .validate()
                .map_err(|error| optimizer_error(kernel, error));
        }
        if let ShapeRule::Step { step } = self {
            let kernel = step.kernel_id().name();
            step.config
                .validate()
                .map_err(|error| optimizer_error(kernel, error))?;
            if step.step == 0 {
                return Err(ServerError::InvalidArgument {
                    message: format!("{kernel} `step`: steps count from 1"),
                });
            }
        }
        Ok(())
    }

    /// Checks the bindings' lengths (`elements`, one per binding of a launch
    /// whose count already matches the signature) and the argument values
    /// of kernel `name`.
    pub fn check(&self, name: &str, elements: &[u64]) -> Result<(), ServerError> {
        let invalid = |message: String| ServerError::InvalidProgram {
            message: format!("{name}: {message}"),
        };
        let expect = |index: usize, expected: Option<u64>, what: &str| match expected {
            Some(expected) if elements.get(index) == Some(&expected) => Ok(()),
            Some(expected) => Err(invalid(format!(
                "binding {index} ({what}) has {} elements, expected {expected}",
                elements.get(index).copied().unwrap_or(0)
            ))),
            None => Err(invalid(format!("the size of {what} overflows"))),
        };
        // A binding read through strides holds at least what they reach.
        let reaches = |index: usize, extent: Option<u64>, what: &str| match extent {
            Some(extent) if elements.get(index).is_some_and(|&len| len >= extent) => Ok(()),
            Some(extent) => Err(invalid(format!(
                "binding {index} ({what}) has {} elements; its strides reach {extent}",
                elements.get(index).copied().unwrap_or(0)
            ))),
            None => Err(invalid(format!("the extent of {what} overflows"))),
        };
        match *self {
            ShapeRule::Any => Ok(()),
            ShapeRule::Dropout { counted: true, .. } => {
                expect(1, Some(1), "counter")?;
                expect(2, elements.first().copied(), "out")
            }
            ShapeRule::Equal | ShapeRule::Map { .. } | ShapeRule::Dropout { .. } => {
                if elements.windows(2).any(|pair| pair[0] != pair[1]) {
                    Err(invalid(format!("bindings differ in size: {elements:?}")))
                } else {
                    Ok(())
                }
            }
            ShapeRule::MeanOfPairs => {
                expect(1, elements.first().copied(), "target")?;
                expect(2, Some(1), "out")?;
                if elements.first() == Some(&0) {
                    return Err(invalid("the mean of no elements is undefined".into()));
                }
                Ok(())
            }
            ShapeRule::Product { spec, bias } => {
                let (m, n, k) = (spec.m as u64, spec.n as u64, spec.k as u64);
                expect(0, m.checked_mul(k), "a")?;
                expect(1, k.checked_mul(n), "b")?;
                if bias {
                    expect(2, Some(n), "bias")?;
                }
                expect(elements.len().saturating_sub(1), m.checked_mul(n), "c")
            }
            ShapeRule::Columns { rows, cols } => {
                expect(0, rows.checked_mul(cols), "x")?;
                expect(1, Some(cols), "out")
            }
            ShapeRule::Segments { segments } => {
                check_segments(name, segments, elements.first().copied())?;
                expect(1, Some(segments.len() as u64), "out")
            }
            ShapeRule::Flag => expect(1, Some(1), "found_inf"),
            ShapeRule::Step { step } => {
                let kernel = step.kernel_id().name();
                let params = elements.first().copied();
                let flag = usize::from(step.found_inf);
                expect(1, params, "grads")?;
                if step.found_inf {
                    expect(2, Some(1), "found_inf")?;
                }
                for index in 2 + flag..elements.len() {
                    expect(index, params, "a state buffer")?;
                }
                check_segments(kernel, &step.segments, params)
            }
            ShapeRule::Scalars { first } => {
                for index in first..elements.len() {
                    expect(index, Some(1), "a one-element binding")?;
                }
                Ok(())
            }
            ShapeRule::CountedStep { step } => {
                let kernel = step.kernel_id().name();
                let params = elements.first().copied();
                expect(1, params, "grads")?;
                expect(2, Some(1), "found_inf")?;
                expect(3, Some(1), "count")?;
                for index in 4..elements.len() {
                    expect(index, params, "a state buffer")?;
                }
                check_segments(kernel, &step.segments, params)
            }
            ShapeRule::Rows { rows, cols } => {
                for index in 0..elements.len() {
                    expect(index, rows.checked_mul(cols), "a rows×cols matrix")?;
                }
                Ok(())
            }
            ShapeRule::ClassLoss { spec, backward } => {
                let (rows, classes) = (spec.rows as u64, spec.classes as u64);
                expect(0, rows.checked_mul(classes), "input")?;
                expect(1, Some(rows), "targets")?;
                let mut next = 2;
                if spec.weighted {
                    expect(next, Some(classes), "weight")?;
                    next += 1;
                }
                let loss = spec.outputs() as u64;
                if backward {
                    expect(next, Some(loss), "grad_output")?;
                    expect(next + 1, rows.checked_mul(classes), "grad_input")
                } else {
                    expect(next, Some(loss), "out")
                }
            }
            ShapeRule::Broadcast { spec } => {
                reaches(0, spec.a_extent(), "a")?;
                reaches(1, spec.b_extent(), "b")?;
                expect(2, spec.outputs(), "out")
            }
            ShapeRule::StridedSum { spec } => {
                reaches(0, spec.extent(), "x")?;
                expect(1, spec.outputs(), "out")
            }
            ShapeRule::LayerNorm { spec, backward } => {
                let matrix = spec.elements();
                let stats = spec.rows.checked_mul(2);
                expect(0, matrix, "x")?;
                let mut next = 1;
                if spec.affine {
                    expect(1, Some(spec.cols), "weight")?;
                    next = 2;
                    if !backward {
                        expect(2, Some(spec.cols), "bias")?;
                        next = 3;
                    }
                }
                if backward {
                    expect(next, stats, "stats")?;
                    expect(next + 1, matrix, "grad_y")?;
                    expect(next + 2, matrix, "grad_x")?;
                    expect(next + 3, matrix, "weighted")
                } else {
                    expect(next, matrix, "y")?;
                    expect(next + 1, stats, "stats")
                }
            }
            ShapeRule::Batched { spec } => {
                reaches(0, spec.a_extent(), "a")?;
                reaches(1, spec.b_extent(), "b")?;
                expect(2, spec.outputs(), "c")
            }
            ShapeRule::Gather { spec } => {
                let words = |rows: u32, width: u32| Some(u64::from(rows) * u64::from(width));
                expect(0, words(spec.rows, spec.width), "features")?;
                expect(1, words(spec.rows, spec.target_width), "targets")?;
                expect(2, Some(1), "counter")?;
                expect(3, words(spec.batch, spec.width), "x")?;
                expect(4, words(spec.batch, spec.target_width), "y")
            }
            ShapeRule::Embedding { spec, backward } => {
                let (table, rows) = (spec.table(), spec.outputs());
                if backward {
                    expect(0, Some(spec.rows), "indices")?;
                    expect(1, rows, "grad_out")?;
                    expect(2, table, "grad_weight")
                } else {
                    expect(0, table, "weight")?;
                    expect(1, Some(spec.rows), "indices")?;
                    expect(2, rows, "out")
                }
            }
            ShapeRule::MaxDim { spec, backward } => {
                let (input, outputs) = (spec.inputs(), spec.outputs());
                if backward {
                    expect(0, outputs, "indices")?;
                    expect(1, outputs, "grad_out")?;
                    expect(2, input, "grad_x")
                } else {
                    expect(0, input, "x")?;
                    expect(1, outputs, "values")?;
                    expect(2, outputs, "indices")
                }
            }
            ShapeRule::Attention { spec, part } => {
                let (queries, keys, weights) =
                    (spec.query_elements(), spec.key_elements(), spec.weights());
                let expected: [(Option<u64>, &str); 6] = match part {
                    AttentionPart::Forward => [
                        (queries, "q"),
                        (keys, "k"),
                        (keys, "v"),
                        (queries, "out"),
                        (weights, "weights"),
                        (None, ""),
                    ],
                    AttentionPart::Queries => [
                        (keys, "k"),
                        (keys, "v"),
                        (weights, "weights"),
                        (queries, "grad_out"),
                        (weights, "grad_scores"),
                        (queries, "grad_q"),
                    ],
                    AttentionPart::Keys => [
                        (queries, "q"),
                        (weights, "weights"),
                        (queries, "grad_out"),
                        (weights, "grad_scores"),
                        (keys, "grad_k"),
                        (keys, "grad_v"),
                    ],
                };
                for (index, (elements, name)) in expected.into_iter().enumerate() {
                    if !name.is_empty() {
                        expect(index, elements, name)?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Checks a segment table against a buffer of `total` elements.
fn check_segments(
    kernel: &str,
    segments: &[cistern_optim::Segment],
    total: Option<u64>,
) -> Result<(), ServerError> {
    let total = total
        .and_then(|total| usize::try_from(total).ok())
        .unwrap_or(0);
    validate_segments(segments, total).map_err(|error| optimizer_error(kernel, error))
}

/// Which of the attention kernels a contract is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPart {
    /// The forward.
    Forward,
    /// The backward's half per query row.
    Queries,
    /// The backward's half per key row.
    Keys,
}
