//! Cistern's client side: `ComputeClient` and its handles, `BackendError`,
//! and `ErrorReport` with its JSON and bincode codecs.
//!
//! Depends on `cistern-runtime`, `cistern-memory` and `cistern-optim`; never
//! on the facade.

pub mod codec;
mod compute;
mod error;
mod report;
mod shape;

pub use cistern_memory::ErrorCode;
pub use codec::CodecError;
pub use compute::{
    Buffer, CaptureGuard, CaptureToken, ComputeClient, Event, Graph, OptimizerState,
};
pub use error::{AutodiffError, BackendError};
pub use report::{ErrorReport, ReportedError};
pub use shape::ShapeError;
