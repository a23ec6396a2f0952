//! Embedding Cistern in a training program: an MLP's parameters live in
//! device buffers, the tape runs forward and backward, and the runtime's
//! fused optimizer kernel updates each tensor in place.
//! `cargo run --example train_mlp`

use cistern::client::{ComputeClient, Tape, Tensor};
use cistern::optim::{AdamConfig, OptimizerConfig, Segment};
use cistern::runtime::{Activation, Device, DeviceOptions, OptimizerStep};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = ComputeClient::open(Device::Cpu(0), DeviceOptions::with_memory_limit(64 << 20))?;
    let shapes = [vec![16, 1], vec![16], vec![1, 16], vec![1]]; // y = f(x): 1 → 16 → 1
    let config = OptimizerConfig::Adam(AdamConfig {
        lr: 2e-2,
        ..Default::default()
    });
    let mut params = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|j| ((i * 31 + j * 17) % 13) as f32 / 13.0 - 0.5)
            .collect();
        params.push((
            client.upload_f32(&values)?,
            client.optimizer_state(&config, n as u64)?,
        ));
    }
    let x: Vec<f32> = (0..64).map(|i| i as f32 / 32.0 - 1.0).collect();
    let y: Vec<f32> = x.iter().map(|v| v * v).collect();
    let (x, y) = (Tensor::new([64, 1], x)?, Tensor::new([64, 1], y)?);
    let mut loss = f32::NAN;
    for step in 1..=300 {
        let tape = Tape::new(&client);
        let p: Vec<_> = params
            .iter()
            .zip(&shapes)
            .map(|((b, _), s)| tape.var_resident(b, s))
            .collect::<Result<_, _>>()?;
        let hidden = tape.linear(&tape.upload(&x)?, &p[0], Some(&p[1]), Activation::Tanh)?;
        let output = tape.linear(&hidden, &p[2], Some(&p[3]), Activation::Identity)?;
        let mse = tape.mse_loss(&output, &tape.upload(&y)?)?;
        let grads = tape.backward(&mse)?;
        for (var, (buffer, state)) in p.iter().zip(&params) {
            let grad = grads.get(var)?.ok_or("a parameter without a gradient")?;
            let n = (buffer.size() / 4) as usize;
            let update = OptimizerStep::new(
                config.clone(),
                step,
                vec![Segment::new(0, n)],
                buffer.whole(),
                grad.buffer().range(0, buffer.size()),
                state.bindings(),
            );
            client.optimizer_step(tape.stream(), update)?;
        }
        loss = mse.item()?; // the step's one wait for the device
    }
    println!("loss after 300 steps: {loss:.5}");
    if loss < 0.02 {
        Ok(())
    } else {
        Err(format!("did not learn: loss {loss}").into())
    }
}
