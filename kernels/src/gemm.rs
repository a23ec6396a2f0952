//! Matrix product with a fused bias + activation epilogue.
//!
//! The product runs in a GEMM crate chosen once per process for the CPU's
//! widest vector unit ([`GemmKernel::chosen`]), or, for the shapes where it
//! measured faster, in Cistern's own packed kernel
//! ([`GemmKernel::chosen_for`]).

mod kernel;
mod packed;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::parallel::MIN_PARALLEL;
use crate::{Activation, KernelError};

pub use kernel::GemmKernel;

/// The shape and options of `C = act(op(A)·op(B) + bias)`, all row-major:
/// `op(A)` is `m×k` (A is stored `k×m` when `transpose_a`), `op(B)` is
/// `k×n` (B is stored `n×k` when `transpose_b`), C is `m×n`, and the bias
/// has `n` elements, one per column (as `nn.Linear`'s).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct GemmSpec {
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// A is stored transposed (`k×m`).
    pub transpose_a: bool,
    /// B is stored transposed (`n×k`).
    pub transpose_b: bool,
    /// Applied to every element of C after the bias.
    pub activation: Activation,
}

fn product(field: &str, a: usize, b: usize) -> Result<usize, KernelError> {
    a.checked_mul(b)
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| KernelError::invalid(field, format!("{a}×{b} overflows")))
}

/// `C ← act(op(A)·op(B) + bias)`, with the kernel
/// [`GemmKernel::chosen_for`] picks for this spec on this CPU. The product
/// is split over the cores: called from outside rayon's pools, the caller
/// computes one block and a helper pool of one thread fewer the rest;
/// inside a pool, that pool runs them. The workers then stay awake 200 µs
/// for the next one (`CISTERN_GEMM_WARM_US` sets the window in
/// microseconds, 0 turns it off); bias
/// and activation run on each tile ([`GemmKernel::Packed`]) or take one
/// pass over C.
pub fn gemm(
    spec: &GemmSpec,
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    c: &mut [f32],
) -> Result<(), KernelError> {
    gemm_with(GemmKernel::chosen_for(spec), spec, a, b, bias, c)
}

/// [`gemm`] with the product forced onto `kernel`, whichever the CPU would
/// choose: for tests and benchmarks that compare the kernels. Every kernel
/// runs on every CPU (each crate picks its own instructions); only its
/// speed differs. Errors as [`gemm`].
pub fn gemm_with(
    kernel: GemmKernel,
    spec: &GemmSpec,
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    c: &mut [f32],
) -> Result<(), KernelError> {
    let GemmSpec { m, n, k, .. } = *spec;
    KernelError::check_len("a", product("m*k", m, k)?, a.len())?;
    KernelError::check_len("b", product("k*n", k, n)?, b.len())?;
    KernelError::check_len("c", product("m*n", m, n)?, c.len())?;
    if let Some(bias) = bias {
        KernelError::check_len("bias", n, bias.len())?;
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        c.fill(0.0);
        epilogue(spec.activation, bias, n, c);
    } else {
        kernel.product(spec, a, b, bias, c);
    }
    Ok(())
}

/// The threads a product splits over: the current rayon pool's; for a
/// caller outside rayon's pools (a stream executor, a program) the global
/// pool's, one per core unless `RAYON_NUM_THREADS` says otherwise.
/// Benchmarks measure the FMA peak on as many.
pub fn gemm_threads() -> usize {
    rayon::current_num_threads()
}

/// One pass over C: add the bias to each row and apply the activation.
fn epilogue(activation: Activation, bias: Option<&[f32]>, n: usize, c: &mut [f32]) {
    let row_pass = |row: &mut [f32]| match bias {
        Some(bias) => activation.apply_with_bias(row, bias),
        None => activation.apply_in_place(row),
    };
    if bias.is_none() && activation == Activation::Identity {
        return;
    }
    if c.len() < MIN_PARALLEL {
        c.chunks_exact_mut(n).for_each(row_pass);
    } else {
        let rows_per_task = (MIN_PARALLEL / 2 / n).max(1);
        c.par_chunks_mut(rows_per_task * n)
            .for_each(|rows| rows.chunks_exact_mut(n).for_each(row_pass));
    }
}
