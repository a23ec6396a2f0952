//! Graph capture and replay: a replayed graph computes what its launches
//! computed run directly, holds its memory, and the capture excludes
//! other work only while it records.

use std::sync::mpsc;

use cistern::client::{Buffer, ComputeClient};
use cistern::runtime::{ContextState, Device, ErrorCode, KernelLaunch, ServerError};

use super::common::{ok, open, open_paged};

const N: usize = 64;

/// One "training step" over `x` (read) and `y` (updated), with a scratch buffer.
fn step(x: &Buffer, y: &Buffer, scratch: &Buffer) -> Vec<KernelLaunch> {
    vec![
        KernelLaunch::mul(x.whole(), y.whole(), scratch.whole()),
        KernelLaunch::axpy(y.whole(), 0.25, scratch.whole()),
        KernelLaunch::scale(y.whole(), 0.5),
        KernelLaunch::add(y.whole(), x.whole(), scratch.whole()),
        KernelLaunch::axpy(y.whole(), -0.125, scratch.whole()),
    ]
}

fn inputs() -> (Vec<f32>, Vec<f32>) {
    let x = (0..N).map(|i| 0.5 + i as f32 / 64.0).collect();
    let y = (0..N).map(|i| 1.0 - i as f32 / 128.0).collect();
    (x, y)
}

pub fn a_replayed_graph_matches_the_launches_run_directly(device: Device) {
    let client = open(device);
    let stream = ok(client.create_stream(), "create_stream");
    let (x, y) = inputs();
    let bytes = (N * 4) as u64;
    // Directly: every step's launches sent one by one.
    let (dx, dy) = (
        ok(client.upload_f32(&x), "upload"),
        ok(client.upload_f32(&y), "upload"),
    );
    let scratch = ok(client.reserve(bytes), "reserve");
    // Uploads are ordered on the default stream only: let them land before
    // another stream reads the buffers.
    ok(client.sync(client.default_stream()), "sync uploads");
    for _ in 0..20 {
        for launch in step(&dx, &dy, &scratch) {
            ok(client.launch(stream, launch), "launch");
        }
    }
    ok(client.sync(stream), "sync");
    let direct = ok(client.download_f32(&dy), "download");
    drop(scratch);
    ok(client.sync(stream), "sync");

    // Captured once (its scratch reserved during the capture, from the
    // warmed pools), replayed twenty times.
    let (gx, gy) = (
        ok(client.upload_f32(&x), "upload"),
        ok(client.upload_f32(&y), "upload"),
    );
    let (token, guard) = ok(client.begin_capture(stream), "begin_capture");
    let scratch = ok(token.reserve(bytes), "reserve during capture");
    ok(token.launch_batch(step(&gx, &gy, &scratch)), "record");
    let graph = ok(client.end_capture(guard), "end_capture");
    assert_eq!(graph.launches(), 5);
    assert_eq!(graph.allocations(), 3);
    let before = ok(client.download_f32(&gy), "download");
    assert_eq!(before, y, "recording runs nothing");
    for _ in 0..20 {
        ok(client.replay(stream, &graph), "replay");
    }
    ok(client.sync(stream), "sync");
    let replayed = ok(client.download_f32(&gy), "download");
    assert_eq!(replayed, direct);
    // Any stream replays it, and a token reports the outcome.
    let other = ok(client.create_stream(), "create_stream");
    ok(
        ok(client.replay_tracked(other, &graph), "replay").wait(),
        "replay runs",
    );
}

pub fn a_graph_keeps_its_memory_until_its_last_handle_drops(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let input = ok(client.upload_f32(&[3.0; N]), "upload");
    let out = ok(client.reserve((N * 4) as u64), "reserve");
    let (token, guard) = ok(client.begin_capture(stream), "begin_capture");
    let temp = ok(token.reserve((N * 4) as u64), "reserve during capture");
    ok(
        token.launch_batch(vec![
            KernelLaunch::copy(input.whole(), temp.whole()),
            KernelLaunch::scale(temp.whole(), 2.0),
            KernelLaunch::copy(temp.whole(), out.whole()),
        ]),
        "record",
    );
    let graph = ok(client.end_capture(guard), "end_capture");
    let in_use = |client: &ComputeClient| ok(client.memory_stats(), "memory_stats").in_use_bytes;
    let held = in_use(&client);
    drop((input, temp));
    ok(client.sync(stream), "sync");
    assert_eq!(in_use(&client), held, "the graph holds what it uses");
    let copy = graph.clone();
    drop(graph);
    ok(
        ok(client.replay_tracked(stream, &copy), "replay").wait(),
        "replay",
    );
    assert_eq!(ok(client.download_f32(&out), "download"), vec![6.0; N]);
    drop(copy);
    ok(client.sync(stream), "sync");
    assert!(
        in_use(&client) < held,
        "released with the last graph handle"
    );
}

