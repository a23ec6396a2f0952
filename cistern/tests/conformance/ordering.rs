//! Conflicting uses of memory on two streams are ordered by the server:
//! work that touches memory another stream wrote, or is writing, waits for
//! it; reads on two streams do not wait for each other.

use cistern::client::ComputeClient;
use cistern::runtime::{Device, DeviceOptions, FailureToken, FaultPlan, KernelLaunch, ServerError};

use super::common::{ok, open, open_with};

const ELEMENTS: u64 = 1 << 16;
const ROUNDS: u64 = 40;

fn ordering_waits(client: &ComputeClient) -> u64 {
    ok(client.server_stats(), "server_stats").ordering_waits
}

pub fn two_streams_hammering_one_buffer_see_each_others_writes_in_order(device: Device) {
    let client = open(device);
    let writer = ok(client.create_stream(), "create_stream");
    let reader = ok(client.create_stream(), "create_stream");
    let bytes = ELEMENTS * 4;
    let shared = ok(client.reserve(bytes), "reserve");
    let copies = ok(client.reserve(bytes * ROUNDS), "reserve");
    for round in 0..ROUNDS {
        // Read after write on the reader, write after read on the writer.
        let fill = KernelLaunch::fill(shared.whole(), round as f32);
        ok(client.launch(writer, fill), "fill");
        let copy = KernelLaunch::identity(shared.whole(), copies.range(round * bytes, bytes));
        ok(client.launch(reader, copy), "identity");
        ok(
            client.launch(writer, KernelLaunch::scale(shared.whole(), 3.0)),
            "scale",
        );
    }
    ok(client.sync(reader), "sync");
    ok(client.sync(writer), "sync");
    let seen = ok(client.download_f32(&copies), "download");
    for round in 0..ROUNDS {
        let start = (round * ELEMENTS) as usize;
        let slot = &seen[start..start + ELEMENTS as usize];
        assert!(
            slot.iter().all(|&value| value == round as f32),
            "round {round}: the copy saw {:?}, not the fill before it",
            &slot[..4]
        );
    }
    let last = ok(client.download_f32(&shared), "download");
    assert!(last.iter().all(|&value| value == 3.0 * (ROUNDS - 1) as f32));
    // How many conflicts were still in flight depends on timing; some were.
    assert!(
        ordering_waits(&client) > 0,
        "the server ordered the conflicts"
    );
}

pub fn an_upload_on_the_default_stream_is_used_at_once_by_another_stream(device: Device) {
    let client = open(device);
    let stream = ok(client.create_stream(), "create_stream");
    let values: Vec<f32> = (0..ELEMENTS).map(|i| i as f32 * 0.5).collect();
    // Keep the default stream busy, so the upload is still queued when
    // the other stream's launch arrives.
    let busy = ok(client.reserve(16 * ELEMENTS * 4), "reserve");
    for _ in 0..16 {
        let scale = KernelLaunch::scale(busy.whole(), 1.0);
        ok(client.launch(client.default_stream(), scale), "scale");
    }
    let before = ordering_waits(&client);
    let source = ok(client.upload_f32(&values), "upload");
    let target = ok(client.reserve(ELEMENTS * 4), "reserve");
    let copy = KernelLaunch::identity(source.whole(), target.whole());
    ok(client.launch(stream, copy), "identity");
    let bytes = ok(client.read_on(stream, &target, 0, ELEMENTS * 4), "read");
    let copied: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let wrong = copied.iter().zip(&values).filter(|(a, b)| a != b).count();
    assert_eq!(wrong, 0, "{wrong} elements differ from the upload");
    assert!(
        ordering_waits(&client) > before,
        "the use waited for the upload"
    );
}

pub fn reads_of_one_buffer_on_two_streams_do_not_wait_for_each_other(device: Device) {
    let client = open(device);
    let first = ok(client.create_stream(), "create_stream");
    let second = ok(client.create_stream(), "create_stream");
    let source = ok(client.upload_f32(&[2.0; 1024]), "upload");
    ok(client.sync(client.default_stream()), "sync");
    let a = ok(client.reserve(4096), "reserve");
    let b = ok(client.reserve(4096), "reserve");
    let before = ordering_waits(&client);
    ok(
        client.launch(first, KernelLaunch::identity(source.whole(), a.whole())),
        "identity",
    );
    ok(
        client.launch(second, KernelLaunch::identity(source.whole(), b.whole())),
        "identity",
    );
    ok(client.sync(first), "sync");
    ok(client.sync(second), "sync");
    assert_eq!(ordering_waits(&client), before, "two readers never wait");
    assert_eq!(ok(client.download_f32(&b), "download"), vec![2.0; 1024]);
}

/// A batch that consumes other work's results runs only if none of that
/// work failed, as its stream finds just before it would run: a launch
/// refused as a racing capture refuses it leaves its output stale while
/// the work after it runs (what a store's step must never consume).
pub fn a_batch_requiring_failed_work_runs_none_of_it_and_answers_that_failure(device: Device) {
    let options = DeviceOptions::with_memory_limit(16 << 20)
        .with_faults(FaultPlan::none().with_busy_launch(1));
    let client = open_with(device, options);
    let consumer = ok(client.create_stream(), "create_stream");
    let produced = ok(client.upload_f32(&[0.0; 64]), "upload");
    let target = ok(client.upload_f32(&[0.0; 64]), "upload");
    let producer = client.default_stream();
    let refused = ok(
        client.launch_tracked(producer, KernelLaunch::fill(produced.whole(), 1.0)),
        "launch",
    );
    let fill = || vec![KernelLaunch::fill(target.whole(), 7.0)];
    let requiring = client.launch_batch_requiring(consumer, fill(), vec![refused.clone()]);
    let answer = ok(requiring, "launch_batch_requiring").wait();
    assert!(
        matches!(answer, Err(ServerError::CaptureInProgress { .. })),
        "{device:?}: {answer:?}"
    );
    assert_eq!(
        refused.wait(),
        answer,
        "{device:?}: the required work's own failure"
    );
    assert_eq!(ok(client.download_f32(&target), "download"), vec![0.0; 64]);
    // Work that succeeded, or has not settled, does not hold a batch back.
    let ran = ok(
        client.launch_tracked(producer, KernelLaunch::fill(produced.whole(), 2.0)),
        "launch",
    );
    ok(ran.wait(), "the second launch");
    let requires = vec![ran, FailureToken::new()];
    let requiring = client.launch_batch_requiring(consumer, fill(), requires);
    ok(ok(requiring, "launch_batch_requiring").wait(), "the batch");
    assert_eq!(ok(client.download_f32(&target), "download"), vec![7.0; 64]);
}
