//! `ComputeClient` and its handles: the program's side of a device server.

mod buffer;
mod capture;
mod client;
mod event;
mod optimizer;
mod recovery;

pub use buffer::Buffer;
pub use capture::{CaptureGuard, CaptureToken, Graph};
pub use client::ComputeClient;
pub(crate) use client::{bytes_f32, f32_bytes};
pub use event::Event;
pub use optimizer::OptimizerState;
