//! A device fault during a tape's work reaches the tape's next waiting call
//! as the error of that work, and a recovered device serves a new tape.

use cistern_client::{AutodiffError, BackendError, ComputeClient, ErrorCode, Tape, Tensor};
use cistern_memory::SplitMix64;
use cistern_runtime::{Activation, ContextState, DeviceOptions, FaultPlan};

use super::common::{ok, open, open_with, random};

struct Data {
    x: Tensor<f32>,
    w: Tensor<f32>,
    b: Tensor<f32>,
    y: Tensor<f32>,
}

fn data() -> Data {
    let mut rng = SplitMix64::new(0xFA17);
    Data {
        x: random(&mut rng, &[8, 4]),
        w: random(&mut rng, &[3, 4]),
        b: random(&mut rng, &[3]),
        y: random(&mut rng, &[8, 3]),
    }
}

/// What one step saw: its forward launches, the first error of backward
/// and the gradient read (or ∂w), then a loss read made after them.
struct Outcome {
    forward: usize,
    gradient: Result<Vec<f32>, AutodiffError>,
    loss: Result<f32, AutodiffError>,
}

fn step(client: &ComputeClient, data: &Data) -> Outcome {
    let tape = Tape::new(client);
    let x = ok(tape.upload(&data.x), "x");
    let (w, b) = (ok(tape.var(&data.w), "w"), ok(tape.var(&data.b), "b"));
    let y = ok(tape.upload(&data.y), "y");
    let pred = ok(tape.linear(&x, &w, Some(&b), Activation::Sigmoid), "linear");
    let loss = ok(tape.mse_loss(&pred, &y), "loss");
    let forward = tape.launches().len();
    // Backward waits for nothing, but a reservation may already see the
    // poisoned device: either way the first error is the trap's.
    let gradient = tape
        .backward(&loss)
        .and_then(|gradients| match gradients.to_host(&w)? {
            Some(gradient) => Ok(gradient.into_data()),
            None => Err(AutodiffError::InvalidArgument("no gradient".into())),
        });
    Outcome {
        forward,
        gradient,
        loss: loss.item(),
    }
}

#[test]
fn a_trap_during_backward_is_the_tapes_error_and_a_recovered_device_serves_a_new_tape() {
    let data = data();
    let healthy = step(&open(), &data);
    let (healthy_loss, healthy_gradient) = (ok(healthy.loss, "loss"), ok(healthy.gradient, "∂w"));
    // The second launch of backward traps on the device.
    let plan = FaultPlan::none().with_trap_at_launch(healthy.forward as u64 + 2);
    let client = open_with(DeviceOptions::with_memory_limit(64 << 20).with_faults(plan));
    let faulted = step(&client, &data);
    let poisoned = match &faulted.gradient {
        Err(AutodiffError::Backend(BackendError::DeviceContextPoisoned(poison))) => poison.clone(),
        other => panic!("the step returns the trap, got {other:?}"),
    };
    assert!(
        poisoned.contains("trap"),
        "the trapped launch's error: {poisoned}"
    );
    let code = faulted.gradient.as_ref().err().map(AutodiffError::code);
    assert_eq!(code, Some(ErrorCode::DevicePoisoned));
    // A later read of the same tape gets the same error, never a value.
    assert_eq!(faulted.loss.err(), faulted.gradient.err());
    let generation = match ok(client.context_state(), "context_state") {
        ContextState::Poisoned { generation, .. } => generation,
        other => panic!("the device is poisoned, got {other:?}"),
    };
    assert!(ok(client.invalidate(generation), "invalidate").is_active());
    let recovered = step(&client, &data);
    assert_eq!(ok(recovered.loss, "loss after recovery"), healthy_loss);
    assert_eq!(
        ok(recovered.gradient, "∂w after recovery"),
        healthy_gradient
    );
}

#[test]
fn a_tape_that_saw_a_failure_refuses_a_reset_with_that_failure() {
    let data = data();
    let healthy = step(&open(), &data);
    let plan = FaultPlan::none().with_trap_at_launch(healthy.forward as u64 + 2);
    let client = open_with(DeviceOptions::with_memory_limit(64 << 20).with_faults(plan));
    let mut tape = Tape::new(&client);
    let failure = {
        let x = ok(tape.upload(&data.x), "x");
        let (w, b) = (ok(tape.var(&data.w), "w"), ok(tape.var(&data.b), "b"));
        let y = ok(tape.upload(&data.y), "y");
        let pred = ok(tape.linear(&x, &w, Some(&b), Activation::Sigmoid), "linear");
        let loss = ok(tape.mse_loss(&pred, &y), "loss");
        let _ = tape.backward(&loss);
        match loss.item() {
            Err(error) => error,
            Ok(loss) => panic!("the trap reaches the loss read, got {loss}"),
        }
    };
    assert_eq!(tape.reset(), Err(failure));
}
