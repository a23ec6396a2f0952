//! `TestOptions`: how a test device and the core over it are built.

use std::time::Duration;

use cistern_memory::MemoryConfig;

use crate::device::DEFAULT_DRAIN_TIMEOUT;
use crate::fault::FaultPlan;
use crate::ids::ServerId;

/// The settings of a [`TestServer`](super::TestServer). The default: server
/// 7, a 64 MiB memory limit, no faults, the default drain bound, every
/// strided copy accepted, and every sync sent to the device as a marker.
#[derive(Clone, Debug)]
pub struct TestOptions {
    /// The server's id, carried by every handle it makes.
    pub server: ServerId,
    /// The memory manager's configuration.
    pub memory: MemoryConfig,
    /// The faults the server injects.
    pub faults: FaultPlan,
    /// How long a recovery's drain and probe may take.
    pub drain_timeout: Duration,
    /// Strided copies of at most this many dimensions are accepted; `None`
    /// declines every strided copy.
    pub max_strided_dims: Option<usize>,
    /// Whether the device tells the server when a stream is idle, so the
    /// server answers syncs on it without a marker.
    pub reports_idle_streams: bool,
}

impl Default for TestOptions {
    fn default() -> Self {
        TestOptions {
            server: ServerId(7),
            memory: MemoryConfig::with_limit(64 << 20),
            faults: FaultPlan::none(),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            max_strided_dims: Some(usize::MAX),
            reports_idle_streams: false,
        }
    }
}
