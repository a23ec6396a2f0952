//! The gradient rule of each operation: given a value's gradient, the
//! kernels that make its reached inputs' contributions. Shapes were checked
//! when the operation was recorded.

use cistern_runtime::{Activation, Binding, GemmSpec, KernelLaunch};

use super::attention::Mask;
use super::backward::Grad;
use super::node::{Node, Op, VarIndex};
use super::sinks::Sinks;
use super::tape::Tape;
use super::view_rules::Side;
use crate::compute::Buffer;
use crate::error::AutodiffError;

/// Contributions to inputs' gradients, in the order computed.
pub(super) type Contributions = Vec<(VarIndex, Grad)>;

impl Tape {
    /// The contributions value `index`'s operation makes, given the
    /// value's gradient, to each input in `reached`.
    pub(super) fn input_gradients(
        &self,
        index: VarIndex,
        grad: &Grad,
        reached: &[bool],
        sinks: &mut Sinks,
    ) -> Result<Contributions, AutodiffError> {
        let (op, value, shape) = self.with_node(index, |node| {
            (node.op.clone(), node.value.clone(), node.shape.clone())
        });
        let len: usize = shape.iter().product();
        let reached = |input: &VarIndex| reached.get(*input).copied().unwrap_or(false);
        let mut out = Contributions::new();
        match op {
            Op::Leaf => {}
            Op::MatMul { a, b } => {
                let reached = |input: VarIndex| reached(&input);
                out.extend(self.matmul_gradients((a, b), grad, reached, sinks)?);
            }
            Op::Linear {
                input,
                weight,
                bias,
                activation,
                layout,
                pre_activation,
            } => {
                let g = self.materialize(grad, len)?;
                let at = pre_activation.unwrap_or(value);
                let g = self.activation_gradient(activation, &at, g, len)?;
                let ((input_value, input_shape), weight_value) =
                    (self.value_and_shape(input), self.value_of(weight));
                let (m, k, n) = (input_shape[0], input_shape[1], shape[1]);
                if reached(&weight) {
                    // ∂weight = gᵀ·input ([out, in]) or inputᵀ·g ([in, out]).
                    let (spec, a, b) = layout.weight_gradient((m, n, k), &g, &input_value);
                    let grad = self.gemm_for(weight, spec, a, b, n * k, sinks)?;
                    out.push((weight, Grad::Device(grad)));
                }
                if let Some(bias) = bias.filter(reached) {
                    let (rows, cols) = (m as u64, n as u64);
                    let sums = self.gradient_of(bias, n, sinks, |sums| {
                        KernelLaunch::column_sum(g.whole(), rows, cols, sums)
                    })?;
                    out.push((bias, Grad::Device(sums)));
                }
                if reached(&input) {
                    // ∂input = g·weight, through the layout (m×k); skipped
                    // for an untracked input.
                    let spec = layout.input_gradient(m, n, k);
                    let grad = self.gemm(spec, &g, &weight_value, m * k)?;
                    out.push((input, Grad::Device(grad)));
                }
            }
            Op::Activation { input, activation } => {
                if activation == Activation::Identity {
                    out.push((input, grad.clone()));
                } else if reached(&input) {
                    let g = self.materialize(grad, len)?;
                    let x = self.value_of(input);
                    let grad = self.activation_gradient(activation, &x, g, len)?;
                    out.push((input, Grad::Device(grad)));
                }
            }
            Op::Binary { op, a, b } => {
                let sides = (self.side(a), self.side(b));
                let reached = |input: VarIndex| reached(&input);
                let at = (&value, shape.as_slice());
                out.extend(self.binary_gradients(op, sides, at, grad, reached, sinks)?);
            }
            Op::Scale { input, factor } => {
                let scaled = match grad {
                    Grad::Constant(value) => Grad::Constant(value * factor),
                    Grad::Device(g) => Grad::Device(self.scaled(g, len, factor)?),
                };
                out.push((input, scaled));
            }
            Op::Sum { input } => {
                let n = self.with_node(input, Node::len);
                out.push((input, Grad::Device(self.broadcast(grad, n, 1.0)?)));
            }
            Op::Mean { input } => {
                let n = self.with_node(input, Node::len);
                let factor = 1.0 / n as f32;
                out.push((input, Grad::Device(self.broadcast(grad, n, factor)?)));
            }
            Op::MseLoss { pred, target } => {
                let n = self.with_node(pred, Node::len);
                let (pred_value, target_value) = (self.value_of(pred), self.value_of(target));
                if reached(&pred) {
                    let g = self.mse_gradient(&pred_value, &target_value, grad, n)?;
                    out.push((pred, Grad::Device(g)));
                }
                if reached(&target) {
                    // ∂target = −∂pred: the same kernel with the roles swapped.
                    let g = self.mse_gradient(&target_value, &pred_value, grad, n)?;
                    out.push((target, Grad::Device(g)));
                }
            }
            Op::Softmax {
                input,
                rows,
                cols,
                log,
            } => {
                if reached(&input) {
                    let g = self.softmax_gradient(&value, grad, (rows, cols, log))?;
                    out.push((input, Grad::Device(g)));
                }
            }
            Op::ClassLoss { input, record } => {
                if reached(&input) {
                    let g = self.class_loss_gradient(&self.value_of(input), grad, &record)?;
                    out.push((input, Grad::Device(g)));
                }
            }
            Op::BceWithLogits { input, record } => {
                if reached(&input) {
                    let n = self.with_node(input, Node::len);
                    let g = self.bce_gradient(&self.value_of(input), grad, &record, n)?;
                    out.push((input, Grad::Device(g)));
                }
            }
            Op::SumDims { input, dims, mean } => {
                if reached(&input) {
                    let input_shape = self.with_node(input, |node| node.shape.clone());
                    let count: usize = dims.iter().map(|&d| input_shape[d]).product();
                    let scale = if mean { 1.0 / count as f32 } else { 1.0 };
                    let at = (input, input_shape.as_slice());
                    let g = self.sum_dims_gradient(at, &dims, scale, grad, sinks)?;
                    out.push((input, Grad::Device(g)));
                }
            }
            Op::Reshape { input } => out.push((input, grad.clone())),
            Op::LayerNorm {
                input,
                weight,
                bias,
                record,
            } => {
                let reached = |input: VarIndex| reached(&input);
                let inputs = (input, weight, bias);
                out.extend(self.layer_norm_gradients(inputs, &record, grad, reached, sinks)?);
            }
            Op::Attention { q, k, v, record } => {
                let reached = |input: VarIndex| reached(&input);
                out.extend(self.attention_gradients([q, k, v], &record, grad, reached)?);
            }
            Op::Narrow { input, start } => {
                if reached(&input) {
                    let g = self.narrow_gradient(input, start, grad, len)?;
                    out.push((input, Grad::Device(g)));
                }
            }
            Op::Cat { inputs } => {
                let reached = |input: VarIndex| reached(&input);
                out.extend(self.cat_gradients(&inputs, grad, len, reached)?);
            }
            Op::Dropout {
                input,
                spec,
                counter,
            } => {
                if reached(&input) {
                    let mask = Mask { spec, counter };
                    let g = self.dropout_gradient(input, &mask, grad, len, sinks)?;
                    out.push((input, g));
                }
            }
            Op::Embedding { weight, record } => {
                if reached(&weight) {
                    let g = self.embedding_gradient(weight, &record, grad, sinks)?;
                    out.push((weight, Grad::Device(g)));
                }
            }
            Op::MaxDim {
                input,
                spec,
                indices,
            } => {
                if reached(&input) {
                    let g = self.max_dim_gradient(input, spec, &indices, grad, sinks)?;
                    out.push((input, Grad::Device(g)));
                }
            }
            Op::Permute { input, order } => {
                if reached(&input) {
                    let g = self.permute_gradient(input, &order, &shape, grad, sinks)?;
                    out.push((input, Grad::Device(g)));
                }
            }
        }
        out.retain(|(input, _)| reached(input));
        Ok(out)
    }

