//! Embedding Cistern in a training program: an MLP's parameters live in a
//! `DeviceParamStore` (one device buffer), the tape runs forward and
//! backward over them in place, and one fused Adam kernel updates them all.
//! `cargo run --example train_mlp`

use cistern::client::{ComputeClient, DeviceParamStore, Tape, Tensor};
use cistern::optim::AdamConfig;
use cistern::runtime::{Activation, Device, DeviceOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = ComputeClient::open(Device::Cpu(0), DeviceOptions::with_memory_limit(64 << 20))?;
    let shapes = [vec![1, 16], vec![16], vec![16, 1], vec![1]]; // [in, out]: 1 → 16 → 1
    let mut params = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        let n: usize = shape.iter().product();
        let values = (0..n).map(|j| ((i * 31 + j * 17) % 13) as f32 / 13.0 - 0.5);
        params.push(Tensor::new(shape.clone(), values.collect())?);
    }
    let refs: Vec<&Tensor<f32>> = params.iter().collect();
    let mut store = DeviceParamStore::new(&Tape::new(&client), &refs)?; // one upload
    let x: Vec<f32> = (0..64).map(|i| i as f32 / 32.0 - 1.0).collect();
    let y: Vec<f32> = x.iter().map(|v| v * v).collect();
    let (x, y) = (Tensor::new([64, 1], x)?, Tensor::new([64, 1], y)?);
    let config = AdamConfig {
        lr: 2e-2,
        ..Default::default()
    };
    let mut loss = f32::NAN;
    for _ in 0..300 {
        let tape = Tape::new(&client);
        let p = store.register_resident_params(&tape)?;
        let input = tape.upload(&x)?;
        let tanh = Activation::Tanh;
        let hidden =
            store.linear_forward_with_activation(&tape, &input, &p[0], Some(&p[1]), tanh)?;
        let output = store.linear_forward(&tape, &hidden, &p[2], Some(&p[3]))?;
        let mse = tape.mse_loss(&output, &tape.upload(&y)?)?;
        let grads = store.backward(&tape, &mse)?; // staged on the device
        store.step_adam(&grads, &config)?; // queued: no wait
        loss = mse.item()?; // the step's one wait for the device
    }
    println!("loss after 300 steps: {loss:.5}");
    if loss < 0.02 {
        Ok(())
    } else {
        Err(format!("did not learn: loss {loss}").into())
    }
}
