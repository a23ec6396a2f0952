//! What every tape test shares: a CPU client, results that must succeed,
//! and random tensors.

use std::fmt::Debug;

use cistern_client::{ComputeClient, Tensor};
use cistern_memory::SplitMix64;
use cistern_runtime::{Device, DeviceOptions};

/// A fresh CPU device with a small memory budget.
pub fn open() -> ComputeClient {
    open_with(DeviceOptions::with_memory_limit(64 << 20))
}

/// A fresh CPU device opened with `options`.
pub fn open_with(options: DeviceOptions) -> ComputeClient {
    ok(ComputeClient::open(Device::Cpu(0), options), "cpu:0 opens")
}

/// `result`'s value; the test fails naming `what` otherwise.
pub fn ok<T, E: Debug>(result: Result<T, E>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("{what}: {error:?}"),
    }
}

/// A tensor of `shape` with elements uniform in `[-1, 1]`, none within 0.05 of 0.
pub fn random(rng: &mut SplitMix64, shape: &[usize]) -> Tensor<f32> {
    let count = shape.iter().product();
    let data = (0..count)
        .map(|_| {
            let magnitude = rng.uniform(0.05, 1.0) as f32;
            if rng.chance(0.5) {
                magnitude
            } else {
                -magnitude
            }
        })
        .collect();
    ok(Tensor::new(shape, data), "a random tensor")
}

/// `tensor`'s elements in f64.
pub fn wide(tensor: &Tensor<f32>) -> Vec<f64> {
    tensor.data().iter().map(|&v| f64::from(v)).collect()
}
