//! Test data and the error measure shared by the kernel and optimizer
//! checks: the same rule as `kernels/tests/` (seeded data from
//! `SplitMix64`, a relative error with a floor per buffer).

use cistern::client::{Buffer, ComputeClient};
use cistern::kernels::Segment;

use super::common::ok;

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
