//! The stream protocol: the rules every backend's executors keep, written
//! once here. A backend supplies only the device part ([`StreamDevice`]:
//! copy these bytes, run these kernels, wait for this event) and the
//! server-side lookups ([`Resolver`]: this location is that memory).
//!
//! The rules, all kept by [`StreamRunner`]:
//! - a stream runs its work in order, one item at a time;
//! - the first error is latched until a sync reads it (a sync answers the
//!   latched error, clearing it, then the device's fault, then `Ok`);
//! - a sticky fault's completion is reported to the server before the
//!   device is marked faulted, so whoever sees the fault is causally after
//!   the server can;
//! - once faulted, every stream refuses later work with the poison;
//! - progress is published in one atomic word ([`StreamProgress`]) after
//!   its completion is sent, so the server answers a sync on an idle stream
//!   itself;
//! - failure tokens are settled with the outcome of their work;
//! - completions are sent at least every [`REPORT_EVERY`] items while
//!   busy, when the stream goes idle, and before a sync answers.

mod fault;
mod health;
mod progress;
mod runner;
mod strides;
mod work;

pub use fault::{KernelFault, LaunchError, ReadError, caught};
pub use health::DeviceHealth;
pub use progress::StreamProgress;
pub(crate) use runner::refuse_all;
pub use runner::{REPORT_EVERY, StreamDevice, StreamRunner};
pub use strides::{GPU_MAX_STRIDED_RANK, gpu_supports_strides};
pub use work::{
    BoundLaunch, Job, OnDevice, Refused, Resolution, Resolver, StreamWork, Task, Unresolved, Work,
    bind_launches,
};
