//! The test device: one queue-only, step-driven backend for every test that
//! fakes a device (the server's unit tests, the state machine and capture
//! suites, the simulation). Work waits in a queue until the test runs it on
//! a simulated memory, the way the test chooses; completions wait until an
//! answer, a fault or the test delivers them.
//!
//! Built for `cistern-runtime`'s own unit tests and behind the `testing`
//! feature for everyone else; never part of a shipped build.

mod backend;
mod device;
mod launch;
mod memory;
mod options;
mod server;

pub use backend::TestBackend;
pub use device::{QueuedWork, Run, TestDevice, trap_poison};
pub use memory::SimulatedMemory;
pub use options::TestOptions;
pub use server::TestServer;
