//! Elementwise kernels: fill, copy, scale, axpy, add, mul (all but copy
//! defined in `map/ops.rs`).

use crate::KernelError;
use crate::map::{MapOp, map};
use crate::parallel::zip_mut;

/// Sets every element of `dst` to `value`.
pub fn fill(dst: &mut [f32], value: f32) {
    let filled = map(MapOp::Fill, dst, &[], &[value]);
    debug_assert!(filled.is_ok(), "fill takes no input and one scalar");
}

/// Copies `src` into `dst` (also the catalogue's `identity` kernel).
pub fn copy(src: &[f32], dst: &mut [f32]) -> Result<(), KernelError> {
    KernelError::check_len("dst", src.len(), dst.len())?;
    zip_mut(dst, src, |d, s| d.copy_from_slice(s));
    Ok(())
}

/// `x ← s·x`.
pub fn scale(x: &mut [f32], s: f32) {
    let scaled = map(MapOp::Scale, x, &[], &[s]);
    debug_assert!(scaled.is_ok(), "scale takes no other input and one scalar");
}

/// In-place axpy: `a ← a + s·c`.
pub fn axpy(a: &mut [f32], s: f32, c: &[f32]) -> Result<(), KernelError> {
    map(MapOp::Axpy, a, &[c], &[s])
}

/// `out ← a + b`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    map(MapOp::Add, out, &[a, b], &[])
}

/// `out ← a ⊙ b` (elementwise product).
pub fn mul(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    map(MapOp::Mul, out, &[a, b], &[])
}
