//! Batches of small products (`m, n ≤ 16`, `k ≤ 64`: attention's per-head
//! products over a few tokens) on AVX-512: four rows of a product's `C` in
//! sixteen-lane registers at a time while `k` rank-one updates add into
//! them. The GEMM crate's setup per call cost more than these products'
//! arithmetic.

use crate::{Activation, GemmSpec};

/// The widest `m` and `n` taken: one row of `C` per 16-lane register.
pub(crate) const LANES: usize = 16;

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

    /// `c ← op(A)·op(B)` ([`row_products`]).
    #[inline(always)]
    fn product(&self, spec: &GemmSpec, c: &mut [f32]) {
        let GemmSpec { m, n, k, .. } = *spec;
        row_products(
            m,
            &self.b[..k],
            |i, p| self.a[p][i],
            |i, sum| {
                c[i * n..(i + 1) * n].copy_from_slice(&sum[..n]);
            },
        );
    }
}

/// `emit(i, Σ_t w(i, t)·rows[t])` for every `i < count`, each element
/// summed over `t` in order (so the result does not depend on the thread
/// count): [`ROWS`] rows at a time, their sums in registers, then the rest
/// one by one. Shared with attention's small heads.
#[inline(always)]
pub(crate) fn row_products(
    count: usize,
    rows: &[[f32; LANES]],
    w: impl Fn(usize, usize) -> f32,
    mut emit: impl FnMut(usize, &[f32; LANES]),
) {
    let mut first = 0;
    while first + ROWS <= count {
        let mut sums = [[0.0f32; LANES]; ROWS];
        for (t, row) in rows.iter().enumerate() {
            let (s0, rest) = sums.split_at_mut(1);
            let (s1, rest) = rest.split_at_mut(1);
            let (s2, s3) = rest.split_at_mut(1);
            let weights = [
                w(first, t),
                w(first + 1, t),
                w(first + 2, t),
                w(first + 3, t),
            ];
            for ((((s0, s1), s2), s3), &r) in (s0[0]
                .iter_mut()
                .zip(&mut s1[0])
                .zip(&mut s2[0])
                .zip(&mut s3[0]))
            .zip(row)
            {
                *s0 += weights[0] * r;
                *s1 += weights[1] * r;
                *s2 += weights[2] * r;
                *s3 += weights[3] * r;
            }
        }
        for (row, sum) in sums.iter().enumerate() {
            emit(first + row, sum);
        }
        first += ROWS;
    }
    for i in first..count {
        let mut sum = [0.0f32; LANES];
        for (t, row) in rows.iter().enumerate() {
            let weight = w(i, t);
            for (sum, &r) in sum.iter_mut().zip(row) {
                *sum += weight * r;
            }
        }
        emit(i, &sum);
    }
}
