//! Graphs and the context state machine: a replay is counted launch by
//! launch by the fault plan, a trap in it poisons, and a graph does not
//! outlive its generation.

use cistern::runtime::{ContextState, Device, DeviceOptions, FaultPlan, KernelLaunch, ServerError};

use super::common::{ok, open, open_with};

pub fn a_trap_during_replay_poisons_the_device(device: Device) {
    // Three launches per replay: the fifth executed launch is in the second replay.
    let faults = FaultPlan::none().with_trap_at_launch(5);
    let client = open_with(
        device,
        DeviceOptions::with_memory_limit(64 << 20).with_faults(faults),
    );
    let stream = client.default_stream();
    let buffer = ok(client.upload_f32(&[1.0; 16]), "upload");
    let (token, guard) = ok(client.begin_capture(stream), "begin_capture");
    let step = KernelLaunch::scale(buffer.whole(), 2.0);
    ok(
        token.launch_batch(vec![step.clone(), step.clone(), step]),
        "record",
    );
    let graph = ok(client.end_capture(guard), "end_capture");
    ok(
        ok(client.replay_tracked(stream, &graph), "replay").wait(),
        "first replay",
    );
    assert_eq!(ok(client.download_f32(&buffer), "download"), vec![8.0; 16]);
    let trapped = ok(client.replay_tracked(stream, &graph), "replay").wait();
    let Err(ServerError::ContextPoisoned(poison)) = trapped else {
        panic!("the trapped replay reports the poison, got {trapped:?}");
    };
    assert!(ok(client.context_state(), "context_state").is_poisoned());
    let refused = ok(client.replay_tracked(stream, &graph), "replay").wait();
    assert!(matches!(refused, Err(ServerError::ContextPoisoned(_))));
    let recovered = ok(client.invalidate(poison.generation), "invalidate");
    assert_eq!(recovered, ContextState::Active { generation: 1 });
}

pub fn a_graph_from_before_an_invalidate_is_refused_as_stale(device: Device) {
    let client = open(device);
    let stream = client.default_stream();
    let buffer = ok(client.upload_f32(&[1.0; 16]), "upload");
    let (token, guard) = ok(client.begin_capture(stream), "begin_capture");
    ok(
        token.launch(KernelLaunch::fill(buffer.whole(), 2.0)),
        "record",
    );
    let graph = ok(client.end_capture(guard), "end_capture");
    let trapped = ok(
        client.launch_tracked(stream, KernelLaunch::trap()),
        "launch",
    )
    .wait();
    assert!(trapped.is_err());
    ok(client.invalidate(0), "invalidate");
    let stale = ok(client.replay_tracked(stream, &graph), "replay").wait();
    assert_eq!(
        stale,
        Err(ServerError::StaleGeneration {
            ordinal: device.ordinal(),
            resource_generation: 0,
            current_generation: 1,
        })
    );
    // Capturing again in the new generation works.
    let fresh = ok(client.upload_f32(&[1.0; 16]), "upload");
    let (token, guard) = ok(client.begin_capture(stream), "begin_capture");
    ok(
        token.launch(KernelLaunch::fill(fresh.whole(), 3.0)),
        "record",
    );
    let graph = ok(client.end_capture(guard), "end_capture");
    ok(
        ok(client.replay_tracked(stream, &graph), "replay").wait(),
        "replay",
    );
    assert_eq!(ok(client.download_f32(&fresh), "download"), vec![3.0; 16]);
}

pub fn a_fault_while_capturing_discards_the_capture(device: Device) {
    let client = open(device);
    let recording = ok(client.create_stream(), "create_stream");
    let other = ok(client.create_stream(), "create_stream");
    // Work queued before the capture began may still fault during it.
    let trapped = ok(client.launch_tracked(other, KernelLaunch::trap()), "launch");
    let (token, guard) = match client.begin_capture(recording) {
        Ok(capture) => capture,
        // The trap already ran: nothing to capture on a poisoned device.
        Err(error) => {
            assert!(error.is_device_poisoned());
            return;
        }
    };
    assert!(trapped.wait().is_err());
    let recorded = token.launch(KernelLaunch::empty());
    assert!(matches!(recorded, Err(ServerError::ContextPoisoned(_))));
    let ended = client.end_capture(guard).map(|_| ());
    assert!(matches!(ended, Err(ServerError::ContextPoisoned(_))));
    assert!(ok(client.context_state(), "context_state").is_poisoned());
}
