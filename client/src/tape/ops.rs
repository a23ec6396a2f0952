//! The operations a tape records, forward: each checks its operands' tape
//! and shapes, reserves its output and queues its kernels. Nothing waits.
//!
//! Element-wise binary operations broadcast as PyTorch does; the other
//! operations here take the shapes they name (`docs/tape.md`).

use cistern_optim::GradScaler;
use cistern_runtime::{Activation, BinaryOp, KernelLaunch, MapOp, Segment};

use super::node::{Op, VarIndex, derivative_from_output};
use super::strides::{broadcast_shape, broadcast_spec};
use super::tape::{Tape, checked_len};
use super::var::Var;
use super::weight_layout::WeightLayout;
use crate::compute::Buffer;
use crate::error::AutodiffError;
use crate::shape::ShapeError;

/// An operand: its index, buffer and shape.
pub(super) struct Operand {
    pub(super) index: VarIndex,
    pub(super) value: Buffer,
    pub(super) shape: Vec<usize>,
}

impl Operand {
    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// `(rows, cols)` of a matrix; `RankMismatch` for any other rank.
    fn matrix(&self) -> Result<(usize, usize), ShapeError> {
        match self.shape[..] {
            [rows, cols] => Ok((rows, cols)),
            _ => Err(ShapeError::RankMismatch {
                expected: 2,
                actual: self.shape.len(),
            }),
        }
    }
}

