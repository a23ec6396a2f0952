//! The gradient rules of the broadcasting operations, the reductions over
//! dimensions and the views: a broadcast operand's gradient is summed over
//! the dimensions it was broadcast along; a sum's is expanded back; a
//! permutation's is permuted back; a reshape's passes through; a
//! maximum's goes to the index each value came from.

use cistern_runtime::{BinaryOp, KernelLaunch, MaxDimSpec};

use super::backward::Grad;
use super::node::VarIndex;
use super::rules::Contributions;
use super::sinks::Sinks;
use super::strides::{expand_spec, permute_spec, sum_to_spec};
use super::tape::Tape;
use crate::compute::Buffer;
use crate::error::AutodiffError;

/// One operand of a binary operation in backward: its index, value and shape.
pub(super) type Side = (VarIndex, Buffer, Vec<usize>);

impl Tape {
    /// The contributions of `a op b` (whose value is `value`, of `shape`)
    /// to each reached operand, given its gradient `grad`.
    pub(super) fn binary_gradients(
        &self,
        op: BinaryOp,
        (a, b): (Side, Side),
        (value, shape): (&Buffer, &[usize]),
        grad: &Grad,
        reached: impl Fn(VarIndex) -> bool,
        sinks: &mut Sinks,
    ) -> Result<Contributions, AutodiffError> {
        let len: usize = shape.iter().product();
        let mut out = Contributions::new();
        match op {
            BinaryOp::Add | BinaryOp::Sub => {
                let b_sign = if op == BinaryOp::Sub { -1.0 } else { 1.0 };
                for ((index, _, side_shape), sign) in [(a, 1.0), (b, b_sign)] {
                    if !reached(index) {
                        continue;
                    }
                    let contribution = match grad {
                        _ if side_shape == shape && sign == 1.0 => grad.clone(),
                        Grad::Constant(v) if side_shape == shape => Grad::Constant(v * sign),
                        _ => {
                            let g = self.materialize(grad, len)?;
                            let to = (index, side_shape.as_slice());
                            Grad::Device(self.sum_to(to, &g, shape, sign, sinks)?)
                        }
                    };
                    out.push((index, contribution));
                }
            }
            BinaryOp::Mul => {
                let g = self.materialize(grad, len)?;
                for (side, other) in [(&a, &b), (&b, &a)] {
                    if reached(side.0) {
                        let other = (&other.1, other.2.as_slice());
                        let t = self.broadcast_values(BinaryOp::Mul, (&g, shape), other, shape)?;
                        let to = (side.0, side.2.as_slice());
                        out.push((
                            side.0,
                            Grad::Device(self.sum_to(to, &t, shape, 1.0, sinks)?),
                        ));
                    }
                }
            }
            BinaryOp::Div => {
                let g = self.materialize(grad, len)?;
                let divisor = (&b.1, b.2.as_slice());
                if reached(a.0) {
                    // ∂a = g / b
                    let t = self.broadcast_values(BinaryOp::Div, (&g, shape), divisor, shape)?;
                    let to = (a.0, a.2.as_slice());
                    out.push((a.0, Grad::Device(self.sum_to(to, &t, shape, 1.0, sinks)?)));
                }
                if reached(b.0) {
                    // ∂b = −g·(a / b) / b, the quotient being the value.
                    let gy =
                        self.broadcast_values(BinaryOp::Mul, (&g, shape), (value, shape), shape)?;
                    let t = self.broadcast_values(BinaryOp::Div, (&gy, shape), divisor, shape)?;
                    let to = (b.0, b.2.as_slice());
                    out.push((b.0, Grad::Device(self.sum_to(to, &t, shape, -1.0, sinks)?)));
                }
            }
        }
        Ok(out)
    }

    /// `scale·g` (of shape `from`) summed down to the shape of `input`
    /// (which broadcasts to `from`): `g` itself where nothing is summed or
    /// scaled, else one strided sum, into `input`'s sink where it has one.
    pub(super) fn sum_to(
        &self,
        (input, to): (VarIndex, &[usize]),
        g: &Buffer,
        from: &[usize],
        scale: f32,
        sinks: &mut Sinks,
    ) -> Result<Buffer, AutodiffError> {
        if from == to && scale == 1.0 {
            return Ok(g.clone());
        }
        let len: usize = to.iter().product();
        if scale == 1.0 && is_trailing(to, from) {
            // A bias's pattern, summed over whole leading rows: the column sum.
            let (rows, cols) = ((from.iter().product::<usize>() / len) as u64, len as u64);
            return self.gradient_of(input, len, sinks, |out| {
                KernelLaunch::column_sum(g.whole(), rows, cols, out)
            });
        }
        let spec = sum_to_spec(from, to, scale);
        self.gradient_of(input, len, sinks, |out| {
            KernelLaunch::strided_sum(spec, g.whole(), out)
        })
    }

    /// The gradient of a sum (or mean, `scale` 1/n) over `dims` of `input`
    /// (of `shape`): the value's gradient expanded back over those dimensions.
    pub(super) fn sum_dims_gradient(
        &self,
        (input, shape): (VarIndex, &[usize]),
        dims: &[usize],
        scale: f32,
        grad: &Grad,
        sinks: &mut Sinks,
    ) -> Result<Buffer, AutodiffError> {
        let kept: Vec<usize> = (shape.iter().enumerate())
            .map(|(d, &n)| if dims.contains(&d) { 1 } else { n })
            .collect();
        let g = self.materialize(grad, kept.iter().product())?;
        let spec = expand_spec(&kept, shape, scale);
        let len = shape.iter().product();
        self.gradient_of(input, len, sinks, |out| {
            KernelLaunch::strided_sum(spec, g.whole(), out)
        })
    }

    /// The gradient of `input` permuted by `order` into `shape`: the
    /// value's gradient permuted back.
    pub(super) fn permute_gradient(
        &self,
        input: VarIndex,
        order: &[usize],
        shape: &[usize],
        grad: &Grad,
        sinks: &mut Sinks,
    ) -> Result<Buffer, AutodiffError> {
        let len = shape.iter().product();
        let g = self.materialize(grad, len)?;
        let mut inverse = vec![0; order.len()];
        for (i, &d) in order.iter().enumerate() {
            inverse[d] = i;
        }
        let spec = permute_spec(shape, &inverse);
        self.gradient_of(input, len, sinks, |out| {
            KernelLaunch::strided_sum(spec, g.whole(), out)
        })
    }

    /// The gradient of a maximum over one dimension: each of the value's
    /// gradients at its index, zeros elsewhere (one kernel).
    pub(super) fn max_dim_gradient(
        &self,
        input: VarIndex,
        spec: MaxDimSpec,
        indices: &Buffer,
        grad: &Grad,
        sinks: &mut Sinks,
    ) -> Result<Buffer, AutodiffError> {
        let (outputs, inputs) = (spec.outer * spec.inner, spec.outer * spec.dim * spec.inner);
        let g = self.materialize(grad, outputs as usize)?;
        self.gradient_of(input, inputs as usize, sinks, |out| {
            KernelLaunch::max_dim_backward(spec, indices.whole(), g.whole(), out)
        })
    }
}

/// Whether `to`, its leading 1s dropped, is the trailing dimensions of `from`.
fn is_trailing(to: &[usize], from: &[usize]) -> bool {
    let to = &to[to.iter().take_while(|&&n| n == 1).count()..];
    from.len() >= to.len() && from[from.len() - to.len()..] == *to
}
