//! The checks every store call makes first, in order: the store's own
//! poison (the latch, then its queued work's failures) → the device's
//! published state → the generation of the store's memory. A device-level
//! failure latches the store; the transient states (retiring, capturing)
//! never do.

use cistern_runtime::ServerError;

use super::device_check::check_device;
use super::store::DeviceParamStore;
use crate::error::BackendError;

impl DeviceParamStore {
    /// The entry checks of a `&self` call.
    pub(super) fn enter(&self) -> Result<(), BackendError> {
        if let Some(poisoned) = self.state.poison() {
            return Err(poisoned);
        }
        self.state.check_work()?;
        self.check_device_state()
    }

    /// The entry checks of a `&mut self` call: as [`enter`](Self::enter),
    /// after forgetting the queued work that succeeded and putting back
    /// the state from before a step the device refused as transient.
    pub(super) fn enter_mut(&mut self) -> Result<(), BackendError> {
        if let Some(poisoned) = self.state.poison() {
            return Err(poisoned);
        }
        self.state.settle()?;
        self.check_device_state()
    }

    /// The device's published state and the generation of the store's memory.
    fn check_device_state(&self) -> Result<(), BackendError> {
        check_device(&self.client, Some(self.params.generation()))
            .map_err(|error| self.state.fail(error))
    }

    /// The answer of a `&self` call that waited on the device with
    /// `waited`: its own failure (latched when device-level), else the first
    /// failure of the store's queued work, else the value.
    pub(super) fn after_wait<T>(&self, waited: Result<T, ServerError>) -> Result<T, BackendError> {
        let value = waited.map_err(|error| self.state.fail(BackendError::from(error)))?;
        self.state.check_work()?;
        if let Some(poisoned) = self.state.poison() {
            return Err(poisoned);
        }
        Ok(value)
    }
}