pub fn compaction_never_moves_what_a_graph_holds(device: Device) {
    // Compaction moves slices between pages: pages only, also where the
    // device could map memory into one range.
    let client = open_paged(device);
    let size = 64u64 << 10;
    let pages = |client: &ComputeClient| ok(client.memory_stats(), "memory_stats").sliced_pages;
    let mut first_page = Vec::new();
    while pages(&client) < 2 {
        first_page.push(ok(client.upload(&vec![7u8; size as usize]), "upload"));
    }
    // Fill three quarters of the second page: dense, so it is the destination.
    let mut second_page: Vec<_> = first_page.pop().into_iter().collect();
    let second_size = ok(client.memory_snapshot(), "memory_snapshot")
        .pages
        .iter()
        .map(|page| page.size)
        .max()
        .unwrap_or(0);
    while (second_page.len() as u64 + 1) * size * 4 <= second_size * 3 {
        second_page.push(ok(client.upload(&vec![7u8; size as usize]), "upload"));
    }
    // Leave two buffers on the first page: worth evacuating, but a graph holds them.
    let kept = first_page.len() - 2;
    first_page.drain(..kept);
    let stream = client.default_stream();
    ok(client.sync(stream), "sync");
    let (token, guard) = ok(client.begin_capture(stream), "begin_capture");
    let copy = KernelLaunch::copy(first_page[0].whole(), first_page[1].whole());
    ok(token.launch(copy), "record");
    let graph = ok(client.end_capture(guard), "end_capture");
    assert_eq!(ok(client.compact(), "compact").moved, 0);
    drop(graph);
    assert_eq!(ok(client.compact(), "compact").moved, 2);
    for buffer in &first_page {
        assert!(
            ok(client.download(buffer), "download")
                .iter()
                .all(|b| *b == 7)
        );
    }
}

pub fn a_capture_excludes_other_threads_until_it_ends(device: Device) {
    let client = open(device);
    let recording = ok(client.create_stream(), "create_stream");
    let other = ok(client.create_stream(), "create_stream");
    let buffer = ok(client.upload_f32(&[1.0; N]), "upload");
    // The upload is ordered on the default stream only; `other` reads it.
    ok(client.sync(client.default_stream()), "sync upload");
    let (token, guard) = ok(client.begin_capture(recording), "begin_capture");
    let (ask, asked) = mpsc::channel::<()>();
    let (tell, told) = mpsc::channel();
    let worker = {
        let client = client.clone();
        let buffer = buffer.clone();
        std::thread::spawn(move || {
            let mut answers = Vec::new();
            while asked.recv().is_ok() {
                let launched = client
                    .launch_tracked(other, KernelLaunch::scale(buffer.whole(), 2.0))
                    .and_then(|token| token.wait());
                let reserved = client.reserve(64).map(|_| ());
                let synced = client.sync(other);
                answers.push((launched, reserved, synced));
                if tell.send(()).is_err() {
                    break;
                }
            }
            answers
        })
    };
    assert!(ask.send(()).is_ok());
    assert!(told.recv().is_ok());
    // The recorder is not disturbed by the refused work.
    ok(
        token.launch(KernelLaunch::fill(buffer.whole(), 5.0)),
        "record",
    );
    let graph = ok(client.end_capture(guard), "end_capture");
    assert!(ask.send(()).is_ok());
    assert!(told.recv().is_ok());
    drop(ask);
    let answers = worker.join().unwrap_or_default();
    assert_eq!(answers.len(), 2);
    let (launched, reserved, synced) = &answers[0];
    for refused in [launched, reserved, synced] {
        let error = refused.clone().err();
        assert!(
            matches!(error, Some(ServerError::CaptureInProgress { .. })),
            "refused while capturing: {error:?}"
        );
        assert!(error.is_some_and(|error| error.is_transient()));
    }
    let (launched, reserved, synced) = &answers[1];
    assert_eq!((launched, reserved, synced), (&Ok(()), &Ok(()), &Ok(())));
    // The refused scale never ran; the admitted one did, and the graph then fills.
    assert_eq!(ok(client.download_f32(&buffer), "download"), vec![2.0; N]);
    ok(
        ok(client.replay_tracked(other, &graph), "replay").wait(),
        "replay",
    );
    assert_eq!(ok(client.download_f32(&buffer), "download"), vec![5.0; N]);
}

