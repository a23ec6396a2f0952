//! Test data and the error measure shared by the kernel and optimizer
//! checks: the same rule as `kernels/tests/` (seeded data from
//! `SplitMix64`, a relative error with a floor per buffer).

use cistern::client::{Buffer, ComputeClient};
use cistern::kernels::Segment;
use cistern::runtime::Device;

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
    assert_within(got, want, TOLERANCE, what);
}

/// The error allowed against the CPU kernels on `device`, for kernels
/// whose result cancels: the CPU is held to [`TOLERANCE`]; another device
/// rounds in f32 too, but differently (its transcendentals are within a few
/// ulp rather than the host libm's one, it may contract to FMA, a GEMM sums
/// in another order), and where the result cancels (`1 − tanh²` near
/// saturation, a dot product of mixed signs) one ulp of difference in the
/// terms is several ulp of the result: up to 1e-4 relative to the floor.
pub fn cancelling_tolerance(device: Device) -> f64 {
    match device {
        Device::Cpu(_) => TOLERANCE,
        Device::Wgpu(_) | Device::Cuda(_) => 1e-4,
    }
}

/// As [`assert_close`], within `tolerance`.
pub fn assert_within(got: &[f32], want: &[f32], tolerance: f64, what: &str) {
    let want: Vec<f64> = want.iter().map(|&w| f64::from(w)).collect();
    let error = max_relative_error(got, &want, PARAM_FLOOR);
    assert!(error <= tolerance, "{what}: max relative error {error:e}");
}

/// All of `buffer` as `f32`s.
pub fn download(client: &ComputeClient, buffer: &Buffer) -> Vec<f32> {
    ok(client.download_f32(buffer), "download_f32")
}
