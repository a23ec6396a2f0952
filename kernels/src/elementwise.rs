//! Elementwise kernels: fill, copy, scale, axpy, add, mul.

use crate::KernelError;
use crate::parallel::{for_each_mut, zip_mut, zip2_mut};

/// Sets every element of `dst` to `value`.
pub fn fill(dst: &mut [f32], value: f32) {
    for_each_mut(dst, |d| d.fill(value));
}

/// Copies `src` into `dst` (also the catalogue's `identity` kernel).
pub fn copy(src: &[f32], dst: &mut [f32]) -> Result<(), KernelError> {
    KernelError::check_len("dst", src.len(), dst.len())?;
    zip_mut(dst, src, |d, s| d.copy_from_slice(s));
    Ok(())
}

/// `x ← s·x`.
pub fn scale(x: &mut [f32], s: f32) {
    for_each_mut(x, |x| x.iter_mut().for_each(|v| *v *= s));
}

/// In-place axpy: `a ← a + s·c`.
pub fn axpy(a: &mut [f32], s: f32, c: &[f32]) -> Result<(), KernelError> {
    KernelError::check_len("c", a.len(), c.len())?;
    zip_mut(a, c, |a, c| {
        for (a, &c) in a.iter_mut().zip(c) {
            *a += s * c;
        }
    });
    Ok(())
}

/// `out ← a + b`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    KernelError::check_len("b", a.len(), b.len())?;
    KernelError::check_len("out", a.len(), out.len())?;
    zip2_mut(out, a, b, |o, a, b| {
        for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
            *o = a + b;
        }
    });
    Ok(())
}

/// `out ← a ⊙ b` (elementwise product).
pub fn mul(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    KernelError::check_len("b", a.len(), b.len())?;
    KernelError::check_len("out", a.len(), out.len())?;
    zip2_mut(out, a, b, |o, a, b| {
        for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
            *o = a * b;
        }
    });
    Ok(())
}