    /// Value `index`'s index, buffer and shape.
    fn side(&self, index: VarIndex) -> Side {
        let (value, shape) = self.value_and_shape(index);
        (index, value, shape)
    }

    fn value_of(&self, index: VarIndex) -> Buffer {
        self.with_node(index, |node| node.value.clone())
    }

    fn value_and_shape(&self, index: VarIndex) -> (Buffer, Vec<usize>) {
        self.with_node(index, |node| (node.value.clone(), node.shape.clone()))
    }

    /// The gradient of `input` (`len` elements), `op(a)·op(b)` as `spec`
    /// says (see [`gradient_of`](Self::gradient_of)).
    fn gemm_for(
        &self,
        input: VarIndex,
        spec: GemmSpec,
        a: &Buffer,
        b: &Buffer,
        len: usize,
        sinks: &mut Sinks,
    ) -> Result<Buffer, AutodiffError> {
        self.gradient_of(input, len, sinks, |out| {
            KernelLaunch::gemm(spec, a.whole(), b.whole(), None, out)
        })
    }

    /// The gradient of `input` (`len` elements), which the launch `make`
    /// builds around its output writes: into `input`'s sink if it has one
    /// (recorded there with the launch's token), else into a new buffer.
    pub(super) fn gradient_of(
        &self,
        input: VarIndex,
        len: usize,
        sinks: &mut Sinks,
        make: impl FnOnce(Binding) -> KernelLaunch,
    ) -> Result<Buffer, AutodiffError> {
        let sink = sinks.take(input, len);
        let out = match &sink {
            Some(sink) => sink.clone(),
            None => self.reserve(len)?,
        };
        let token = self.launch(make(out.whole()))?;
        if sink.is_some() {
            sinks.wrote(input, token);
        }
        Ok(out)
    }

