//! A forward + backward waits for the device once: when the loss is read.
//!
//! Counted by the server, not assumed: `ServerStats` counts the reads and
//! syncs it handled. The client's own count of calls that wait for a stream
//! (reads and syncs) must agree.

use cistern_client::{ComputeClient, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_runtime::Activation;

use super::common::{ok, open, random};

/// The reads and syncs the server handled while `step` ran.
fn host_waits(client: &ComputeClient, step: impl FnOnce()) -> (u64, u64) {
    let before = ok(client.server_stats(), "server_stats");
    step();
    let after = ok(client.server_stats(), "server_stats");
    (after.reads - before.reads, after.syncs - before.syncs)
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
    let (reads, syncs) = host_waits(&client, || {
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
    assert_eq!(reads, 1, "one read: the server counted {reads}");
    assert_eq!(client.stream_waits() - waits_before, 1);
    assert!(loss_value.is_some_and(f32::is_finite));
    drop(kept);
}
