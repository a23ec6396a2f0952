//! A tape's buffers come from the pools and go back when it drops.

use cistern_client::Tape;
use cistern_memory::SplitMix64;
use cistern_runtime::Activation;

use super::common::{ok, open, random};

#[test]
fn a_tapes_memory_returns_to_the_pools_when_it_drops() {
    let client = open();
    let mut rng = SplitMix64::new(0x3E3);
    let (x, w, b, y) = (
        random(&mut rng, &[32, 16]),
        random(&mut rng, &[8, 16]),
        random(&mut rng, &[8]),
        random(&mut rng, &[32, 8]),
    );
    let before = ok(client.memory_stats(), "memory_stats");
    let reserved_before = {
        let tape = Tape::new(&client);
        let x = ok(tape.upload(&x), "x");
        let (w, b) = (ok(tape.var(&w), "w"), ok(tape.var(&b), "b"));
        let y = ok(tape.upload(&y), "y");
        let pred = ok(tape.linear(&x, &w, Some(&b), Activation::Tanh), "linear");
        let loss = ok(tape.mse_loss(&pred, &y), "loss");
        let gradients = ok(tape.backward(&loss), "backward");
        ok(loss.item(), "loss");
        let during = ok(client.memory_stats(), "memory_stats");
        assert!(during.live_allocations > before.live_allocations + 10);
        assert!(during.in_use_bytes > before.in_use_bytes);
        drop(gradients);
        during.reserved_bytes
    };
    let after = ok(client.memory_stats(), "memory_stats");
    assert_eq!(after.live_allocations, before.live_allocations);
    assert_eq!(after.in_use_bytes, before.in_use_bytes);
    assert_eq!(after.requested_bytes, before.requested_bytes);
    // The pages stay with the pools for the next step's tape.
    assert_eq!(after.reserved_bytes, reserved_before);
}