    /// A new buffer holding `op(a)·op(b)` as `spec` says (`len` elements).
    fn gemm(
        &self,
        spec: GemmSpec,
        a: &Buffer,
        b: &Buffer,
        len: usize,
    ) -> Result<Buffer, AutodiffError> {
        let out = self.reserve(len)?;
        self.launch(KernelLaunch::gemm(
            spec,
            a.whole(),
            b.whole(),
            None,
            out.whole(),
        ))?;
        Ok(out)
    }

    /// `g·act'(at)`, where `at` is the activation's input (or its output,
    /// where that decides the derivative); the identity passes `g` through.
    fn activation_gradient(
        &self,
        activation: Activation,
        at: &Buffer,
        g: Buffer,
        len: usize,
    ) -> Result<Buffer, AutodiffError> {
        if activation == Activation::Identity {
            return Ok(g);
        }
        let out = self.reserve(len)?;
        let launch =
            KernelLaunch::activation_backward(activation, at.whole(), g.whole(), out.whole());
        self.launch(launch)?;
        Ok(out)
    }

    /// `n` elements, each `factor·grad` for a one-element `grad`: one fill
    /// for a host constant; for a device scalar, a fill of `factor` times
    /// the scalar.
    fn broadcast(&self, grad: &Grad, n: usize, factor: f32) -> Result<Buffer, AutodiffError> {
        match grad {
            Grad::Constant(value) => self.filled(n, value * factor),
            Grad::Device(g) => {
                let factors = self.filled(n, factor)?;
                self.times_scalar(&factors, g, n)
            }
        }
    }

    /// `x·s` for `x` of `n` elements and a one-element device scalar `s`:
    /// a GEMM of an `n×1` by a `1×1` matrix.
    pub(super) fn times_scalar(
        &self,
        x: &Buffer,
        s: &Buffer,
        n: usize,
    ) -> Result<Buffer, AutodiffError> {
        self.gemm(product(n, 1, 1, false, false), x, s, n)
    }

    /// `grad·2(pred − target)/n`.
    fn mse_gradient(
        &self,
        pred: &Buffer,
        target: &Buffer,
        grad: &Grad,
        n: usize,
    ) -> Result<Buffer, AutodiffError> {
        let grad_output = match grad {
            Grad::Constant(value) => *value,
            Grad::Device(_) => 1.0,
        };
        let out = self.reserve(n)?;
        let (pred, target, out_binding) = (pred.whole(), target.whole(), out.whole());
        let launch = KernelLaunch::mse_loss_backward(pred, target, grad_output, out_binding);
        self.launch(launch)?;
        match grad {
            Grad::Constant(_) => Ok(out),
            Grad::Device(g) => self.times_scalar(&out, g, n),
        }
    }
}

/// A GEMM spec `m×n` over a contracted `k`, without bias or activation.
pub(super) fn product(
    m: usize,
    n: usize,
    k: usize,
    transpose_a: bool,
    transpose_b: bool,
) -> GemmSpec {
    GemmSpec {
        m,
        n,
        k,
        transpose_a,
        transpose_b,
        activation: Activation::Identity,
    }
}
