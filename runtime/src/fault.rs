//! `FaultPlan`: faults a test asks the runtime to inject.

/// Faults to inject into a server, so tests can prove every failure reaches
/// its owner. The default plan injects nothing and is checked with one
/// comparison per command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// The server thread panics while handling its Nth command (counting
    /// from 1), as if it had a bug: every waiting and later call must see
    /// `ServerPanicked`.
    pub server_panic_at_command: Option<u64>,
}

/// The message of a caught panic, for errors and traces.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic with a non-text payload".to_string()
    }
}
