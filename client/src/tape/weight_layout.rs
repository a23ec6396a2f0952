//! How a linear layer's weight is stored: PyTorch's `[out, in]` (the
//! tape's [`linear`](super::Tape::linear)) or the parameter store's
//! `[in, out]` (`linear_forward` and the device chains). Each names the
//! GEMMs of its forward and backward, so the two share one kernel set.

use cistern_runtime::{Activation, GemmSpec};

use super::rules::product;

/// The storage order of a linear layer's weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// `[out, in]`, `y = x·Wᵀ`: PyTorch's `nn.Linear.weight`.
    OutIn,
    /// `[in, out]`, `y = x·W`: the original `DeviceParamStore` API's, and
    /// the store's (`linear_forward`, chains, saved models).
    InOut,
}

impl WeightLayout {
    /// `(in, out)` of a weight of this layout with `shape`; `None` unless
    /// it is a matrix.
    pub fn in_out(self, shape: &[usize]) -> Option<(usize, usize)> {
        match (self, shape) {
            (WeightLayout::OutIn, &[out, input]) | (WeightLayout::InOut, &[input, out]) => {
                Some((input, out))
            }
            _ => None,
        }
    }

    /// The weight's shape for a layer of `inputs` to `outputs`.
    pub fn shape(self, inputs: usize, outputs: usize) -> [usize; 2] {
        match self {
            WeightLayout::OutIn => [outputs, inputs],
            WeightLayout::InOut => [inputs, outputs],
        }
    }

    /// The forward GEMM `x·W` (`m` rows, `k` in, `n` out), B the weight.
    pub(crate) fn forward(self, m: usize, n: usize, k: usize, activation: Activation) -> GemmSpec {
        GemmSpec {
            m,
            n,
            k,
            transpose_b: self == WeightLayout::OutIn,
            activation,
            ..GemmSpec::default()
        }
    }

    /// The weight gradient's GEMM and its operands `(A, B)` in order, from
    /// the upstream gradient `g` and the input `x`: `gᵀ·x` (`OutIn`, `n×k`)
    /// or `xᵀ·g` (`InOut`, `k×n`).
    pub(crate) fn weight_gradient<T>(
        self,
        (m, n, k): (usize, usize, usize),
        g: T,
        x: T,
    ) -> (GemmSpec, T, T) {
        match self {
            WeightLayout::OutIn => (product(n, k, m, true, false), g, x),
            WeightLayout::InOut => (product(k, n, m, true, false), x, g),
        }
    }

    /// The input gradient's GEMM `g·W` (`OutIn`) or `g·Wᵀ` (`InOut`), `m×k`.
    pub(crate) fn input_gradient(self, m: usize, n: usize, k: usize) -> GemmSpec {
        product(m, k, n, false, self == WeightLayout::InOut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_layout_reads_in_and_out_from_its_own_end_of_the_shape() {
        assert_eq!(WeightLayout::OutIn.in_out(&[3, 5]), Some((5, 3)));
        assert_eq!(WeightLayout::InOut.in_out(&[3, 5]), Some((3, 5)));
        assert_eq!(WeightLayout::InOut.in_out(&[3]), None);
        for layout in [WeightLayout::OutIn, WeightLayout::InOut] {
            assert_eq!(layout.in_out(&layout.shape(4, 7)), Some((4, 7)));
        }
    }
}
