//! Streams: order within one, independence across them, events joining them,
//! and memory reuse that follows stream order.

use cistern::runtime::{AllocationPolicy, Device, KernelLaunch};

use super::common::{ok, open};

pub fn work_on_one_stream_runs_in_order(device: Device) {
    let client = open(device);
    let stream = ok(client.create_stream(), "create_stream");
    let source = ok(client.reserve(4096), "reserve");
    let target = ok(client.reserve(4096), "reserve");
    for value in 1..=20 {
        ok(
            client.launch(stream, KernelLaunch::fill(source.whole(), value as f32)),
            "fill",
        );
    }
    ok(
        client.launch(
            stream,
            KernelLaunch::identity(source.whole(), target.whole()),
        ),
        "identity",
    );
    ok(
        client.launch(stream, KernelLaunch::fill(source.whole(), -1.0)),
        "fill",
    );
    let bytes = ok(client.read_on(stream, &target, 0, 4096), "read");
    assert!(bytes.chunks_exact(4).all(|c| c == 20.0f32.to_ne_bytes()));
    ok(client.sync(stream), "sync");
    assert_eq!(
        ok(client.download_f32(&source), "download"),
        vec![-1.0; 1024]
    );
}

pub fn an_event_orders_work_across_streams(device: Device) {
    let client = open(device);
    let producer = ok(client.create_stream(), "create_stream");
    let consumer = ok(client.create_stream(), "create_stream");
    let data = ok(client.reserve(1 << 16), "reserve");
    let copy = ok(client.reserve(1 << 16), "reserve");
    for value in 0..50 {
        ok(
            client.launch(producer, KernelLaunch::fill(data.whole(), value as f32)),
            "fill",
        );
    }
    let event = ok(client.record_event(producer), "record_event");
    ok(client.wait_event(consumer, &event), "wait_event");
    ok(
        client.launch(consumer, KernelLaunch::copy(data.whole(), copy.whole())),
        "copy",
    );
    let bytes = ok(client.read_on(consumer, &copy, 0, 1 << 16), "read");
    assert!(bytes.chunks_exact(4).all(|c| c == 49.0f32.to_ne_bytes()));
}

pub fn independent_streams_each_finish_their_own_work(device: Device) {
    let client = open(device);
    let streams: Vec<_> = (0..4)
        .map(|_| ok(client.create_stream(), "create_stream"))
        .collect();
    let buffers: Vec<_> = streams
        .iter()
        .map(|_| ok(client.reserve(1024), "reserve"))
        .collect();
    for (index, (stream, buffer)) in streams.iter().zip(&buffers).enumerate() {
        ok(
            client.launch(*stream, KernelLaunch::fill(buffer.whole(), index as f32)),
            "fill",
        );
    }
    for (index, (stream, buffer)) in streams.iter().zip(&buffers).enumerate() {
        ok(client.sync(*stream), "sync");
        let values = ok(client.download_f32(buffer), "download");
        assert_eq!(values, vec![index as f32; 256]);
        ok(client.destroy_stream(*stream), "destroy_stream");
    }
}

pub fn the_empty_kernel_is_counted_once_per_launch(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let before = ok(client.server_stats(), "server_stats");
    for _ in 0..500 {
        ok(client.launch(stream, KernelLaunch::empty()), "launch");
    }
    ok(client.sync(stream), "sync");
    let after = ok(client.server_stats(), "server_stats");
    assert_eq!(after.empty_kernel_runs - before.empty_kernel_runs, 500);
    assert_eq!(after.launches - before.launches, 500);
    assert_eq!(after.syncs - before.syncs, 1);
}

pub fn freed_memory_is_reused_in_stream_order(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let other = ok(client.create_stream(), "create_stream");
    let size = 1 << 20;
    let first = ok(client.reserve(size), "reserve");
    ok(
        client.launch(stream, KernelLaunch::fill(first.whole(), 1.0)),
        "fill",
    );
    let allocs = ok(client.memory_stats(), "memory_stats").storage_allocs;
    drop(first);
    // The stream that used it may reuse it at once: no new storage.
    let second = ok(client.reserve(size), "reserve");
    ok(
        client.launch(stream, KernelLaunch::fill(second.whole(), 2.0)),
        "fill",
    );
    drop(second);
    ok(client.sync(stream), "sync");
    // Another stream may reuse it once the user has completed.
    let third = ok(
        client.reserve_with(size, AllocationPolicy::Allow, other),
        "reserve",
    );
    ok(
        client.launch(other, KernelLaunch::fill(third.whole(), 3.0)),
        "fill",
    );
    ok(client.sync(other), "sync");
    assert_eq!(
        ok(client.memory_stats(), "memory_stats").storage_allocs,
        allocs
    );
    assert_eq!(
        ok(client.download_f32(&third), "download"),
        vec![3.0; (size / 4) as usize]
    );
}
