//! `bench gemm`'s cuBLAS reference in a build without the `cuda` feature:
//! there is no CUDA device then, so it is never opened.

use cistern_kernels::GemmSpec;

/// Stands in for the cuBLAS reference; no value of it exists.
pub(super) enum Cublas {}

impl Cublas {
    /// Always the reason: this build has no CUDA.
    pub(super) fn open(_ordinal: usize) -> Result<Cublas, String> {
        Err("this build has no CUDA (the `cuda` feature)".into())
    }

    /// Never called: no `Cublas` exists.
    pub(super) fn prepare(&mut self, _: &GemmSpec, _: &[f32], _: &[f32]) -> Result<(), String> {
        match *self {}
    }

    /// Never called: no `Cublas` exists.
    pub(super) fn time(&mut self) -> Result<f64, String> {
        match *self {}
    }

    /// Never called: no `Cublas` exists.
    pub(super) fn result(&self) -> Result<Vec<f32>, String> {
        match *self {}
    }
}
