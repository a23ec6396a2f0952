//! The device server: a synchronous core, the thread around it, the context
//! state it gates commands with, and the checks it runs before queueing.

mod capture;
mod commands;
mod context;
mod core;
mod graphs;
mod inject;
mod invalidate;
mod ordering;
mod probe;
mod published;
mod streams;
mod submit;
mod thread;
mod validate;

#[cfg(test)]
mod tests;

pub use core::{Flow, ServerCore};
pub use published::{DeviceState, Health, PublishedState};
pub use thread::{ServerEnd, ServerHandle, next_server_id, open, spawn};
