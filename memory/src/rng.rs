//! `SplitMix64`: the one seeded generator of tests, fault plans, the stress
//! tool and the benchmarks, so a seed names the same sequence everywhere,
//! on every platform and in every build.

/// Vigna's SplitMix64: tiny, seedable, and good enough for test data and
/// fault decisions. Not for cryptography.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    /// The generator whose sequence depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The generator for stream `index` of `seed`: distinct indices give
    /// unrelated sequences.
    pub fn derived(seed: u64, index: u64) -> Self {
        SplitMix64::new(mix(seed ^ mix(index.wrapping_add(0x5851_F42D_4C95_7F2D))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix(self.state)
    }

    /// Uniform in `[0, 1)`, with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[0, 1)` as an `f32`, with 24 random bits.
    pub fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[low, high)`.
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.unit()
    }

    /// Uniform in `0..bound`; `0`, drawing nothing, when `bound` is `0`.
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next_u64() % bound
        }
    }

    /// Uniform in `low..=high` (inclusive, as Python's `randint`).
    pub fn range_inclusive(&mut self, low: u64, high: u64) -> u64 {
        debug_assert!(low <= high);
        let span = high - low;
        if span == u64::MAX {
            return self.next_u64();
        }
        low + self.next_u64() % (span + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// True with probability `percent`/100, drawn as `below(100) < percent`.
    pub fn chance_percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `choices`, uniformly (`choices` must not be empty).
    pub fn choose<T: Copy>(&mut self, choices: &[T]) -> T {
        debug_assert!(!choices.is_empty());
        choices[self.below(choices.len() as u64) as usize]
    }

    /// `n` values uniform in `[-1, 1)`.
    pub fn symmetric_f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| 2.0 * self.unit_f32() - 1.0).collect()
    }

    /// `n` values with magnitudes in `[scale/2, 3·scale/2)` and random signs:
    /// data that stays far from zero over a few small updates.
    pub fn non_zero_f32s(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let magnitude = scale * (0.5 + self.unit_f32());
                if self.unit_f32() < 0.5 {
                    -magnitude
                } else {
                    magnitude
                }
            })
            .collect()
    }
}

/// SplitMix64's finalizer: a fast, well-spread 64-bit hash.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_values_of_seed_zero_are_vignas_reference_values() {
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn the_same_seed_gives_the_same_sequence() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn derived_streams_differ() {
        let first = SplitMix64::derived(1, 0).next_u64();
        assert_ne!(first, SplitMix64::derived(1, 1).next_u64());
    }

    #[test]
    fn ranges_stay_in_bounds_and_below_zero_draws_nothing() {
        let mut rng = SplitMix64::new(3);
        for _ in 0..10_000 {
            assert!((2..=8).contains(&rng.range_inclusive(2, 8)));
            assert!((0.0..1.0).contains(&rng.unit()));
            assert!((0.0..1.0).contains(&rng.unit_f32()));
        }
        let mut drawn = SplitMix64::new(5);
        let mut untouched = drawn.clone();
        assert_eq!(drawn.below(0), 0);
        assert_eq!(drawn.next_u64(), untouched.next_u64());
    }

    #[test]
    fn non_zero_values_keep_their_magnitude_band() {
        let values = SplitMix64::new(9).non_zero_f32s(1000, 2.0);
        assert!(values.iter().all(|v| (1.0..3.0).contains(&v.abs())));
        assert!(values.iter().any(|v| *v < 0.0) && values.iter().any(|v| *v > 0.0));
    }
}
