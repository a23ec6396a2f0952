//! Which GEMM crate runs the product, chosen once per process from the
//! CPU's widest vector unit.
//!
//! Both crates pick their own micro-kernels from the CPU's features (the
//! `gemm` crate: AVX-512 with its `x86-v4` feature, AVX2 + FMA, scalar;
//! `matrixmultiply`: AVX-512, AVX2 + FMA, AVX, NEON, portable). Which crate
//! is faster at a given width was measured (`docs/benchmarks.md`, "GEMM"),
//! and [`GemmKernel::for_vector_bits`] records the outcome.

use std::sync::OnceLock;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::GemmSpec;

/// Products smaller than this (m·n·k multiply-adds) run on the calling
/// thread in the `matrixmultiply` path: below it, waking the pool costs more
/// than it saves. The `gemm` crate applies a threshold of its own.
const PARALLEL_WORK: usize = 1 << 21;

/// Rows of C per `matrixmultiply` task are a multiple of this, its widest
/// micro-tile, so no task ends in a partial tile that another could fill.
const ROW_TILE: usize = 16;

/// The implementation of the matrix product behind [`crate::gemm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GemmKernel {
    /// The `gemm` crate (`gemm-f32` 0.19, `x86-v4`): packed AVX-512 or
    /// AVX2 + FMA micro-kernels, threaded on rayon's pool.
    Gemm,
    /// `matrixmultiply`'s sgemm: micro-kernels for most instruction sets and
    /// a portable one; C's rows are split over rayon's pool.
    MatrixMultiply,
}

impl GemmKernel {
    /// Every kernel, for tests and benchmarks that compare them.
    pub const ALL: [GemmKernel; 2] = [GemmKernel::Gemm, GemmKernel::MatrixMultiply];

    /// The kernel this CPU runs: [`Self::for_vector_bits`] of
    /// [`Self::cpu_vector_bits`], decided on first use and then fixed.
    pub fn chosen() -> GemmKernel {
        static CHOSEN: OnceLock<GemmKernel> = OnceLock::new();
        *CHOSEN.get_or_init(|| Self::for_vector_bits(Self::cpu_vector_bits()))
    }

    /// The faster kernel on a CPU whose widest FMA vector is `bits` wide:
    /// the `gemm` crate at 512 and 256 bits, `matrixmultiply` (portable
    /// kernels included) below.
    pub fn for_vector_bits(bits: u32) -> GemmKernel {
        if bits >= 256 {
            GemmKernel::Gemm
        } else {
            GemmKernel::MatrixMultiply
        }
    }

    /// The widest single-precision FMA vector this CPU has, in bits: 512
    /// with AVX-512F, 256 with AVX2 + FMA, else 128 (SSE2, NEON) on x86-64
    /// and aarch64 and 32 (scalar) elsewhere.
    pub fn cpu_vector_bits() -> u32 {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return 512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return 256;
            }
            128
        }
        #[cfg(target_arch = "aarch64")]
        {
            128
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            32
        }
    }

    /// The crate's name, as benchmarks print it.
    pub fn name(self) -> &'static str {
        match self {
            GemmKernel::Gemm => "gemm",
            GemmKernel::MatrixMultiply => "matrixmultiply",
        }
    }

    /// `c ← op(a)·op(b)`. The caller has checked every length against
    /// `spec`, and that m, n and k are non-zero.
    pub(super) fn product(self, spec: &GemmSpec, a: &[f32], b: &[f32], c: &mut [f32]) {
        let strides = Strides::of(spec);
        debug_assert!(spec.m * spec.k == a.len() && spec.k * spec.n == b.len());
        debug_assert!(spec.m * spec.n == c.len() && spec.k > 0);
        match self {
            GemmKernel::Gemm => gemm_crate(spec, &strides, a, b, c),
            GemmKernel::MatrixMultiply => matrixmultiply(spec, &strides, a, b, c),
        }
    }
}

/// Element strides of the logical op(A) (m×k) and op(B) (k×n) over their
/// row-major storage. Each is at most a checked buffer length, so fits in
/// `isize`.
struct Strides {
    a_row: isize,
    a_col: isize,
    b_row: isize,
    b_col: isize,
}

impl Strides {
    fn of(spec: &GemmSpec) -> Strides {
        let (m, n, k) = (spec.m as isize, spec.n as isize, spec.k as isize);
        let (a_row, a_col) = if spec.transpose_a { (1, m) } else { (k, 1) };
        let (b_row, b_col) = if spec.transpose_b { (1, k) } else { (n, 1) };
        Strides {
            a_row,
            a_col,
            b_row,
            b_col,
        }
    }
}

fn gemm_crate(spec: &GemmSpec, s: &Strides, a: &[f32], b: &[f32], c: &mut [f32]) {
    let GemmSpec { m, n, k, .. } = *spec;
    // SAFETY: a, b and c hold m·k, k·n and m·n elements (checked by the
    // caller), and the strides address exactly those matrices within them;
    // c is exclusively borrowed. With `read_dst = false` C's old contents
    // are never read, so NaNs left in it cannot leak into the result.
    unsafe {
        gemm_f32::gemm::f32::get_gemm_fn()(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            s.a_col,
            s.a_row,
            b.as_ptr(),
            s.b_col,
            s.b_row,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm_common::Parallelism::Rayon(0),
        );
    }
}

fn matrixmultiply(spec: &GemmSpec, s: &Strides, a: &[f32], b: &[f32], c: &mut [f32]) {
    let GemmSpec { m, n, k, .. } = *spec;
    let work = m.saturating_mul(n).saturating_mul(k);
    let tasks = if work < PARALLEL_WORK {
        1
    } else {
        rayon::current_num_threads().clamp(1, m.div_ceil(ROW_TILE))
    };
    let rows_per_task = m.div_ceil(tasks).div_ceil(ROW_TILE) * ROW_TILE;
    let rows_of_c = |(task, c_rows): (usize, &mut [f32])| {
        let first = task * rows_per_task;
        // The sub-matrix of op(A) for rows first.. starts at element
        // first·a_row: `first·k` untransposed, `first` transposed.
        let a_rows = &a[first * s.a_row.unsigned_abs()..];
        let rows = c_rows.len() / n;
        // SAFETY: op(A)'s rows first..first+rows lie in `a_rows` (their last
        // element is a[(first+rows-1)·a_row + (k-1)·a_col] < m·k), B is whole,
        // and `c_rows` is this task's own rows·n block of C.
        unsafe {
            matrixmultiply::sgemm(
                rows,
                k,
                n,
                1.0,
                a_rows.as_ptr(),
                s.a_row,
                s.a_col,
                b.as_ptr(),
                s.b_row,
                s.b_col,
                0.0,
                c_rows.as_mut_ptr(),
                n as isize,
                1,
            );
        }
    };
    if tasks == 1 {
        rows_of_c((0, c));
    } else {
        c.par_chunks_mut(rows_per_task * n)
            .enumerate()
            .for_each(rows_of_c);
    }
}
