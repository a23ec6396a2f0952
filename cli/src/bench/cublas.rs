//! `bench gemm`'s same-run reference on a CUDA device: `cublasSgemm`
//! called directly, on device buffers this module allocates itself through
//! cudarc's driver API (the backend's rule, raw pointers owned by the memory
//! manager, is the backend's, not this reference's), on its own stream of
//! the device's primary context.
//!
//! cuBLAS is loaded at run time, as the driver is: where the library, or
//! one of the symbols called here, is missing, [`Cublas::open`] says why and
//! nothing panics (cudarc's loader panics on a missing library or symbol,
//! so both are checked before the first call).
//!
//! Row-major `C = op(A)·op(B)` is the usual column-major call: a row-major
//! matrix read column-major is its transpose, so cuBLAS computes
//! `Cᵀ = op(B)ᵀ·op(A)ᵀ`, B's storage first and A's second, each with the
//! spec's own transpose ([`ColumnMajorCall::of`]).

use std::ffi::c_int;
use std::sync::Arc;
use std::time::Instant;

use cistern_kernels::GemmSpec;
use cudarc::cublas::{result, sys};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

/// The cuBLAS symbols called here: each is looked up before any call.
const SYMBOLS: [&str; 4] = [
    "cublasCreate_v2",
    "cublasSetStream_v2",
    "cublasSgemm_v2",
    "cublasDestroy_v2",
];

/// The `cublasSgemm` arguments that compute a spec's row-major C.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ColumnMajorCall {
    /// cuBLAS's m: the spec's n.
    pub m: usize,
    /// cuBLAS's n: the spec's m.
    pub n: usize,
    /// The shared dimension.
    pub k: usize,
    /// Whether the first operand, B's storage, is transposed: `transpose_b`.
    pub transpose_first: bool,
    /// Whether the second operand, A's storage, is transposed: `transpose_a`.
    pub transpose_second: bool,
    /// B's row length as stored.
    pub ld_first: usize,
    /// A's row length as stored.
    pub ld_second: usize,
    /// C's row length: the spec's n.
    pub ldc: usize,
}

impl ColumnMajorCall {
    /// The call computing `spec`'s product (bias and activation aside).
    pub(super) fn of(spec: &GemmSpec) -> ColumnMajorCall {
        let GemmSpec {
            m,
            n,
            k,
            transpose_a,
            transpose_b,
            ..
        } = *spec;
        ColumnMajorCall {
            m: n,
            n: m,
            k,
            transpose_first: transpose_b,
            transpose_second: transpose_a,
            // Row lengths as stored: B is n×k transposed, else k×n; A is
            // k×m transposed, else m×k.
            ld_first: if transpose_b { k } else { n },
            ld_second: if transpose_a { m } else { k },
            ldc: n,
        }
    }
}

/// cuBLAS on one CUDA device, holding the buffers of the shape last prepared.
/// Fields drop in order: buffers, then the handle, then the stream.
pub(super) struct Cublas {
    product: Option<Product>,
    handle: Handle,
    stream: Arc<CudaStream>,
}

/// One shape's call and its device buffers: B's storage, A's, C.
struct Product {
    call: ColumnMajorCall,
    first: CudaSlice<f32>,
    second: CudaSlice<f32>,
    c: CudaSlice<f32>,
}

/// A cuBLAS handle, destroyed on drop; a failure then is ignored (cudarc's
/// own `CudaBlas` panics on it, which a faulted device could reach).
struct Handle(sys::cublasHandle_t);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: made by `create_handle` in `open`, destroyed only here.
        let _ = unsafe { result::destroy_handle(self.0) };
    }
}

impl Cublas {
    /// cuBLAS on CUDA device `ordinal` (already opened by the bench's
    /// client, so the driver is here); the reason where it cannot be used.
    pub(super) fn open(ordinal: usize) -> Result<Cublas, String> {
        // SAFETY: only tries to open the library by its usual names.
        if !unsafe { sys::is_culib_present() } {
            return Err("no cuBLAS library (libcublas) found".into());
        }
        // SAFETY: the library is present (above), so `culib` opens it
        // rather than panicking.
        let library = unsafe { sys::culib() };
        for symbol in SYMBOLS {
            // SAFETY: the symbol is only looked up here, never called
            // through this type.
            if unsafe { library.get::<unsafe extern "C" fn()>(symbol.as_bytes()) }.is_err() {
                return Err(format!("the cuBLAS library has no {symbol}"));
            }
        }
        let context = CudaContext::new(ordinal).map_err(driver("the primary context"))?;
        // One stream uses every buffer here, so cudarc's per-use events
        // would only add work inside the timed call.
        // SAFETY: set before any buffer or stream of this context is made.
        unsafe { context.disable_event_tracking() };
        let stream = context.new_stream().map_err(driver("a stream"))?;
        let handle = Handle(result::create_handle().map_err(blas("cublasCreate"))?);
        // SAFETY: a live handle and a live stream of the current context.
        unsafe { result::set_stream(handle.0, stream.cu_stream() as _) }
            .map_err(blas("cublasSetStream"))?;
        Ok(Cublas {
            product: None,
            handle,
            stream,
        })
    }

