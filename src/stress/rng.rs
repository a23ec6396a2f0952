//! `Rng`: a small seeded generator (SplitMix64), so a workload is the same
//! sequence on every platform and in every build.

/// A deterministic pseudo-random generator. Not for cryptography.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose sequence depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// A generator for stream `index` of `seed`: distinct indices give
    /// unrelated sequences.
    pub fn derived(seed: u64, index: u64) -> Self {
        Rng::new(mix(seed ^ mix(index.wrapping_add(0x5851_F42D_4C95_7F2D))))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix(self.state)
    }

    /// A uniform value in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform value in `[low, high)`.
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.unit()
    }

    /// A uniform integer in `[low, high]` (inclusive, as Python's `randint`).
    pub fn range_inclusive(&mut self, low: u64, high: u64) -> u64 {
        debug_assert!(low <= high);
        let span = high - low;
        if span == u64::MAX {
            return self.next_u64();
        }
        low + self.next_u64() % (span + 1)
    }

    /// A uniform index below `len` (`len` must be positive).
    pub fn below(&mut self, len: u64) -> u64 {
        debug_assert!(len > 0);
        self.next_u64() % len.max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// One of `choices`, uniformly (`choices` must not be empty).
    pub fn choose<T: Copy>(&mut self, choices: &[T]) -> T {
        debug_assert!(!choices.is_empty());
        choices[self.below(choices.len() as u64) as usize]
    }
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

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
    fn the_same_seed_gives_the_same_sequence() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn derived_streams_differ() {
        let a: Vec<u64> = (0..4).map(|_| Rng::derived(1, 0).next_u64()).collect();
        let mut b = Rng::derived(1, 1);
        assert_ne!(a[0], b.next_u64());
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut rng = Rng::new(3);
        for _ in 0..10_000 {
            let value = rng.range_inclusive(2, 8);
            assert!((2..=8).contains(&value));
            let unit = rng.unit();
            assert!((0.0..1.0).contains(&unit));
        }
    }
}
