//! Work over more bytes than a device binds at once: lavapipe binds at
//! most 128 MiB of a storage buffer, so the wgpu backend cuts such work
//! into chunks of bindings; every element must still be covered, once.

use cistern::client::{Buffer, ComputeClient};
use cistern::kernels::Segment;
use cistern::optim::{OptimizerConfig, SgdConfig};
use cistern::runtime::{Device, DeviceOptions, KernelLaunch, OptimizerStep};

use super::common::{ok, open_with};

/// The largest storage binding the wgpu backend may meet (lavapipe's, and
/// wgpu's default cap).
const WGPU_BINDING: u64 = 128 << 20;

/// Bytes per checked window.
const WINDOW: u64 = 64 << 10;

/// Checks that every float of the windows of `buffer` at the start, on
/// both sides of each multiple of the binding, in the middle and at the
/// end, is `want`.
fn windows_hold(client: &ComputeClient, buffer: &Buffer, want: f32, what: &str) {
    let size = buffer.size();
    let mut starts = vec![0, size / 2, size - WINDOW];
    let mut edge = WGPU_BINDING;
    while edge < size {
        starts.extend([edge - WINDOW, edge]);
        edge += WGPU_BINDING;
    }
    for start in starts {
        let bytes = ok(client.read(buffer, start, WINDOW), what);
        for (index, word) in bytes.chunks_exact(4).enumerate() {
            let value = f32::from_ne_bytes([word[0], word[1], word[2], word[3]]);
            assert!(
                value == want,
                "{what}: byte {} holds {value}, not {want}",
                start + 4 * index as u64
            );
        }
    }
}

/// Fill, axpy and an SGD step over buffers past the largest storage
/// binding (on devices with no such limit, a few MiB) reach every element.
pub fn kernels_over_more_than_the_largest_storage_binding_cover_every_element(device: Device) {
    let bytes = match device {
        Device::Wgpu(_) => WGPU_BINDING + (4 << 20),
        Device::Cpu(_) | Device::Cuda(_) => 4 << 20,
    };
    let floats = (bytes / 4) as usize;
    let client = open_with(device, DeviceOptions::with_memory_limit(1 << 30));
    let stream = client.default_stream();
    let (a, c) = (
        ok(client.reserve(bytes), "a"),
        ok(client.reserve(bytes), "c"),
    );
    let launches = vec![
        KernelLaunch::fill(a.whole(), 2.0),
        KernelLaunch::fill(c.whole(), 1.0),
        KernelLaunch::axpy(a.whole(), 3.0, c.whole()),
    ];
    ok(
        client.launch_batch(stream, launches).and_then(|t| t.wait()),
        "fill, axpy",
    );
    windows_hold(&client, &a, 5.0, &format!("{device}: 2 + 3·1"));
    let config = OptimizerConfig::Sgd(SgdConfig {
        lr: 0.25,
        ..Default::default()
    });
    let step = OptimizerStep::new(
        config,
        1,
        vec![Segment::new(0, floats)],
        a.whole(),
        c.whole(),
        Vec::new(),
    );
    let token = ok(client.optimizer_step(stream, step), "sgd");
    ok(token.wait(), "sgd ran");
    windows_hold(&client, &a, 4.75, &format!("{device}: 5 − 0.25·1"));
}
