//! Batches of small products (`m, n ≤ 16`, `k ≤ 64`: attention's per-head
//! products over a few tokens) on AVX-512: four rows of a product's `C` in
//! sixteen-lane registers at a time while `k` rank-one updates add into
//! them. The GEMM crate's setup per call cost more than these products'
//! arithmetic.

use crate::{Activation, GemmSpec};

/// The widest `m` and `n` taken: one row of `C` per 16-lane register.
const LANES: usize = 16;

/// The deepest `k` taken: both packed operands stay in the L1 cache.
const MAX_K: usize = 64;

/// Rows of `C` summed together: independent sums, so the additions of one
/// row do not wait for each other.
const ROWS: usize = 4;

/// Runs every product of a batch when this CPU and the shape allow it:
/// `false` (nothing written) otherwise. `products` yields each product's
/// `A`, `B` and `C` blocks, checked by the caller.
pub(crate) fn run<'a>(
    spec: &GemmSpec,
    products: impl Iterator<Item = (&'a [f32], &'a [f32], &'a mut [f32])>,
) -> bool {
    let GemmSpec { m, n, k, .. } = *spec;
    let identity = spec.activation == Activation::Identity;
    if !identity || m == 0 || n == 0 || m > LANES || n > LANES || k > MAX_K {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F, checked just above.
        unsafe { each_avx512(spec, products) };
        return true;
    }
    let _ = products;
    false
}

/// Every product, compiled for AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn each_avx512<'a>(
    spec: &GemmSpec,
    products: impl Iterator<Item = (&'a [f32], &'a [f32], &'a mut [f32])>,
) {
    let mut packed = Packed {
        a: [[0.0; LANES]; MAX_K],
        b: [[0.0; LANES]; MAX_K],
    };
    for (a, b, c) in products {
        packed.pack(spec, a, b);
        packed.product(spec, c);
    }
}

/// One product's operands: `op(A)` as `k` columns of `m` (column `p` of
/// `op(A)` in `a[p]`), `op(B)` as `k` rows of `n`, zero past `n`.
struct Packed {
    a: [[f32; LANES]; MAX_K],
    b: [[f32; LANES]; MAX_K],
}

impl Packed {
    /// Packs `a` and `b` as `spec` reads them, each transpose a loop of its
    /// own with no choice inside.
    #[inline(always)]
    fn pack(&mut self, spec: &GemmSpec, a: &[f32], b: &[f32]) {
        let GemmSpec { m, n, k, .. } = *spec;
        let a_columns = self.a.iter_mut().take(k);
        match spec.transpose_a {
            false => a_columns.enumerate().for_each(|(p, column)| {
                for (i, value) in column.iter_mut().enumerate().take(m) {
                    *value = a[i * k + p];
                }
            }),
            true => a_columns
                .zip(a.chunks_exact(m))
                .for_each(|(column, a)| column[..m].copy_from_slice(a)),
        }
        let b_rows = self.b.iter_mut().take(k);
        match spec.transpose_b {
            false => b_rows
                .zip(b.chunks_exact(n))
                .for_each(|(row, b)| row[..n].copy_from_slice(b)),
            true => b_rows.enumerate().for_each(|(p, row)| {
                for (j, value) in row.iter_mut().enumerate().take(n) {
                    *value = b[j * k + p];
                }
            }),
        }
    }

    /// `c ← op(A)·op(B)`: [`ROWS`] rows at a time, then the rest one by
    /// one, each summed over `k` in order (so the result does not depend on
    /// the thread count).
    #[inline(always)]
    fn product(&self, spec: &GemmSpec, c: &mut [f32]) {
        let GemmSpec { m, n, k, .. } = *spec;
        let (a, b) = (&self.a[..k], &self.b[..k]);
        let mut first = 0;
        while first + ROWS <= m {
            let mut sums = [[0.0f32; LANES]; ROWS];
            for (a, b) in a.iter().zip(b) {
                let (s0, rest) = sums.split_at_mut(1);
                let (s1, rest) = rest.split_at_mut(1);
                let (s2, s3) = rest.split_at_mut(1);
                let rows = [a[first], a[first + 1], a[first + 2], a[first + 3]];
                for ((((s0, s1), s2), s3), &b) in (s0[0]
                    .iter_mut()
                    .zip(&mut s1[0])
                    .zip(&mut s2[0])
                    .zip(&mut s3[0]))
                .zip(b)
                {
                    *s0 += rows[0] * b;
                    *s1 += rows[1] * b;
                    *s2 += rows[2] * b;
                    *s3 += rows[3] * b;
                }
            }
            for (row, sum) in sums.iter().enumerate() {
                let at = (first + row) * n;
                c[at..at + n].copy_from_slice(&sum[..n]);
            }
            first += ROWS;
        }
        for row in first..m {
            let mut sum = [0.0f32; LANES];
            for (a, b) in a.iter().zip(b) {
                for (sum, &b) in sum.iter_mut().zip(b) {
                    *sum += a[row] * b;
                }
            }
            c[row * n..(row + 1) * n].copy_from_slice(&sum[..n]);
        }
    }
}
