//! Dropout from a counter-based generator: element `i` of a launch is kept
//! when a hash of `(seed, i)` clears a threshold, so the same seed gives
//! the same mask on every backend and the mask is never stored (backward
//! runs the same kernel over the output's gradient). The hash is
//! `lowbias32` (Chris Wellons), in 32-bit integer arithmetic that the CPU,
//! WGSL and CUDA bodies share bit for bit.

use serde::{Deserialize, Serialize};

use crate::KernelError;

/// One in 2^24: the resolution of a dropout probability.
const RESOLUTION: f64 = (1u32 << 24) as f64;

/// A dropout's seed, threshold and scale.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DropoutSpec {
    /// The generator's key.
    pub seed: u64,
    /// An element is dropped when the top 24 bits of its hash are below this.
    pub threshold: u32,
    /// The factor a kept element is multiplied by: `1/(1 − p)` (0 for `p = 1`).
    pub scale: f32,
}

impl DropoutSpec {
    /// Dropout with probability `p` (in `[0, 1]`) under `seed`.
    pub fn new(p: f32, seed: u64) -> Result<Self, KernelError> {
        if !(0.0..=1.0).contains(&p) {
            return Err(KernelError::invalid(
                "p",
                format!("{p} is not a probability"),
            ));
        }
        let threshold = (f64::from(p) * RESOLUTION).round() as u32;
        let scale = if p < 1.0 {
            (1.0 / (1.0 - f64::from(p))) as f32
        } else {
            0.0
        };
        Ok(DropoutSpec {
            seed,
            threshold,
            scale,
        })
    }

    /// Refuses a threshold past 2^24 and a non-finite scale.
    pub fn validate(&self) -> Result<(), KernelError> {
        if f64::from(self.threshold) > RESOLUTION {
            return Err(KernelError::invalid("threshold", "past 2^24"));
        }
        if !self.scale.is_finite() {
            return Err(KernelError::invalid("scale", "must be finite"));
        }
        Ok(())
    }

    /// The spec at step `step`: the seed plus `step << 32`, the mask a
    /// counted dropout draws when its counter holds `step`.
    pub fn at_step(&self, step: u32) -> DropoutSpec {
        DropoutSpec {
            seed: self.seed.wrapping_add(u64::from(step) << 32),
            ..*self
        }
    }

    /// Whether element `i` is kept.
    pub fn keeps(&self, i: u32) -> bool {
        (hash(self.seed, i) >> 8) >= self.threshold
    }
}

/// `lowbias32`: a 32-bit integer mix with low bias.
#[inline(always)]
pub fn mix(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// The hash of element `i` under `seed`.
pub fn hash(seed: u64, i: u32) -> u32 {
    let key = mix(seed as u32 ^ mix((seed >> 32) as u32));
    mix(i ^ key)
}

/// `out[i] ← keep(i) ? x[i]·scale : 0` over as many elements as `x`.
pub fn dropout(spec: &DropoutSpec, x: &[f32], out: &mut [f32]) -> Result<(), KernelError> {
    spec.validate()?;
    KernelError::check_len("out", x.len(), out.len())?;
    if u32::try_from(x.len()).is_err() {
        return Err(KernelError::invalid("x", "more than 2^32 elements"));
    }
    let key = mix(spec.seed as u32 ^ mix((spec.seed >> 32) as u32));
    (masked_loop())(key, spec.threshold, spec.scale, x, out);
    Ok(())
}

/// The mask's loop, `keeps` with the key taken once: integer multiplies
/// and shifts that vectorise, compiled for the widest unit present (the
/// same source, so the same bits).
type MaskedLoop = fn(u32, u32, f32, &[f32], &mut [f32]);

fn masked_loop() -> MaskedLoop {
    static CHOSEN: std::sync::OnceLock<MaskedLoop> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        crate::wide::widest!(
            avx512: wide::masked_avx512 as MaskedLoop,
            avx2: wide::masked_avx2 as MaskedLoop,
            plain: masked_body,
        )
    })
}

