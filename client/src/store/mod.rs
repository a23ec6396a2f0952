//! `DeviceParamStore`: a training program's parameters, resident on the
//! device in one buffer, updated in place, and refused once a device
//! failure may have left them half-updated. `docs/param-store.md` has the
//! design.

mod amp;
mod backward;
mod chain;
mod chain_step;
mod convert;
mod families;
mod forward;
mod latch;
mod layout;
mod readers;
mod step;
#[allow(clippy::module_inception)]
mod store;
mod work;

pub use amp::DeviceAmpState;
pub use chain::{ChainLayer, ResidentInput};
pub use chain_step::TrainStepLoss;
pub use forward::ResidentLeaf;
pub use store::DeviceParamStore;
