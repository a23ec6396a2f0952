//! Cistern's memory layer: the error model every crate reports through, and
//! the memory manager (storage, paged pools) every backend drives.
//!
//! It knows nothing of devices, servers or kernels, and depends on no other
//! Cistern crate.

mod code;
mod error;
mod trace;

pub use code::ErrorCode;
pub use error::{DevicePoison, IoError, Reason};
pub use trace::BackTrace;
