#![allow(dead_code)] // each is used once a definition calls it

//! The functions an element-wise kernel's expression may call, for the CPU
//! body: the same names WGSL has built in and the CUDA program defines
//! (`table.rs`), each over `f32`.

/// `eˣ`.
pub(crate) fn exp(x: f32) -> f32 {
    x.exp()
}

/// The natural logarithm.
pub(crate) fn log(x: f32) -> f32 {
    x.ln()
}

/// The hyperbolic tangent.
pub(crate) fn tanh(x: f32) -> f32 {
    x.tanh()
}

/// The square root.
pub(crate) fn sqrt(x: f32) -> f32 {
    x.sqrt()
}

/// The absolute value.
pub(crate) fn abs(x: f32) -> f32 {
    x.abs()
}

/// The larger of two values (the other where one is NaN, as CUDA's `fmaxf`).
pub(crate) fn max(a: f32, b: f32) -> f32 {
    a.max(b)
}

/// The smaller of two values (the other where one is NaN, as CUDA's `fminf`).
pub(crate) fn min(a: f32, b: f32) -> f32 {
    a.min(b)
}
