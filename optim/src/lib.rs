//! Optimizer configs with PyTorch's names, defaults and validation, the AMP
//! [`GradScaler`], and a plain f64 reference of every update.
//!
//! This crate owns the *math* of optimization, not its execution: the kernels
//! in `cistern-kernels` implement these updates fast and are tested against
//! [`reference`]. It must never depend on another Cistern crate (memory,
//! kernels, runtime, client): everything above it depends on it.

mod config;
mod error;
pub mod parity;
pub mod reference;
mod scaler;
mod segment;

pub use config::{
    AdagradConfig, AdamConfig, AdamWConfig, LambConfig, LambConstants, OptimizerConfig,
    RmsPropConfig, SgdConfig, StateBuffer, StateLayout,
};
pub use error::OptimError;
pub use scaler::{GradScaler, GradScalerConfig, ScaleUpdate};
pub use segment::{Segment, validate_segments};
