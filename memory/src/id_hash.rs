//! A hasher for Cistern's own small integer ids (storages, streams, events).
//!
//! The ids are dense counters chosen by Cistern, never by an attacker, so
//! SipHash's protection buys nothing on the per-command path; a
//! multiplicative hash is a few times cheaper.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by one of Cistern's own ids.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of the integers written into it.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(u64::from(*byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_ids_hash_apart() {
        let hash = |value: u64| {
            let mut hasher = IdHasher::default();
            hasher.write_u64(value);
            hasher.finish()
        };
        assert_ne!(hash(0), hash(1));
        assert_ne!(hash(1), hash(2));
    }
}