#[inline(always)]
fn masked_body(key: u32, threshold: u32, scale: f32, x: &[f32], out: &mut [f32]) {
    for (i, (out, &v)) in out.iter_mut().zip(x).enumerate() {
        let keep = (mix(i as u32 ^ key) >> 8) >= threshold;
        *out = if keep { v * scale } else { 0.0 };
    }
}

/// The AVX2 and AVX-512 instances of the mask's loop.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::masked_body;

    crate::wide::x86_instances!(
        masked_body(key: u32, threshold: u32, scale: f32, x: &[f32], out: &mut [f32]);
        "avx2" => masked_avx2,
        "avx512f" => masked_avx512,
    );
}

/// [`dropout`] under [`DropoutSpec::at_step`] of the step `counter` holds
/// (one `u32` in an `f32` word, as a store's step counter keeps it).
pub fn dropout_counted(
    spec: &DropoutSpec,
    x: &[f32],
    counter: &[f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    KernelError::check_len("counter", 1, counter.len())?;
    dropout(&spec.at_step(counter[0].to_bits()), x, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mask_keeps_about_one_minus_p_and_depends_on_the_seed() {
        let spec = DropoutSpec::new(0.25, 7).unwrap();
        let x = vec![1.0f32; 100_000];
        let mut out = vec![0.0; x.len()];
        dropout(&spec, &x, &mut out).unwrap();
        let kept = out.iter().filter(|&&v| v != 0.0).count() as f64 / x.len() as f64;
        assert!((kept - 0.75).abs() < 0.01, "{kept}");
        assert!(
            out.iter()
                .all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6)
        );
        let other = DropoutSpec::new(0.25, 8).unwrap();
        let differ = (0..1000)
            .filter(|&i| spec.keeps(i) != other.keeps(i))
            .count();
        assert!(differ > 200, "{differ}");
    }

    #[test]
    fn a_counted_dropout_draws_the_mask_of_its_step() {
        let spec = DropoutSpec::new(0.5, 0x1234_5678_9abc).unwrap();
        let x: Vec<f32> = (0..4096).map(|i| i as f32).collect();
        let (mut counted, mut plain) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        let counter = [f32::from_bits(7)];
        dropout_counted(&spec, &x, &counter, &mut counted).unwrap();
        let at_seven = DropoutSpec::new(0.5, 0x1234_5678_9abc + (7 << 32)).unwrap();
        dropout(&at_seven, &x, &mut plain).unwrap();
        assert_eq!(counted, plain);
        dropout(&spec, &x, &mut plain).unwrap();
        assert_ne!(counted, plain, "step 7's mask is not step 0's");
        assert!(dropout_counted(&spec, &x, &[], &mut counted).is_err());
    }

    #[test]
    fn the_vector_loop_keeps_what_keeps_says() {
        let spec = DropoutSpec::new(0.3, 0xfeed_0123_4567_89ab).unwrap();
        let x: Vec<f32> = (0..10_007).map(|i| 1.0 + i as f32).collect();
        let mut out = vec![0.0; x.len()];
        dropout(&spec, &x, &mut out).unwrap();
        for (i, (&got, &v)) in out.iter().zip(&x).enumerate() {
            let want = if spec.keeps(i as u32) {
                v * spec.scale
            } else {
                0.0
            };
            assert_eq!(got.to_bits(), want.to_bits(), "element {i}");
        }
    }

    #[test]
    fn p_zero_keeps_everything_and_p_one_drops_everything() {
        let x = [1.0, -2.0, 3.0];
        let mut out = [9.0; 3];
        dropout(&DropoutSpec::new(0.0, 1).unwrap(), &x, &mut out).unwrap();
        assert_eq!(out, x);
        dropout(&DropoutSpec::new(1.0, 1).unwrap(), &x, &mut out).unwrap();
        assert_eq!(out, [0.0; 3]);
        assert!(DropoutSpec::new(1.5, 1).is_err());
    }

    #[test]
    fn the_hash_is_pinned_so_every_backend_can_match_it() {
        // Golden values, computed independently (Python, 32-bit wrapping).
        assert_eq!(mix(0), 0);
        assert_eq!(mix(1), 0x6889_90c0);
        assert_eq!(mix(0xdead_beef), 0xe628_c683);
    }
}
