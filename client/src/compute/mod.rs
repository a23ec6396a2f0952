//! `ComputeClient` and its handles: the program's side of a device server.

mod buffer;
mod client;
mod event;

pub use buffer::Buffer;
pub use client::ComputeClient;
pub use event::Event;
