//! The model's shape: an MLP's layout and activation, and its seeded
//! initial parameters (`store_model.rs` holds them on the device).

use cistern_memory::SplitMix64;
use cistern_runtime::Activation;
use serde::{Deserialize, Serialize};

/// The hidden activation, by its command-line name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ActivationName {
    /// `max(x, 0)`.
    Relu,
    /// Leaky ReLU with PyTorch's slope 0.01.
    LeakyRelu,
    /// `tanh(x)`.
    Tanh,
    /// Exact GELU.
    Gelu,
    /// `1 / (1 + e^{−x})`.
    Sigmoid,
}

impl ActivationName {
    /// The kernel's activation.
    pub fn kernel(self) -> Activation {
        match self {
            ActivationName::Relu => Activation::Relu,
            ActivationName::LeakyRelu => Activation::LeakyRelu {
                negative_slope: 0.01,
            },
            ActivationName::Tanh => Activation::Tanh,
            ActivationName::Gelu => Activation::Gelu,
            ActivationName::Sigmoid => Activation::Sigmoid,
        }
    }
}

/// An MLP's shape: `widths` from the input through the hidden layers to
/// the one output; the activation after every hidden layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Input width, hidden widths, output width (1).
    pub widths: Vec<usize>,
    /// The hidden layers' activation (the output has none).
    pub activation: ActivationName,
}

impl Layout {
    /// `inputs` features through `hidden` to one output.
    pub fn new(inputs: usize, hidden: &[usize], activation: ActivationName) -> Self {
        let mut widths = vec![inputs];
        widths.extend_from_slice(hidden);
        widths.push(1);
        Layout { widths, activation }
    }

    /// Each parameter tensor's name and shape, weights `[in, out]` (the
    /// store's layout) then bias.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        self.widths
            .windows(2)
            .enumerate()
            .flat_map(|(index, pair)| {
                [
                    (format!("layers.{index}.weight"), vec![pair[0], pair[1]]),
                    (format!("layers.{index}.bias"), vec![pair[1]]),
                ]
            })
            .collect()
    }

    /// Parameters in all.
    pub fn parameter_count(&self) -> usize {
        self.tensors()
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>())
            .sum()
    }

    /// Parameters uniform in ±1/√fan_in (PyTorch's `nn.Linear` range), seeded.
    pub fn initial_parameters(&self, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = SplitMix64::derived(seed, 1);
        self.tensors()
            .iter()
            .map(|(name, shape)| {
                let fan_in = if name.ends_with("weight") {
                    shape[0]
                } else {
                    // A bias's fan-in is its layer's: the weight before it.
                    self.widths[self.layer_of(name)]
                };
                let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
                let count = shape.iter().product();
                (0..count)
                    .map(|_| bound * (2.0 * rng.unit_f32() - 1.0))
                    .collect()
            })
            .collect()
    }

    fn layer_of(&self, name: &str) -> usize {
        name.split('.')
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}
