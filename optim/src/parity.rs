//! The rule every fast optimizer kernel is held to against [`crate::reference`].

/// The largest error a kernel may show against the f64 reference.
pub const TOLERANCE: f64 = 1e-5;
/// The floor fraction for parameters (they stay far from 0 in the parity
/// tests, so this is a plain relative error).
pub const PARAM_FLOOR: f64 = 1e-3;
/// The floor fraction for optimizer state. Moments and momentum are signed
/// sums; an element small because its terms cancel is rounded by f32 to
/// about an ulp of the terms, so it is held to `1e-6 · max|buffer|` absolute
/// instead: `|got − want| ≤ 1e-5·|want| + 1e-6·max|want|`.
pub const STATE_FLOOR: f64 = 1e-1;

/// `|got − want| / max(|want|, floor)`, largest over the buffer, with
/// `floor = floor_fraction · max|want|`. Compare it with [`TOLERANCE`].
///
/// # Panics
/// If the two buffers differ in length (a test bug).
pub fn max_relative_error(got: &[f32], want: &[f64], floor_fraction: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    let floor = (floor_fraction * scale).max(f64::MIN_POSITIVE);
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            if f64::from(g) == w {
                0.0
            } else {
                (f64::from(g) - w).abs() / w.abs().max(floor)
            }
        })
        .fold(0.0, f64::max)
}
