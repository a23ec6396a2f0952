//! `AllocationPolicy`: whether a request may add pages.

use serde::{Deserialize, Serialize};

/// Whether a reservation may add pages, and whether they get memory at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AllocationPolicy {
    /// Use free space in the pages held, or add a page.
    Allow,
    /// Use free space in the pages held only (a graph is being captured);
    /// a request that does not fit is `PageUpdateForbidden`.
    Forbidden,
    /// Like `Allow`, but a page added for the request has no memory until a
    /// slice of it is first resolved (`locate`); a failure then is
    /// `StorageMappingFailed`.
    DryRun,
}
