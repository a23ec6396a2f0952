//! `cistern bench alloc`: replays an allocation trace through the memory
//! manager on bookkeeping-only storage and prints one JSON line.
//!
//! The trace (from `shared/traces/gen_trace.py`) is parsed before timing;
//! `requests` and `peak_in_use` come from the trace alone, the reserved
//! figures from a counting storage the benchmark owns. With `mapping` the
//! storage can map buffers into address ranges, so the manager backs its
//! virtual range chunk by chunk; buffers allocated for that are counted like
//! any other, and address ranges hold no bytes.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use cistern_memory::{
    AllocationId, AllocationPolicy, BookkeepingStorage, IoError, MemoryConfig, MemoryManager,
    Storage, StorageHandle, StorageId, StreamId,
};

const TIMED_RUNS: usize = 3;
const ALIGNMENT: u64 = 256;
const GIB: u64 = 1 << 30;

/// The storage's map granularity when it can map: 2 MiB, CUDA's usual
/// granularity for mapped device memory.
const MAP_GRANULARITY: u64 = 2 << 20;

/// Replays the trace at `trace` three times and prints one JSON line.
pub fn run(trace: &Path, mapping: bool) -> Result<(), String> {
    run_with(trace, &bench_config(), mapping)
}

/// Like [`run`], with another manager configuration (for tuning).
pub fn run_with(trace: &Path, config: &MemoryConfig, mapping: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(trace)
        .map_err(|e| format!("cannot read trace {}: {e}", trace.display()))?;
    let replay = Replay::parse(&text)?;
    let mut best_ns = f64::INFINITY;
    let mut held = Held::default();
    for _ in 0..TIMED_RUNS {
        let (elapsed, run_held) = replay.run(config, mapping)?;
        best_ns = best_ns.min(elapsed);
        held = run_held;
    }
    let requests = replay.ops.len() as u64;
    let line = serde_json::json!({
        "allocator": "cistern",
        "requests": requests,
        "ns_per_request": (best_ns / requests.max(1) as f64 * 100.0).round() / 100.0,
        "peak_in_use": replay.peak_in_use,
        "peak_reserved": held.peak,
        "final_reserved": held.now,
        "storage_allocs": held.allocs,
        "storage_maps": held.maps,
        "mapping": mapping,
        "config": config,
    });
    println!("{line}");
    Ok(())
}

/// The manager's configuration for the replay: defaults under a limit far
/// above any trace's live set.
pub fn bench_config() -> MemoryConfig {
    MemoryConfig::with_limit(64 * GIB)
}

/// One request of a trace, its id renumbered to a dense slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Reserve { slot: u32, bytes: u64 },
    Free { slot: u32 },
    Reclaim,
}

/// A parsed trace: its requests, the slots they name, and the most bytes
/// live at once.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Replay {
    pub(crate) ops: Vec<Op>,
    slots: usize,
    pub(crate) peak_in_use: u64,
}

impl Replay {
    /// Parses a trace; a malformed line is an error naming it.
    pub(crate) fn parse(text: &str) -> Result<Replay, String> {
        let mut ops = Vec::new();
        let mut slots: HashMap<u64, u32> = HashMap::new();
        let mut live: HashMap<u32, u64> = HashMap::new();
        let (mut in_use, mut peak_in_use) = (0u64, 0u64);
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let bad = |what: &str| format!("malformed trace, line {number}: {what}: {line:?}");
            let mut words = line.split_whitespace();
            let Some(word) = words.next() else { continue };
            if word.starts_with('#') {
                continue;
            }
            let mut field = |name: &str| -> Result<u64, String> {
                words
                    .next()
                    .ok_or_else(|| bad(&format!("missing {name}")))?
                    .parse::<u64>()
                    .map_err(|_| bad(&format!("{name} is not a whole number")))
            };
            let op = match word {
                "r" => {
                    let (id, bytes) = (field("id")?, field("bytes")?);
                    if slots.contains_key(&id) {
                        return Err(bad("id reserved twice"));
                    }
                    let slot = u32::try_from(slots.len()).map_err(|_| bad("too many ids"))?;
                    in_use = in_use
                        .checked_add(bytes)
                        .ok_or_else(|| bad("live bytes exceed 2^64"))?;
                    slots.insert(id, slot);
                    live.insert(slot, bytes);
                    peak_in_use = peak_in_use.max(in_use);
                    Op::Reserve { slot, bytes }
                }
                "f" => {
                    let id = field("id")?;
                    let slot = *slots.get(&id).ok_or_else(|| bad("free of an unknown id"))?;
                    let bytes = live.remove(&slot).ok_or_else(|| bad("id freed twice"))?;
                    in_use -= bytes;
                    Op::Free { slot }
                }
                "c" => Op::Reclaim,
                _ => return Err(bad("unknown request")),
            };
            if words.next().is_some() {
                return Err(bad("trailing fields"));
            }
            ops.push(op);
        }
        Ok(Replay {
            ops,
            slots: slots.len(),
            peak_in_use,
        })
    }

    /// The trace as text that parses back to it, each id its slot.
    pub(crate) fn to_text(&self) -> String {
        let mut text = String::new();
        for op in &self.ops {
            let line = match op {
                Op::Reserve { slot, bytes } => format!("r {slot} {bytes}\n"),
                Op::Free { slot } => format!("f {slot}\n"),
                Op::Reclaim => "c\n".to_string(),
            };
            text.push_str(&line);
        }
        text
    }

    /// One replay on a fresh manager: nanoseconds taken and what the storage held.
    pub(crate) fn run(&self, config: &MemoryConfig, mapping: bool) -> Result<(f64, Held), String> {
        let granularity = mapping.then_some(MAP_GRANULARITY);
        let storage = CountingStorage {
            inner: BookkeepingStorage::new(ALIGNMENT).with_map_granularity(granularity),
            held: Held::default(),
        };
        let mut manager = MemoryManager::new(storage, config.clone()).map_err(|e| e.to_string())?;
        let mut ids = vec![AllocationId(u64::MAX); self.slots];
        let stream = StreamId(0);
        let start = Instant::now();
        for (index, &op) in self.ops.iter().enumerate() {
            let failed = |e: IoError| format!("request {} failed: {e}", index + 1);
            match op {
                Op::Reserve { slot, bytes } => {
                    ids[slot as usize] = manager
                        .reserve(bytes, AllocationPolicy::Allow, 0, stream)
                        .map_err(failed)?;
                }
                Op::Free { slot } => manager.free(ids[slot as usize]).map_err(failed)?,
                Op::Reclaim => {
                    manager.reclaim();
                }
            }
        }
        let elapsed = start.elapsed().as_nanos() as f64;
        Ok((elapsed, manager.storage().held))
    }
}

