//! A tape's buffers come from the pools and go back when it drops.

use cistern_client::{Tape, Tensor};
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

/// One step of a small linear model recorded on `tape`: its loss and ∂w.
fn linear_step(tape: &Tape, data: &[Tensor<f32>; 4]) -> (f32, Vec<f32>) {
    let x = ok(tape.upload(&data[0]), "x");
    let (w, b) = (ok(tape.var(&data[1]), "w"), ok(tape.var(&data[2]), "b"));
    let y = ok(tape.upload(&data[3]), "y");
    let pred = ok(tape.linear(&x, &w, Some(&b), Activation::Tanh), "linear");
    let loss = ok(tape.mse_loss(&pred, &y), "loss");
    let gradients = ok(tape.backward(&loss), "backward");
    let dw = ok(gradients.to_host(&w), "∂w").map(Tensor::into_data);
    (ok(loss.item(), "loss"), dw.unwrap_or_default())
}

#[test]
fn a_reset_tape_records_the_next_step_in_its_buffers_with_no_reservation_or_free() {
    let client = open();
    let mut rng = SplitMix64::new(0x5E7);
    let data = [
        random(&mut rng, &[32, 16]),
        random(&mut rng, &[8, 16]),
        random(&mut rng, &[8]),
        random(&mut rng, &[32, 8]),
    ];
    let fresh = linear_step(&Tape::new(&client), &data);
    let mut tape = Tape::new(&client);
    let first = linear_step(&tape, &data);
    let (id, launches) = (tape.id(), tape.launches().len());
    let before = ok(client.memory_stats(), "memory_stats");
    let frees = ok(client.server_stats(), "server_stats").frees;
    ok(tape.reset(), "reset");
    assert_ne!(tape.id(), id, "a reset tape is a new record");
    assert!(tape.launches().is_empty());
    let second = linear_step(&tape, &data);
    let after = ok(client.memory_stats(), "memory_stats");
    assert_eq!(
        after.live_allocations, before.live_allocations,
        "nothing new reserved"
    );
    assert_eq!(
        ok(client.server_stats(), "server_stats").frees,
        frees,
        "nothing freed"
    );
    assert_eq!(tape.launches().len(), launches);
    assert_eq!(first, fresh);
    assert_eq!(
        second, fresh,
        "the same step in reused buffers gives the same bits"
    );
    // A step of another shape takes new buffers; the unused ones go back
    // at the next reset.
    ok(tape.reset(), "reset");
    let wider = [
        random(&mut rng, &[4, 16]),
        data[1].clone(),
        data[2].clone(),
        random(&mut rng, &[4, 8]),
    ];
    linear_step(&tape, &wider);
    ok(tape.reset(), "reset");
    drop(tape);
    let dropped = ok(client.memory_stats(), "memory_stats");
    assert!(dropped.live_allocations < before.live_allocations);
}
