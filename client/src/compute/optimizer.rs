//! Optimizer steps and AMP through a client: state buffers allocated in the
//! device's pools, one command per step, the found-inf flag read back as
//! four bytes.

use cistern_optim::OptimizerConfig;
use cistern_runtime::{
    Binding, Command, FailureToken, KernelLaunch, OptimizerStep, ServerError, StreamId,
    optimizer_error,
};

use super::{Buffer, ComputeClient};

/// An optimizer's state on the device: one buffer of `numel` `f32`s per
/// entry of the config's [`cistern_optim::StateLayout`], in its order.
#[derive(Clone, Debug)]
pub struct OptimizerState {
    buffers: Vec<Buffer>,
    numel: u64,
}

impl OptimizerState {
    /// The buffers, in state-layout order.
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// Each buffer whole, as an optimizer step binds them.
    pub fn bindings(&self) -> Vec<Binding> {
        self.buffers.iter().map(Buffer::whole).collect()
    }

    /// Elements per buffer (the parameter count).
    pub fn numel(&self) -> u64 {
        self.numel
    }
}

impl ComputeClient {
    /// Allocates `config`'s state for `numel` parameters and initialises
    /// each buffer to its layout's initial value; returns once they are
    /// initialised. An invalid config is `InvalidArgument` naming the field.
    pub fn optimizer_state(
        &self,
        config: &OptimizerConfig,
        numel: u64,
    ) -> Result<OptimizerState, ServerError> {
        config
            .validate()
            .map_err(|error| optimizer_error("optimizer_state", error))?;
        let bytes = numel
            .checked_mul(4)
            .filter(|&bytes| bytes > 0)
            .ok_or_else(|| ServerError::InvalidArgument {
                message: format!("optimizer_state `numel`: {numel} parameters"),
            })?;
        let stream = self.default_stream();
        let mut buffers = Vec::new();
        let mut fills = Vec::new();
        for state in config.state_layout().buffers {
            let buffer = self.reserve(bytes)?;
            fills.push(KernelLaunch::fill(
                buffer.whole(),
                state.initial_value as f32,
            ));
            buffers.push(buffer);
        }
        if !fills.is_empty() {
            self.launch_batch(stream, fills)?.wait()?;
        }
        Ok(OptimizerState { buffers, numel })
    }

    /// Queues one optimizer step on `stream` (one command, one kernel) and
    /// returns before it runs. The server checks the config, step count and
    /// segment table (`InvalidArgument`) and the bindings (`InvalidProgram`)
    /// before anything runs; a refusal by the kernel itself (LAMB's
    /// non-finite norms) is `InvalidArgument`, changes nothing and does not
    /// poison the device. Every failure reaches the token and the stream's
    /// next sync.
    pub fn optimizer_step(
        &self,
        stream: StreamId,
        step: OptimizerStep,
    ) -> Result<FailureToken, ServerError> {
        let token = FailureToken::new();
        self.server().send(Command::OptimizerStep {
            stream,
            step: Box::new(step),
            token: Some(token.clone()),
        })?;
        Ok(token)
    }

    /// Reads the AMP found-inf flag (the first four bytes of `flag`, as
    /// [`KernelLaunch::amp_unscale`] writes them) once `stream` reaches the
    /// read: whether a gradient was non-finite. This is a step's only sync.
    pub fn read_found_inf(&self, stream: StreamId, flag: &Buffer) -> Result<bool, ServerError> {
        let bytes = self.read_on(stream, flag, 0, 4)?;
        let word: [u8; 4] = bytes
            .get(..4)
            .and_then(|word| word.try_into().ok())
            .ok_or_else(|| ServerError::TransferFailed {
                message: format!("the found-inf flag read {} bytes", bytes.len()),
            })?;
        Ok(f32::from_ne_bytes(word) != 0.0)
    }
}
