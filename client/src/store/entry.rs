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
    /// `waited`: its own failure (latched when device-level); else, where
    /// the re-check finds the store's queued work failed, the latch and
    /// `StorePoisoned` naming that failure (as the original API answers);
    /// else the value. A transient refusal is answered as itself.
    pub(super) fn after_wait<T>(&self, waited: Result<T, ServerError>) -> Result<T, BackendError> {
        let value = waited.map_err(|error| self.state.fail(BackendError::from(error)))?;
        // A failure found here has latched the store: answered below.
        match self.state.check_work() {
            Err(error) if error.is_transient() => return Err(error),
            _ => {}
        }
        if let Some(poisoned) = self.state.poison() {
            return Err(poisoned);
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use cistern_optim::{OptimizerConfig, SgdConfig};
    use cistern_runtime::{Device, DeviceOptions, FailureToken, PendingToken, ServerError};

    use super::*;
    use crate::compute::ComputeClient;
    use crate::store::state::OptimizerRun;
    use crate::tape::{Tape, Tensor};

    #[test]
    fn the_re_check_after_a_wait_latches_and_answers_store_poisoned_naming_the_failure() {
        let options = DeviceOptions::with_memory_limit(1 << 20);
        let Ok(client) = ComputeClient::open(Device::Cpu(0), options) else {
            panic!("cpu:0 opens");
        };
        let Ok(weight) = Tensor::new([2], vec![1.0, 2.0]) else {
            panic!("a tensor");
        };
        let Ok(mut store) = DeviceParamStore::new(&Tape::new(&client), &[&weight]) else {
            panic!("the store");
        };
        // A queued step whose launch the device refused while the call waited.
        let token = FailureToken::new();
        let refusal = ServerError::KernelLaunchFailed {
            kernel: "sgd".into(),
            message: "refused".into(),
        };
        PendingToken::new(token.clone(), 0).fail(refusal);
        let run = OptimizerRun {
            config: OptimizerConfig::Sgd(SgdConfig::default()),
            state: Vec::new(),
            steps: 1,
            device_amp: None,
        };
        store.state.commit_step(token, run);
        let answer = store.after_wait(Ok(()));
        let Err(BackendError::StorePoisoned { cause }) = answer else {
            panic!("{answer:?}");
        };
        assert!(
            matches!(*cause, BackendError::KernelLaunchFailed(_)),
            "{cause:?}"
        );
        assert!(store.is_poisoned());
        assert!(matches!(
            store.sync_to_host(),
            Err(BackendError::StorePoisoned { .. })
        ));
    }
}