impl Tape {
    /// A linear layer, `act(input·weightᵀ + bias)`, in PyTorch's
    /// `nn.Linear` layout: `input` is `m×k`, `weight` is `n×k` (`[out,
    /// in]`), the optional `bias` has `n` elements (added to every row).
    /// Bias and activation are fused into the GEMM where backward can take
    /// the activation's derivative from its output (identity, ReLU, leaky
    /// ReLU with a non-negative slope); otherwise the pre-activation is
    /// kept. The store's `linear_forward` takes `[in, out]` instead:
    /// [`linear_with_layout`](Self::linear_with_layout).
    pub fn linear(
        &self,
        input: &Var<'_>,
        weight: &Var<'_>,
        bias: Option<&Var<'_>>,
        activation: Activation,
    ) -> Result<Var<'_>, AutodiffError> {
        self.linear_with_layout(input, weight, bias, activation, WeightLayout::OutIn)
    }

    /// [`linear`](Self::linear) with the weight stored as `layout` says:
    /// `[out, in]` (`y = x·Wᵀ`) or `[in, out]` (`y = x·W`).
    pub fn linear_with_layout(
        &self,
        input: &Var<'_>,
        weight: &Var<'_>,
        bias: Option<&Var<'_>>,
        activation: Activation,
        layout: WeightLayout,
    ) -> Result<Var<'_>, AutodiffError> {
        let (input, weight) = (self.operand(input)?, self.operand(weight)?);
        let bias = bias.map(|bias| self.operand(bias)).transpose()?;
        let (m, k) = input.matrix()?;
        weight.matrix()?;
        let (weight_k, n) = layout.in_out(&weight.shape).unwrap_or_default();
        if weight_k != k {
            let axis = match layout {
                WeightLayout::OutIn => 1,
                WeightLayout::InOut => 0,
            };
            return Err(dimension(axis, k, weight_k));
        }
        if let Some(bias) = &bias {
            ShapeError::check_dims(&[n], &bias.shape)?;
        }
        let fused = derivative_from_output(activation);
        let epilogue = if fused {
            activation
        } else {
            Activation::Identity
        };
        let spec = layout.forward(m, n, k, epilogue);
        let len = ShapeError::element_count(&[m, n])?;
        let product = self.reserve(len)?;
        let bias_binding = bias.as_ref().map(|bias| bias.value.whole());
        self.launch(KernelLaunch::gemm(
            spec,
            input.value.whole(),
            weight.value.whole(),
            bias_binding,
            product.whole(),
        ))?;
        let (out, pre_activation) = if fused {
            (product, None)
        } else {
            let out = self.reserve(len)?;
            let forward =
                KernelLaunch::activation_forward(activation, product.whole(), out.whole());
            self.launch(forward)?;
            (out, Some(product))
        };
        let op = Op::Linear {
            input: input.index,
            weight: weight.index,
            bias: bias.map(|bias| bias.index),
            activation,
            layout,
            pre_activation,
        };
        Ok(self.record(out, vec![m, n], op))
    }

    /// `act(input)`, element-wise, any shape.
    pub fn activation(
        &self,
        input: &Var<'_>,
        activation: Activation,
    ) -> Result<Var<'_>, AutodiffError> {
        let input = self.operand(input)?;
        let out = if activation == Activation::Identity {
            // Values are never written after their launch: sharing is safe.
            input.value.clone()
        } else {
            let out = self.reserve(input.len())?;
            let launch =
                KernelLaunch::activation_forward(activation, input.value.whole(), out.whole());
            self.launch(launch)?;
            out
        };
        let op = Op::Activation {
            input: input.index,
            activation,
        };
        Ok(self.record(out, input.shape, op))
    }

    /// `max(x, 0)`.
    pub fn relu(&self, input: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.activation(input, Activation::Relu)
    }

    /// `x` for `x > 0`, else `negative_slope·x`.
    pub fn leaky_relu(
        &self,
        input: &Var<'_>,
        negative_slope: f32,
    ) -> Result<Var<'_>, AutodiffError> {
        self.activation(input, Activation::LeakyRelu { negative_slope })
    }

    /// Exact GELU (erf), PyTorch's `approximate='none'`.
    pub fn gelu(&self, input: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.activation(input, Activation::Gelu)
    }

    /// GELU with PyTorch's `approximate='tanh'`.
    pub fn gelu_tanh(&self, input: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.activation(input, Activation::GeluTanh)
    }

    /// `tanh(x)`.
    pub fn tanh(&self, input: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.activation(input, Activation::Tanh)
    }

    /// `1 / (1 + e^{−x})`.
    pub fn sigmoid(&self, input: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.activation(input, Activation::Sigmoid)
    }

    /// `a + b`, element-wise, with PyTorch's broadcasting (`docs/tape.md`).
    pub fn add(&self, a: &Var<'_>, b: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.binary(BinaryOp::Add, a, b)
    }

    /// `a − b`, element-wise, with PyTorch's broadcasting.
    pub fn sub(&self, a: &Var<'_>, b: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.binary(BinaryOp::Sub, a, b)
    }

    /// `a ⊙ b`, element-wise, with PyTorch's broadcasting.
    pub fn mul(&self, a: &Var<'_>, b: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.binary(BinaryOp::Mul, a, b)
    }

    /// `a / b`, element-wise, with PyTorch's broadcasting.
    pub fn div(&self, a: &Var<'_>, b: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        self.binary(BinaryOp::Div, a, b)
    }

    /// `factor·input`.
    pub fn scale(&self, input: &Var<'_>, factor: f32) -> Result<Var<'_>, AutodiffError> {
        let input = self.operand(input)?;
        let out = self.scaled(&input.value, input.len(), factor)?;
        let op = Op::Scale {
            input: input.index,
            factor,
        };
        Ok(self.record(out, input.shape, op))
    }

    /// The loss of an AMP step scaled by `scaler`'s current scale: the
    /// original's `scaler.scale_loss(&loss)`, one call before `backward`
    /// and the store's AMP step (which unscales by the same scaler).
    pub fn scale_loss(
        &self,
        loss: &Var<'_>,
        scaler: &GradScaler,
    ) -> Result<Var<'_>, AutodiffError> {
        self.scale(loss, scaler.scale())
    }

    /// The sum of every element: a scalar.
    pub fn sum(&self, input: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        let input = self.operand(input)?;
        let out = self.total(&input.value, input.len())?;
        Ok(self.record(out, Vec::new(), Op::Sum { input: input.index }))
    }

    /// The mean of every element: a scalar.
    pub fn mean(&self, input: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        let input = self.operand(input)?;
        let out = self.total(&input.value, input.len())?;
        self.launch(KernelLaunch::scale(out.whole(), 1.0 / input.len() as f32))?;
        Ok(self.record(out, Vec::new(), Op::Mean { input: input.index }))
    }

    /// The mean squared error `Σ (pred − target)² / n` (PyTorch's
    /// `reduction='mean'`): a scalar; the shapes are equal.
    pub fn mse_loss(&self, pred: &Var<'_>, target: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        let (pred, target) = (self.operand(pred)?, self.operand(target)?);
        ShapeError::check_dims(&pred.shape, &target.shape)?;
        let out = self.reserve(1)?;
        let launch = KernelLaunch::mse_loss(pred.value.whole(), target.value.whole(), out.whole());
        self.launch(launch)?;
        let op = Op::MseLoss {
            pred: pred.index,
            target: target.index,
        };
        Ok(self.record(out, Vec::new(), op))
    }

    fn binary(&self, op: BinaryOp, a: &Var<'_>, b: &Var<'_>) -> Result<Var<'_>, AutodiffError> {
        let (a, b) = (self.operand(a)?, self.operand(b)?);
        let shape = broadcast_shape(binary_name(op), &a.shape, &b.shape)?;
        let out = self.broadcast_values(op, (&a.value, &a.shape), (&b.value, &b.shape), &shape)?;
        let op = Op::Binary {
            op,
            a: a.index,
            b: b.index,
        };
        Ok(self.record(out, shape, op))
    }

    /// A new buffer holding `a op b` over `out` (the shape both broadcast
    /// to): the element-wise kernel where no operand is broadcast, else
    /// the strided one.
    pub(super) fn broadcast_values(
        &self,
        op: BinaryOp,
        (a, a_shape): (&Buffer, &[usize]),
        (b, b_shape): (&Buffer, &[usize]),
        out: &[usize],
    ) -> Result<Buffer, AutodiffError> {
        let value = self.reserve(checked_len(out)?)?;
        let launch = if a_shape == out && b_shape == out {
            let map = match op {
                BinaryOp::Add => MapOp::Add,
                BinaryOp::Sub => MapOp::Sub,
                BinaryOp::Mul => MapOp::Mul,
                BinaryOp::Div => MapOp::Div,
            };
            KernelLaunch::map(map, &[], vec![a.whole(), b.whole(), value.whole()])
        } else {
            let spec = broadcast_spec(op, a_shape, b_shape, out);
            KernelLaunch::broadcast_binary(spec, a.whole(), b.whole(), value.whole())
        };
        self.launch(launch)?;
        Ok(value)
    }

    /// A new buffer holding `factor·value` (`len` elements).
    pub(super) fn scaled(
        &self,
        value: &Buffer,
        len: usize,
        factor: f32,
    ) -> Result<Buffer, AutodiffError> {
        let out = self.reserve(len)?;
        self.launch(KernelLaunch::identity(value.whole(), out.whole()))?;
        self.launch(KernelLaunch::scale(out.whole(), factor))?;
        Ok(out)
    }

    /// A new one-element buffer holding the sum of `value`'s `len` elements
    /// (a segment sum with one segment).
    fn total(&self, value: &Buffer, len: usize) -> Result<Buffer, AutodiffError> {
        let out = self.reserve(1)?;
        let segments = vec![Segment::new(0, len)];
        self.launch(KernelLaunch::segment_sum(
            value.whole(),
            segments,
            out.whole(),
        ))?;
        Ok(out)
    }

    pub(super) fn operand(&self, var: &Var<'_>) -> Result<Operand, AutodiffError> {
        let index = self.index_of(var)?;
        let (value, shape) = self.with_node(index, |node| (node.value.clone(), node.shape.clone()));
        Ok(Operand {
            index,
            value,
            shape,
        })
    }
}

/// The name of `op` as errors show it.
pub(super) fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
    }
}

fn dimension(axis: usize, expected: usize, actual: usize) -> AutodiffError {
    AutodiffError::ShapeMismatch(ShapeError::DimensionMismatch {
        axis,
        expected,
        actual,
    })
}
