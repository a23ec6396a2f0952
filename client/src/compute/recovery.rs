//! The client's side of the context state machine: reading the state and
//! recovering a poisoned device.

use cistern_runtime::{Command, ContextState, ServerError};

use super::ComputeClient;

impl ComputeClient {
    /// The device context's state now (answered in every state): read the
    /// generation here before work you may later need to `invalidate` for.
    pub fn context_state(&self) -> Result<ContextState, ServerError> {
        self.server().call(|reply| Command::ContextState { reply })
    }

    /// Recovers a context poisoned in `seen_generation` (the generation of
    /// the `ContextPoisoned` error you got): drains the device, probes it,
    /// and answers `Active` with the next generation. Every buffer made
    /// before is then stale: drop them and upload again from host copies.
    ///
    /// A late or duplicate call changes nothing and answers the state now;
    /// calls made while a recovery runs wait for its outcome.
    /// `ContextUnrecoverable` means the device is lost for the life of the
    /// process: restart it.
    pub fn invalidate(&self, seen_generation: u64) -> Result<ContextState, ServerError> {
        self.server().call(|reply| Command::Invalidate {
            seen_generation,
            reply,
        })
    }
}
