//! The memory monitor: a thread that samples the device's memory stats
//! while a stress run goes, for the plot and the peak.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cistern_client::ComputeClient;
use cistern_runtime::sync::{Receiver, bounded};
use serde::{Deserialize, Serialize};

/// The most samples kept: past it, every other one is dropped and the
/// interval doubles, so a long run still fits.
const MAX_SAMPLES: usize = 20_000;

/// The device's memory at one moment of a run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the run started.
    pub seconds: f64,
    /// Bytes of pages held.
    pub reserved_bytes: u64,
    /// Bytes of live allocations' slices.
    pub in_use_bytes: u64,
    /// The manager's highest reserved bytes so far (it restarts with a
    /// recovered context).
    pub peak_reserved_bytes: u64,
}

/// A running monitor; [`stop`](Self::stop) returns its samples.
#[derive(Debug)]
pub struct Monitor {
    stop: Arc<AtomicBool>,
    samples: Receiver<Vec<Sample>>,
}

impl Monitor {
    /// Starts sampling `client`'s memory stats every `interval`, on the
    /// clock that started at `start`.
    pub fn start(
        client: ComputeClient,
        start: Instant,
        interval: Duration,
    ) -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (send, samples) = bounded(1);
        let stopping = stop.clone();
        std::thread::Builder::new()
            .name("cistern-stress-monitor".into())
            .spawn(move || {
                let mut interval = interval.max(Duration::from_millis(1));
                let mut samples = Vec::new();
                loop {
                    // Stats are answered in every context state; a failed
                    // query (the server ended) just leaves a gap.
                    if let Ok(stats) = client.memory_stats() {
                        samples.push(Sample {
                            seconds: start.elapsed().as_secs_f64(),
                            reserved_bytes: stats.reserved_bytes,
                            in_use_bytes: stats.in_use_bytes,
                            peak_reserved_bytes: stats.peak_reserved_bytes,
                        });
                    }
                    if samples.len() >= MAX_SAMPLES {
                        samples = samples.into_iter().step_by(2).collect();
                        interval *= 2;
                    }
                    if stopping.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(interval);
                }
                let _ = send.send(samples);
            })
            .map_err(|e| format!("cannot start the memory monitor: {e}"))?;
        Ok(Monitor { stop, samples })
    }

    /// Stops the monitor and returns its samples; empty if it does not
    /// answer within `patience` (its server stopped answering).
    pub fn stop(self, patience: Duration) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.samples.recv_timeout(patience).unwrap_or_default()
    }
}
