//! Cistern's device server: one thread per device owning its backend, memory
//! manager, streams and context state, and the commands clients send it.
//!
//! Depends on `cistern-memory`, `cistern-kernels` and `cistern-optim`; never
//! on the client or the facade.

mod error;

pub use error::ServerError;