/// Storage allocations counted by the benchmark itself.
#[derive(Clone, Copy, Default)]
pub(crate) struct Held {
    now: u64,
    peak: u64,
    allocs: u64,
    /// Chunks mapped into the virtual range.
    maps: u64,
}

struct CountingStorage {
    inner: BookkeepingStorage,
    held: Held,
}

impl Storage for CountingStorage {
    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let handle = self.inner.alloc(size)?;
        self.held.allocs += 1;
        self.held.now += handle.size;
        self.held.peak = self.held.peak.max(self.held.now);
        Ok(handle)
    }

    fn dealloc(&mut self, id: StorageId) {
        let before = self.inner.held_bytes();
        self.inner.dealloc(id);
        self.held.now -= before - self.inner.held_bytes();
    }

    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }

    fn max_buffer_size(&self) -> u64 {
        self.inner.max_buffer_size()
    }

    fn contains(&self, id: StorageId) -> bool {
        self.inner.contains(id)
    }

    fn map_granularity(&self) -> Option<u64> {
        self.inner.map_granularity()
    }

    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        self.inner.reserve_range(size)
    }

    fn release_range(&mut self, range: StorageId) {
        self.inner.release_range(range)
    }

    fn map(
        &mut self,
        range: StorageId,
        range_offset: u64,
        buffer: StorageId,
        buffer_offset: u64,
        size: u64,
    ) -> Result<(), IoError> {
        self.held.maps += 1;
        self.inner
            .map(range, range_offset, buffer, buffer_offset, size)
    }

    fn unmap(&mut self, range: StorageId, range_offset: u64, size: u64) {
        self.inner.unmap(range, range_offset, size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_gives_its_requests_and_peak_in_use_before_any_replay() {
        let replay = Replay::parse("# header\nr 0 100\nr 7 50\nf 0\nr 9 80\nc\nf 7\nf 9\n")
            .expect("well formed");
        assert_eq!(replay.ops.len(), 7);
        assert_eq!(replay.peak_in_use, 150);
        let (_, held) = replay.run(&bench_config(), false).expect("replays");
        assert_eq!(
            held.now,
            1 << 23,
            "one page kept: the trace's last line is not a cleanup"
        );
        assert!(held.peak >= held.now);
        let (_, held) = replay.run(&bench_config(), true).expect("replays");
        assert_eq!(
            (held.now, held.allocs),
            (2 << 20, 1),
            "one chunk's block kept: the trace's last line is not a cleanup"
        );
    }

    #[test]
    fn a_malformed_trace_is_a_clear_error() {
        for (trace, what) in [
            ("r 1\n", "missing bytes"),
            ("r 1 ten\n", "not a whole number"),
            ("f 3\n", "unknown id"),
            ("r 1 8\nr 1 8\n", "reserved twice"),
            ("r 1 8\nf 1\nf 1\n", "freed twice"),
            ("x\n", "unknown request"),
            ("c now\n", "trailing"),
            ("r 1 18446744073709551615\nr 2 1\n", "exceed 2^64"),
        ] {
            match Replay::parse(trace) {
                Err(message) => assert!(message.contains(what), "{message:?} lacks {what:?}"),
                Ok(_) => panic!("{trace:?} parsed"),
            }
        }
    }
}
