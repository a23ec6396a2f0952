//! `StreamProgress`: what a stream has reported, readable without waiting.

use std::sync::atomic::{AtomicU64, Ordering};

/// The last reported sequence shifted left by one, with the low bit set
/// while an error is latched. Published after the completion it describes
/// is sent, so a server that sees the stream idle also finds its completion.
#[derive(Debug, Default)]
pub struct StreamProgress(AtomicU64);

impl StreamProgress {
    /// Whether everything up to `sequence` ran, was reported, and left no
    /// latched error.
    pub fn is_clean_at(&self, sequence: u64) -> bool {
        self.0.load(Ordering::Acquire) == sequence << 1
    }

    /// The highest sequence reported so far.
    pub fn reported(&self) -> u64 {
        self.0.load(Ordering::Acquire) >> 1
    }

    pub(super) fn publish(&self, reported: u64, latched: bool) {
        self.0
            .store((reported << 1) | u64::from(latched), Ordering::Release);
    }
}
