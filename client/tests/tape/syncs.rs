//! A forward + backward waits for the device once: when the loss is read.
//!
//! Counted by the server, not assumed: `ServerStats` counts every command
//! and, apart, launches, syncs, frees, batches and replays, and
//! `MemoryStats` counts reservations. What is left of the commands over the
//! step is the reads and writes (the server counts neither apart); the step
//! uploads nothing, so what is left is reads. The client's own count of
//! calls that wait for a stream (reads and syncs) must agree.

use cistern_client::{ComputeClient, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_runtime::Activation;

use super::common::{ok, open, random};

/// Commands the server handled, less launches, syncs, frees, batches,
/// replays, reservations and the three stats queries made to count them.
fn other_commands(client: &ComputeClient, step: impl FnOnce()) -> (u64, u64) {
    let server_before = ok(client.server_stats(), "server_stats");
    let memory_before = ok(client.memory_stats(), "memory_stats");
    step();
    let memory_after = ok(client.memory_stats(), "memory_stats");
    let server_after = ok(client.server_stats(), "server_stats");
    let delta = |f: fn(&cistern_runtime::ServerStats) -> u64| f(&server_after) - f(&server_before);
    let queries = 3;
    let counted = delta(|s| s.launches)
        + delta(|s| s.syncs)
        + delta(|s| s.frees)
        + delta(|s| s.batches)
        + delta(|s| s.replays)
        + (memory_after.reservations - memory_before.reservations);
    let others = delta(|s| s.commands) - queries - counted;
    (others, delta(|s| s.syncs))
}

#[test]
fn an_mlp_forward_and_backward_waits_for_the_device_once_for_the_loss() {
    let client = open();
    let mut rng = SplitMix64::new(0x5914C);
    let shapes: [&[usize]; 6] = [&[16, 8], &[32, 8], &[32], &[4, 32], &[4], &[16, 4]];
    let [x, w1, b1, w2, b2, y]: [Tensor<f32>; 6] = shapes.map(|shape| random(&mut rng, shape));
    let tape = Tape::new(&client);
    let x = ok(tape.upload(&x), "x");
    let (w1, b1) = (ok(tape.var(&w1), "w1"), ok(tape.var(&b1), "b1"));
    let (w2, b2) = (ok(tape.var(&w2), "w2"), ok(tape.var(&b2), "b2"));
    let y = ok(tape.upload(&y), "y");
    let waits_before = client.stream_waits();
    let mut loss_value = None;
    let mut kept = None;
    let (others, syncs) = other_commands(&client, || {
        let h = ok(tape.linear(&x, &w1, Some(&b1), Activation::Relu), "layer 1");
        let pred = ok(
            tape.linear(&h, &w2, Some(&b2), Activation::Identity),
            "layer 2",
        );
        let loss = ok(tape.mse_loss(&pred, &y), "loss");
        kept = Some(ok(tape.backward(&loss), "backward"));
        loss_value = Some(ok(loss.item(), "the loss read"));
    });
    assert_eq!(syncs, 0, "no sync: the server counted {syncs}");
    assert_eq!(
        others, 1,
        "one read: the server handled {others} other commands"
    );
    assert_eq!(client.stream_waits() - waits_before, 1);
    assert!(loss_value.is_some_and(f32::is_finite));
    drop(kept);
}
