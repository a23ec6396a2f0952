//! Recovery in place: a replica that failed gets its device back
//! (invalidate and probe) and its store rebuilt from a healthy replica's
//! parameters and optimizer state, sent to it over the group's engine.

use cistern_client::{
    BackendError, ComputeClient, DeviceParamStore, OptimizerCheckpoint, StoreCheckpoint, Tape,
};
use cistern_optim::OptimizerConfig;
use cistern_runtime::ContextState;

use crate::error::GroupError;
use crate::group::{ReplicaGroup, Shard};

impl ReplicaGroup {
    /// Brings the replicas `failed` back, on every process alike: their
    /// devices recovered, then their stores restored from the first
    /// healthy replica's checkpoint. A device that stays down, no healthy
    /// replica, or a restore that fails is `Ended` (the caller ends the
    /// group).
    pub(crate) fn recover(
        &mut self,
        failed: &[usize],
        config: &OptimizerConfig,
    ) -> Result<(), GroupError> {
        let devices: Vec<Result<Shard, BackendError>> = self
            .replicas
            .iter()
            .map(|replica| match failed.contains(&replica.index) {
                true => recover_device(&replica.client).map(|()| no_shard()),
                false => Ok(no_shard()),
            })
            .collect();
        self.agree(&devices, "could not recover their devices")?;
        let donor = (0..self.count())
            .find(|replica| !failed.contains(replica))
            .ok_or_else(|| {
                GroupError::Ended("every replica failed: none can hand over its state".into())
            })?;
        let checkpoint = self.donor_checkpoint(donor, config)?;
        let mut restored = Vec::with_capacity(self.replicas.len());
        for replica in &mut self.replicas {
            if !failed.contains(&replica.index) {
                restored.push(Ok(no_shard()));
                continue;
            }
            let tape = Tape::new(&replica.client);
            restored.push(match DeviceParamStore::restore(&tape, &checkpoint) {
                Ok(store) => {
                    replica.store = store;
                    Ok(no_shard())
                }
                Err(error) => Err(error),
            });
        }
        self.agree(&restored, "could not rebuild their stores")
    }

    /// A vote on `outcomes`: `Ended` naming the replicas that failed, with
    /// this process's first error.
    fn agree(
        &mut self,
        outcomes: &[Result<Shard, BackendError>],
        what: &str,
    ) -> Result<(), GroupError> {
        let (_, failed) = self.vote(outcomes)?;
        if failed.is_empty() {
            return Ok(());
        }
        let local = outcomes
            .iter()
            .find_map(|outcome| outcome.as_ref().err())
            .map(|error| format!(": {error}"))
            .unwrap_or_default();
        Err(GroupError::Ended(format!(
            "replicas {failed:?} {what}{local}"
        )))
    }

    /// Replica `donor`'s checkpoint on every process: taken where it
    /// lives, broadcast from there (a header of whether its optimizer
    /// stepped and its step count, the parameters, then each state buffer).
    fn donor_checkpoint(
        &mut self,
        donor: usize,
        config: &OptimizerConfig,
    ) -> Result<StoreCheckpoint, GroupError> {
        let locals = self.replicas.len();
        let root = donor / locals;
        let local =
            match root == self.engine.rank() {
                true => Some(self.replicas[donor % locals].store.checkpoint().map_err(
                    |error| GroupError::Replica {
                        replica: donor,
                        error,
                    },
                )?),
                false => None,
            };
        if self.engine.size() == 1 {
            return local.ok_or_else(|| GroupError::Ended("the donor is not here".into()));
        }
        let mut header = [0.0f32; 3];
        if let Some(optimizer) = local.as_ref().and_then(|c| c.optimizer.as_ref()) {
            header = [
                1.0,
                f32::from_bits(optimizer.steps as u32),
                f32::from_bits((optimizer.steps >> 32) as u32),
            ];
        }
        self.engine.broadcast(root, &mut header)?;
        let numel = self.numel;
        let mut params = local
            .as_ref()
            .map_or_else(|| vec![0.0; numel], |c| c.params.clone());
        self.engine.broadcast(root, &mut params)?;
        let optimizer = match header[0] == 1.0 {
            false => None,
            true => {
                let buffers = config.state_layout().buffers.len();
                let mut state = Vec::with_capacity(buffers);
                for buffer in 0..buffers {
                    let mut values = local
                        .as_ref()
                        .and_then(|c| c.optimizer.as_ref())
                        .and_then(|o| o.state.get(buffer).cloned())
                        .unwrap_or_else(|| vec![0.0; numel]);
                    self.engine.broadcast(root, &mut values)?;
                    state.push(values);
                }
                let steps = u64::from(header[1].to_bits()) | (u64::from(header[2].to_bits()) << 32);
                let config = local
                    .as_ref()
                    .and_then(|c| c.optimizer.as_ref())
                    .map_or_else(|| config.clone(), |o| o.config.clone());
                Some(OptimizerCheckpoint {
                    config,
                    steps,
                    state,
                    device_amp: None,
                })
            }
        };
        Ok(StoreCheckpoint {
            shapes: self.replicas[0].store.shapes(),
            params,
            optimizer,
        })
    }
}

/// A vote's entry for a replica that is fine.
fn no_shard() -> Shard {
    Shard {
        loss: 0.0,
        examples: 0,
    }
}

/// The device of `client` active again: a poisoned context invalidated
/// and probed (a retiring one waited for); an active one as it is.
fn recover_device(client: &ComputeClient) -> Result<(), BackendError> {
    let generation = match client.context_state()? {
        ContextState::Active { .. } => return Ok(()),
        ContextState::Poisoned { generation, .. } | ContextState::Retiring { generation } => {
            generation
        }
        other => {
            return Err(BackendError::DeviceContextUnrecoverable {
                ordinal: client.device().ordinal(),
                probe_error: format!("the device cannot be recovered from {other:?}"),
            });
        }
    };
    match client.invalidate(generation)? {
        ContextState::Active { .. } => Ok(()),
        other => Err(BackendError::DeviceContextUnrecoverable {
            ordinal: client.device().ordinal(),
            probe_error: format!("after invalidate the device is {other:?}"),
        }),
    }
}
