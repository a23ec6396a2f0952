//! The training tape: reverse-mode autodiff whose values live on the device.
//!
//! A [`Tape`] records one step's operations as kernel launches on one
//! stream; [`Tape::backward`] queues the gradient kernels on the same
//! stream and returns [`Gradients`]. Nothing waits for the device until a
//! value is read. `docs/tape.md` has the design.

mod attention;
mod backward;
mod classify;
mod concat;
mod gradients;
mod layers;
mod matmul;
mod node;
mod ops;
mod rules;
mod sinks;
mod strides;
#[allow(clippy::module_inception)]
mod tape;
mod tensor;
mod var;
mod view_rules;
mod views;
mod weight_layout;
mod work;

pub use classify::{BceWithLogitsOptions, ClassTargets, CrossEntropyOptions, NllLossOptions};
pub(crate) use gradients::StagedBy;
pub use gradients::{Gradient, Gradients};
pub(crate) use node::ResidentMark;
pub(crate) use sinks::Sinks;
pub use tape::{Tape, TapeId};
pub use tensor::Tensor;
pub use var::Var;
pub use views::DimIndices;
pub use weight_layout::WeightLayout;