    /// Uploads row-major `a` and `b` of `spec` and a zeroed C, replacing
    /// the last shape's buffers.
    pub(super) fn prepare(&mut self, spec: &GemmSpec, a: &[f32], b: &[f32]) -> Result<(), String> {
        let GemmSpec { m, n, k, .. } = *spec;
        if a.len() != m * k || b.len() != k * n || m * n * k == 0 {
            return Err(format!("cuBLAS: buffers do not match {spec:?}"));
        }
        self.product = None;
        let first = self.stream.clone_htod(b).map_err(driver("upload"))?;
        let second = self.stream.clone_htod(a).map_err(driver("upload"))?;
        let c = self
            .stream
            .alloc_zeros::<f32>(m * n)
            .map_err(driver("alloc"))?;
        self.product = Some(Product {
            call: ColumnMajorCall::of(spec),
            first,
            second,
            c,
        });
        Ok(())
    }

    /// Seconds for one product of the prepared shape, issued and synchronized.
    pub(super) fn time(&mut self) -> Result<f64, String> {
        let Some(product) = self.product.as_mut() else {
            return Err("cuBLAS: no shape prepared".into());
        };
        let call = product.call;
        let int = |value: usize| {
            c_int::try_from(value).map_err(|_| format!("cuBLAS: {value} does not fit an int"))
        };
        let (m, n, k) = (int(call.m)?, int(call.n)?, int(call.k)?);
        let (lda, ldb, ldc) = (int(call.ld_first)?, int(call.ld_second)?, int(call.ldc)?);
        let op = |transposed| {
            if transposed {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (first, _first_use) = product.first.device_ptr(&self.stream);
        let (second, _second_use) = product.second.device_ptr(&self.stream);
        let (c, _c_use) = product.c.device_ptr_mut(&self.stream);
        let start = Instant::now();
        // SAFETY: the three pointers are live buffers of this context holding
        // B, A and C exactly (lengths checked in `prepare`); `ColumnMajorCall`
        // gives dimensions and leading dimensions that address them within;
        // alpha and beta are host values (the handle's default pointer mode)
        // that outlive the call, which is synchronized below.
        unsafe {
            result::sgemm(
                self.handle.0,
                op(call.transpose_first),
                op(call.transpose_second),
                m,
                n,
                k,
                &alpha,
                first as *const f32,
                lda,
                second as *const f32,
                ldb,
                &beta,
                c as *mut f32,
                ldc,
            )
        }
        .map_err(blas("cublasSgemm"))?;
        self.stream.synchronize().map_err(driver("synchronize"))?;
        Ok(start.elapsed().as_secs_f64())
    }

    /// The prepared shape's C as cuBLAS last wrote it, row-major.
    pub(super) fn result(&self) -> Result<Vec<f32>, String> {
        let Some(product) = self.product.as_ref() else {
            return Err("cuBLAS: no shape prepared".into());
        };
        let c = self
            .stream
            .clone_dtoh(&product.c)
            .map_err(driver("download"))?;
        self.stream.synchronize().map_err(driver("synchronize"))?;
        Ok(c)
    }
}

fn driver(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> String {
    move |e| format!("cuBLAS reference: {what}: {e}")
}

fn blas(what: &'static str) -> impl Fn(result::CublasError) -> String {
    move |e| format!("{what}: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row-major `op(A)·op(B)` as `GemmSpec` defines it.
    fn row_major(spec: &GemmSpec, a: &[f32], b: &[f32]) -> Vec<f32> {
        let GemmSpec { m, n, k, .. } = *spec;
        let op_a = |i: usize, p: usize| {
            if spec.transpose_a {
                a[p * m + i]
            } else {
                a[i * k + p]
            }
        };
        let op_b = |p: usize, j: usize| {
            if spec.transpose_b {
                b[j * k + p]
            } else {
                b[p * n + j]
            }
        };
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| op_a(i, p) * op_b(p, j)).sum();
            }
        }
        c
    }

    /// `cublasSgemm`'s definition, column-major, alpha 1 and beta 0.
    fn column_major(call: &ColumnMajorCall, first: &[f32], second: &[f32]) -> Vec<f32> {
        let op_first = |i: usize, p: usize| {
            if call.transpose_first {
                first[p + i * call.ld_first]
            } else {
                first[i + p * call.ld_first]
            }
        };
        let op_second = |p: usize, j: usize| {
            if call.transpose_second {
                second[j + p * call.ld_second]
            } else {
                second[p + j * call.ld_second]
            }
        };
        let mut c = vec![0.0; call.ldc * call.n];
        for j in 0..call.n {
            for i in 0..call.m {
                c[i + j * call.ldc] = (0..call.k).map(|p| op_first(i, p) * op_second(p, j)).sum();
            }
        }
        c
    }

    #[test]
    fn the_column_major_call_computes_the_row_major_product_for_every_transpose() {
        let (m, n, k) = (3, 5, 4);
        // Small integers: both orders of summation are exact.
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
        for (transpose_a, transpose_b) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let spec = GemmSpec {
                m,
                n,
                k,
                transpose_a,
                transpose_b,
                ..Default::default()
            };
            let call = ColumnMajorCall::of(&spec);
            assert_eq!((call.m, call.n, call.k), (n, m, k));
            assert!(call.ld_first >= if transpose_b { call.k } else { call.m });
            assert!(call.ld_second >= if transpose_a { call.n } else { call.k });
            assert_eq!(
                column_major(&call, &b, &a),
                row_major(&spec, &a, &b),
                "transpose_a {transpose_a}, transpose_b {transpose_b}"
            );
        }
    }
}
