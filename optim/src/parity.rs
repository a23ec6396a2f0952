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
/// `floor = floor_fraction · max|want|` over the finite wants. Compare it
/// with [`TOLERANCE`]. Equal values (the same infinity, or NaN for NaN)
/// are no error; any other pair with a NaN or an infinity in it is an
/// infinite one, so a non-finite result never passes as close.
///
/// # Panics
/// If the two buffers differ in length (a test bug).
pub fn max_relative_error(got: &[f32], want: &[f64], floor_fraction: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(0.0f64, |m, w| m.max(w.abs()));
    let floor = (floor_fraction * scale).max(f64::MIN_POSITIVE);
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let g = f64::from(g);
            if g == w || (g.is_nan() && w.is_nan()) {
                0.0
            } else if !g.is_finite() || !w.is_finite() {
                f64::INFINITY
            } else {
                (g - w).abs() / w.abs().max(floor)
            }
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::max_relative_error;

    #[test]
    fn a_nan_or_infinity_against_a_finite_reference_is_an_infinite_error() {
        let want = [1.0, 2.0, 3.0];
        assert_eq!(max_relative_error(&[1.0, 2.0, 3.0], &want, 1e-3), 0.0);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let got = [1.0, bad, 3.0];
            assert_eq!(max_relative_error(&got, &want, 1e-3), f64::INFINITY);
        }
    }

    #[test]
    fn matching_non_finite_values_are_no_error_and_an_infinite_reference_sets_no_floor() {
        let want = [f64::NAN, f64::INFINITY, 1.0];
        assert_eq!(
            max_relative_error(&[f32::NAN, f32::INFINITY, 1.0], &want, 1e-3),
            0.0
        );
        // An infinite want must not make the floor infinite and hide this.
        let error = max_relative_error(&[f32::NAN, f32::INFINITY, 1.5], &want, 1e-3);
        assert!((error - 0.5).abs() < 1e-12, "{error}");
        assert_eq!(
            max_relative_error(&[1.0, 1.0, 1.0], &want, 1e-3),
            f64::INFINITY
        );
    }
}
