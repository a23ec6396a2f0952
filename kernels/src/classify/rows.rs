//! The row loops of the classification kernels: a row's maximum and
//! log-sum-exp, and its scaled softmax, with a call-free `expf` so that
//! they vectorise, compiled for the widest vector unit present.

/// `(max, ln Σ exp(x − max))` of one row: `log_sum_exp = max + the second`.
pub(super) fn row_log_sum_exp(row: &[f32]) -> (f32, f32) {
    (row_kernels().log_sum_exp)(row)
}

/// `out ← coefficient·softmax(row)`: one exponential per element (written,
/// summed, then scaled by `coefficient / Σ`).
pub(super) fn scaled_softmax(row: &[f32], coefficient: f32, out: &mut [f32]) {
    (row_kernels().scaled_softmax)(row, coefficient, out)
}

/// `out ← softmax` of each `cols`-wide row of `x`, for rows narrower than
/// [`LANES`]: the exponentials of a block of rows taken in lanes together
/// (one row alone would leave the lanes empty); the same values as
/// [`scaled_softmax`] with a coefficient of 1.
pub(super) fn narrow_softmax(x: &[f32], cols: usize, out: &mut [f32]) {
    (row_kernels().narrow_softmax)(x, cols, out)
}

/// The row loops, compiled for the widest vector unit present: the same
/// source (`*_body`, inlined into each), so the same rounding (Rust never
/// contracts to FMA), only more lanes at a time.
struct RowKernels {
    log_sum_exp: fn(&[f32]) -> (f32, f32),
    scaled_softmax: fn(&[f32], f32, &mut [f32]),
    narrow_softmax: fn(&[f32], usize, &mut [f32]),
}

fn row_kernels() -> &'static RowKernels {
    static KERNELS: std::sync::OnceLock<RowKernels> = std::sync::OnceLock::new();
    KERNELS.get_or_init(|| {
        crate::wide::widest!(
            avx512: RowKernels {
                log_sum_exp: wide::log_sum_exp_avx512,
                scaled_softmax: wide::scaled_softmax_avx512,
                narrow_softmax: wide::narrow_softmax_avx512,
            },
            avx2: RowKernels {
                log_sum_exp: wide::log_sum_exp_avx2,
                scaled_softmax: wide::scaled_softmax_avx2,
                narrow_softmax: wide::narrow_softmax_avx2,
            },
            plain: RowKernels {
                log_sum_exp: log_sum_exp_body,
                scaled_softmax: scaled_softmax_body,
                narrow_softmax: narrow_softmax_body,
            },
        )
    })
}

/// The AVX2 and AVX-512 instances of the row loops.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{log_sum_exp_body, narrow_softmax_body, scaled_softmax_body};

    crate::wide::x86_instances!(
        log_sum_exp_body(row: &[f32]) -> (f32, f32);
        "avx2" => log_sum_exp_avx2,
        "avx512f" => log_sum_exp_avx512,
    );
    crate::wide::x86_instances!(
        scaled_softmax_body(row: &[f32], coefficient: f32, out: &mut [f32]);
        "avx2" => scaled_softmax_avx2,
        "avx512f" => scaled_softmax_avx512,
    );
    crate::wide::x86_instances!(
        narrow_softmax_body(x: &[f32], cols: usize, out: &mut [f32]);
        "avx2" => narrow_softmax_avx2,
        "avx512f" => narrow_softmax_avx512,
    );
}

/// [`row_log_sum_exp`]'s loop: lanes each for the maximum and the sum, so
/// both vectorise.
#[inline(always)]
fn log_sum_exp_body(row: &[f32]) -> (f32, f32) {
    let max = row_max(row);
    let mut sums = [0.0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (sum, &x) in sums.iter_mut().zip(chunk) {
            *sum += exp(x - max);
        }
    }
    let sum = sums.iter().sum::<f32>() + tail.iter().map(|&x| exp(x - max)).sum::<f32>();
    (max, sum.ln())
}

/// [`scaled_softmax`]'s loops: `exp(x − max)` written and summed in lanes,
/// then scaled.
#[inline(always)]
fn scaled_softmax_body(row: &[f32], coefficient: f32, out: &mut [f32]) {
    let max = row_max(row);
    let mut sums = [0.0f32; LANES];
    let mut written = out.chunks_exact_mut(LANES);
    let mut read = row.chunks_exact(LANES);
    for (out, chunk) in (&mut written).zip(&mut read) {
        for ((sum, out), &x) in sums.iter_mut().zip(out.iter_mut()).zip(chunk) {
            *out = exp(x - max);
            *sum += *out;
        }
    }
    let mut sum = sums.iter().sum::<f32>();
    for (out, &x) in written.into_remainder().iter_mut().zip(read.remainder()) {
        *out = exp(x - max);
        sum += *out;
    }
    let scale = coefficient / sum;
    for out in out.iter_mut() {
        *out *= scale;
    }
}

/// [`narrow_softmax`]'s loops, a block of rows at a time: each row's
/// maximum taken off, the block's exponentials in lanes, then each row's
/// sum (in order, as [`scaled_softmax_body`]'s tail) and scale.
#[inline(always)]
fn narrow_softmax_body(x: &[f32], cols: usize, out: &mut [f32]) {
    if cols == 0 {
        return;
    }
    let block = NARROW_BLOCK_ROWS * cols;
    for (x, out) in x.chunks(block).zip(out.chunks_mut(block)) {
        for (x, out) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
            // A plain fold: `row_max`'s empty lanes would cost more than the row.
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for (out, &x) in out.iter_mut().zip(x) {
                *out = x - max;
            }
        }
        for out in out.iter_mut() {
            *out = exp(*out);
        }
        for out in out.chunks_exact_mut(cols) {
            let scale = 1.0 / out.iter().sum::<f32>();
            for out in out.iter_mut() {
                *out *= scale;
            }
        }
    }
}

/// Rows of a block of [`narrow_softmax_body`]: a few kilobytes, so the
/// block stays in the L1 cache between its passes.
const NARROW_BLOCK_ROWS: usize = 64;

/// A row's maximum, in lanes (NaN ignored, as `f32::max`).
#[inline(always)]
fn row_max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x);
        }
    }
    tail.iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Lanes of the row loops (one AVX-512 register, two AVX ones).
pub(super) const LANES: usize = 16;

/// `eˣ` in f32 without a call, so that row loops vectorise: Cephes' `expf`
/// (a rounding to `k = round(x·log₂e)`, `r = x − k·ln 2` in two parts, a
/// degree-6 polynomial), within 2 ulp of `f32::exp` over the range used
/// here (x ≤ 0 after a row's maximum is taken off). Below −87 it gives
/// about 1e-38 rather than 0, above 88 about 1.6e38 rather than ∞; a NaN
/// stays NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * std::f32::consts::LOG2_E + SHIFT;
    let k = shifted - SHIFT;
    let r = x - k * 0.693_359_4 - k * -2.121_944_4e-4;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * z + r + 1.0;
    // k is in [−126, 127]: a normal power of two.
    let power = f32::from_bits(((shifted.to_bits() as i32 - 0x4B40_0000 + 127) as u32) << 23);
    y * power
}
