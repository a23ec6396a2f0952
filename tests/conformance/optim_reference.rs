//! Test data and the error measure shared by the kernel and optimizer
//! checks: the same rule as `kernels/tests/` (a seeded generator, a
//! relative error with a floor per buffer).

use cistern::client::{Buffer, ComputeClient};
use cistern::kernels::Segment;

use super::common::ok;

/// SplitMix64: tiny, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1) per element.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| 2.0 * self.unit() - 1.0).collect()
    }

    /// Magnitudes in [0.5, 1.5) with random signs: parameters that stay far
    /// from 0 over a few small steps.
    pub fn params(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let magnitude = 0.5 + self.unit();
                if self.unit() < 0.5 {
                    -magnitude
                } else {
                    magnitude
                }
            })
            .collect()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Segments of the given lengths, `gap` unused elements between
/// neighbours; returns them with the buffer length.
pub fn segments(lens: &[usize], gap: usize) -> (Vec<Segment>, usize) {
    let mut offset = 0;
    let mut out = Vec::with_capacity(lens.len());
    for &len in lens {
        out.push(Segment::new(offset, len));
        offset += len + gap;
    }
    (out, offset)
}

pub use cistern::optim::parity::{PARAM_FLOOR, STATE_FLOOR, TOLERANCE, max_relative_error};

/// Asserts a device result matches the host reference within [`TOLERANCE`].
pub fn assert_close(got: &[f32], want: &[f32], what: &str) {
    let want: Vec<f64> = want.iter().map(|&w| f64::from(w)).collect();
    let error = max_relative_error(got, &want, PARAM_FLOOR);
    assert!(error <= TOLERANCE, "{what}: max relative error {error:e}");
}

/// All of `buffer` as `f32`s.
pub fn download(client: &ComputeClient, buffer: &Buffer) -> Vec<f32> {
    ok(client.download_f32(buffer), "download_f32")
}
