//! `ComputeClient` behaviour beyond the backend conformance suite: handles,
//! clones and the order of frees.

use cistern_client::ComputeClient;
use cistern_runtime::{Device, DeviceOptions, KernelLaunch, ServerError};

fn open() -> ComputeClient {
    match ComputeClient::open(Device::Cpu(0), DeviceOptions::with_memory_limit(32 << 20)) {
        Ok(client) => client,
        Err(error) => panic!("cpu:0 opens: {error}"),
    }
}

fn ok<T>(result: Result<T, ServerError>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("call failed: {error}"),
    }
}

#[test]
fn dropping_the_last_handle_frees_its_allocation() {
    let client = open();
    let buffer = ok(client.upload_f32(&[1.0; 64]));
    let copy = buffer.clone();
    drop(buffer);
    assert_eq!(ok(client.memory_stats()).live_allocations, 1);
    drop(copy);
    // The free travels on the command channel, so it is served before this query.
    assert_eq!(ok(client.memory_stats()).live_allocations, 0);
    assert_eq!(ok(client.server_stats()).frees, 1);
}

#[test]
fn a_buffer_dropped_right_after_its_launch_is_freed_after_the_launch() {
    let client = open();
    let stream = client.default_stream();
    for _ in 0..100 {
        let buffer = ok(client.reserve(4096));
        ok(client.launch(stream, KernelLaunch::fill(buffer.whole(), 1.0)));
        drop(buffer);
    }
    ok(client.sync(stream));
    assert_eq!(ok(client.server_stats()).kernels_run, 100);
}

#[test]
fn clones_on_many_threads_share_one_server() {
    let client = open();
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let client = client.clone();
            std::thread::spawn(move || {
                for round in 0..50 {
                    let value = (worker * 100 + round) as f32;
                    let buffer = ok(client.upload_f32(&[value; 16]));
                    assert_eq!(ok(client.download_f32(&buffer)), vec![value; 16]);
                }
            })
        })
        .collect();
    for worker in workers {
        assert!(worker.join().is_ok());
    }
    let stats = ok(client.memory_stats());
    assert_eq!(stats.live_allocations, 0);
    assert_eq!(stats.reservations, 200);
}

#[test]
fn a_stream_created_by_one_clone_is_usable_by_another() {
    let client = open();
    let other = client.clone();
    let stream = ok(client.create_stream());
    let buffer = ok(other.reserve(64));
    ok(other.launch(stream, KernelLaunch::fill(buffer.whole(), 7.0)));
    ok(client.sync(stream));
    assert_eq!(ok(other.download_f32(&buffer)), vec![7.0; 16]);
}

#[test]
fn launches_sent_far_ahead_of_the_server_all_run_before_the_next_sync() {
    let client = open();
    let stream = client.default_stream();
    // Enough to pass the inbox backlog at which sends start yielding.
    let launches = 50_000;
    for _ in 0..launches {
        ok(client.launch(stream, KernelLaunch::empty()));
    }
    ok(client.sync(stream));
    let stats = ok(client.server_stats());
    assert_eq!(stats.launches, launches);
    assert_eq!(stats.empty_kernel_runs, launches);
}

#[test]
fn the_launch_log_holds_each_queued_launch_in_order_with_replayed_graphs_and_nothing_when_off() {
    let client = open();
    let stream = client.default_stream();
    let buffer = ok(client.reserve(4096));
    let fill = |value| KernelLaunch::fill(buffer.whole(), value);
    ok(client.launch(stream, fill(1.0)));
    assert!(
        ok(client.take_launch_log(true)).is_empty(),
        "off until started"
    );
    ok(client.launch(stream, fill(2.0)));
    ok(client
        .launch_batch(stream, vec![fill(3.0), fill(4.0)])
        .map(|_| ()));
    let (token, guard) = ok(client.begin_capture(stream));
    ok(token.launch_batch(vec![fill(5.0)]));
    let graph = ok(client.end_capture(guard));
    ok(client.replay(stream, &graph));
    // Refused launches are not queued, so not logged.
    let stale = KernelLaunch::fill(buffer.range(4000, 4096), 9.0);
    let _ = client.launch(stream, stale);
    let _ = client.sync(stream);
    let logged = ok(client.take_launch_log(false));
    assert_eq!(logged, vec![fill(2.0), fill(3.0), fill(4.0), fill(5.0)]);
    ok(client.launch(stream, fill(6.0)));
    assert!(ok(client.take_launch_log(false)).is_empty(), "stopped");
    // The log replays: its launches run again, in order.
    ok(client.launch_batch(stream, logged).map(|_| ()));
    let bytes = ok(client.read(&buffer, 0, 4));
    assert_eq!(
        f32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
        5.0
    );
}

#[test]
fn cpu_ordinals_are_devices_of_their_own_with_their_own_pools() {
    let options = DeviceOptions::with_memory_limit(32 << 20).with_cpu_threads(1);
    let first = ok(ComputeClient::open(Device::Cpu(1), options.clone()));
    let second = ok(ComputeClient::open(Device::Cpu(2), options));
    assert_eq!(first.device(), Device::Cpu(1));
    let a = ok(first.upload_f32(&[1.5; 1000]));
    let b = ok(second.upload_f32(&[2.5; 1000]));
    ok(first.launch(first.default_stream(), KernelLaunch::scale(a.whole(), 2.0)));
    ok(second.launch(second.default_stream(), KernelLaunch::scale(b.whole(), 2.0)));
    assert_eq!(ok(first.download_f32(&a)), vec![3.0; 1000]);
    assert_eq!(ok(second.download_f32(&b)), vec![5.0; 1000]);
    assert_eq!(ok(first.server_stats()).kernels_run, 1);
}

#[test]
fn a_cpu_ordinal_past_the_limit_is_unavailable_naming_the_range() {
    let limit = cistern_runtime::backend::cpu::MAX_CPU_ORDINALS;
    match ComputeClient::open(Device::Cpu(limit), DeviceOptions::default()) {
        Err(ServerError::DeviceUnavailable { device, reason }) => {
            assert_eq!(device, format!("cpu:{limit}"));
            assert!(reason.contains(&format!("cpu:{}", limit - 1)), "{reason}");
        }
        other => panic!("cpu:{limit} opened: {other:?}"),
    }
}