pub fn a_capture_begins_only_on_an_active_device_and_never_nests(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let (_token, guard) = ok(client.begin_capture(stream), "begin_capture");
    let nested = client.begin_capture(stream).map(|_| ());
    assert_eq!(nested.map_err(|e| e.code()), Err(ErrorCode::ContextBusy));
    drop(guard);
    let trapped = ok(
        client.launch_tracked(stream, KernelLaunch::trap()),
        "launch",
    )
    .wait();
    assert!(trapped.is_err());
    let poisoned = client.begin_capture(stream).map(|_| ());
    assert_eq!(
        poisoned.map_err(|e| e.code()),
        Err(ErrorCode::DevicePoisoned)
    );
}

pub fn a_dropped_guard_discards_the_capture_and_leaves_the_device_active(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let buffer = ok(client.upload_f32(&[1.0; N]), "upload");
    let (token, guard) = ok(client.begin_capture(stream), "begin_capture");
    ok(
        token.launch(KernelLaunch::fill(buffer.whole(), 9.0)),
        "record",
    );
    drop(guard);
    let after_drop = ok(client.context_state(), "context_state");
    assert_eq!(after_drop, ContextState::Active { generation: 0 });
    let late = token.launch(KernelLaunch::empty());
    assert!(matches!(late, Err(ServerError::InvalidArgument { .. })));

    // A panic while capturing drops the guard too.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (token, _guard) = ok(client.begin_capture(stream), "begin_capture");
        ok(
            token.launch(KernelLaunch::fill(buffer.whole(), 9.0)),
            "record",
        );
        panic!("a step failed while capturing");
    }));
    assert!(panicked.is_err());
    let after_panic = ok(client.context_state(), "context_state");
    assert_eq!(after_panic, ContextState::Active { generation: 0 });
    ok(
        client.launch(stream, KernelLaunch::scale(buffer.whole(), 3.0)),
        "launch",
    );
    assert_eq!(
        ok(client.download_f32(&buffer), "download"),
        vec![3.0; N],
        "nothing recorded ran, and the device works"
    );
}

pub fn a_sync_read_or_write_through_the_token_is_refused_untouched(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let buffer = ok(client.upload_f32(&[1.0; N]), "upload");
    let (token, guard) = ok(client.begin_capture(stream), "begin_capture");
    let before = ok(client.server_stats(), "server_stats");
    let refusals = [
        token.sync(),
        token.read(&buffer, 0, 4).map(|_| ()),
        token.write(&buffer, 0, &[0; 4]),
    ];
    let after = ok(client.server_stats(), "server_stats");
    for refusal in refusals {
        assert!(matches!(
            refusal,
            Err(ServerError::UnsupportedOperation { .. })
        ));
    }
    assert_eq!(
        after.commands,
        before.commands + 1,
        "only the stats query arrived"
    );
    assert_eq!(after.kernels_run, before.kernels_run);
    assert!(ok(client.context_state(), "context_state").is_capturing());
    ok(
        token.launch(KernelLaunch::fill(buffer.whole(), 4.0)),
        "record",
    );
    let graph = ok(client.end_capture(guard), "end_capture");
    ok(
        ok(client.replay_tracked(stream, &graph), "replay").wait(),
        "replay",
    );
    assert_eq!(ok(client.download_f32(&buffer), "download"), vec![4.0; N]);
}

pub fn a_reservation_beyond_the_warmed_pools_is_page_update_forbidden(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    // Warm the pools: the step's buffers once, dropped.
    drop(ok(client.reserve(64 << 10), "reserve"));
    ok(client.sync(stream), "sync");
    let (token, guard) = ok(client.begin_capture(stream), "begin_capture");
    let warm = token.reserve(64 << 10);
    assert!(warm.is_ok(), "a warmed request fits: {warm:?}");
    let cold = token.reserve(32 << 20).map(|_| ());
    assert_eq!(
        cold.map_err(|e| e.code()),
        Err(ErrorCode::AllocationForbidden)
    );
    assert!(ok(client.context_state(), "context_state").is_capturing());
    drop(guard);
    // Outside a capture the same request may add a page.
    assert!(client.reserve(32 << 20).is_ok());
}
