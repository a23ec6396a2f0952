//! The memory manager driven by an arbitrary request sequence under a small
//! limit, its accounting checked after every request.

use cistern_memory::{
    AllocationId, AllocationPolicy, BookkeepingStorage, IoError, MemoryConfig, MemoryManager,
    StreamId,
};

const KIB: u64 = 1 << 10;
const LIMIT: u64 = 4 << 20;
const STREAMS: usize = 3;
/// Requests per input at most, so one input stays fast.
const MAX_STEPS: usize = 4096;

/// Reserve, free, free again, use, write, complete, reclaim, compact, pin,
/// locate and release-all, as the bytes choose, on pages or (first byte
/// odd) on the virtual range. After each: in use ≤ reserved ≤ limit, the
/// storage holds what the manager counts, live and requested bytes match;
/// a freed id is refused. At the end, everything freed, every stream
/// complete and a reclaim leave nothing reserved.
pub fn memory_manager(data: &[u8]) {
    let mut input = Input { data };
    let mapping = input.byte() & 1 == 1;
    let storage = BookkeepingStorage::new(256).with_map_granularity(mapping.then_some(16 * KIB));
    let mut run = match MemoryManager::new(storage, config()) {
        Ok(manager) => Run {
            manager,
            live: Vec::new(),
            freed: Vec::new(),
            issued: [0; STREAMS],
            completed: [0; STREAMS],
        },
        Err(error) => panic!("the fixed config is refused: {error}"),
    };
    for _ in 0..MAX_STEPS {
        if input.data.is_empty() {
            break;
        }
        run.step(&mut input);
        run.check();
    }
    run.finish();
}

/// Small pages and chunks, so a few requests span many pages.
fn config() -> MemoryConfig {
    MemoryConfig {
        limit: LIMIT,
        min_page_size: 64 * KIB,
        max_page_size: 1 << 20,
        max_page_sizes: 8,
        page_growth_divisor: 8,
        exclusive_threshold: 512 * KIB,
        exclusive_max_waste_percent: 25,
        idle_percent: 60,
        virtual_memory: true,
        chunk_size: 64 * KIB,
        max_block_chunks: 4,
    }
}

/// The bytes left; zeros once they run out.
struct Input<'a> {
    data: &'a [u8],
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&first, rest)) = self.data.split_first() else {
            return 0;
        };
        self.data = rest;
        first
    }

    fn u16(&mut self) -> u64 {
        u64::from(u16::from_le_bytes([self.byte(), self.byte()]))
    }

    /// An index below `len` (which is not zero).
    fn pick(&mut self, len: usize) -> usize {
        usize::from(self.byte()) % len
    }

    fn stream(&mut self) -> usize {
        self.pick(STREAMS)
    }
}

struct Live {
    id: AllocationId,
    requested: u64,
}

struct Run {
    manager: MemoryManager<BookkeepingStorage>,
    live: Vec<Live>,
    freed: Vec<AllocationId>,
    issued: [u64; STREAMS],
    completed: [u64; STREAMS],
}

impl Run {
    fn step(&mut self, input: &mut Input) {
        match input.byte() % 12 {
            0..=2 => self.reserve(input),
            3 => self.free(input),
            4 => self.refuse_freed(input),
            5 => self.record(input),
            6 => self.complete(input),
            7 => {
                self.manager.reclaim();
            }
            8 => self.compact(input),
            9 => self.pin(input),
            10 => self.locate(input),
            _ if input.byte() == 0xff => self.release_all(),
            _ => {}
        }
    }

    fn reserve(&mut self, input: &mut Input) {
        let scale = [1, 4, 20, 80][input.pick(4)];
        let size = input.u16() * scale;
        let stream = StreamId(input.stream() as u64);
        let policy = match input.byte() % 8 {
            0 => AllocationPolicy::Forbidden,
            1 => AllocationPolicy::DryRun,
            _ => AllocationPolicy::Allow,
        };
        match self.manager.reserve(size, policy, 0, stream) {
            Ok(id) => {
                assert_eq!(self.manager.size_of(id).ok(), Some(size));
                self.live.push(Live {
                    id,
                    requested: size,
                });
            }
            Err(IoError::BufferTooBig { .. }) => {
                assert!(size > LIMIT, "{size} bytes refused as too big")
            }
            Err(_) => {}
        }
    }

    fn free(&mut self, input: &mut Input) {
        if self.live.is_empty() {
            return;
        }
        let live = self.live.swap_remove(input.pick(self.live.len()));
        assert!(self.manager.free(live.id).is_ok(), "a live id frees");
        self.freed.push(live.id);
    }

    fn refuse_freed(&mut self, input: &mut Input) {
        if self.freed.is_empty() {
            return;
        }
        let id = self.freed[input.pick(self.freed.len())];
        let refused = |result: Result<(), IoError>| matches!(result, Err(IoError::NotFound { .. }));
        assert!(refused(self.manager.free(id)), "a freed id frees again");
        assert!(
            refused(self.manager.locate(id).map(drop)),
            "a freed id locates"
        );
        assert!(
            refused(self.manager.size_of(id).map(drop)),
            "a freed id has a size"
        );
        assert!(
            refused(self.manager.record_use(id, StreamId(0), 1)),
            "a freed id records a use"
        );
        assert!(
            refused(self.manager.set_pinned(id, true)),
            "a freed id is pinned"
        );
    }

    fn record(&mut self, input: &mut Input) {
        if self.live.is_empty() {
            return;
        }
        let id = self.live[input.pick(self.live.len())].id;
        let stream = input.stream();
        let writes = input.byte() & 1 == 1;
        self.issued[stream] += 1;
        let (stream_id, sequence) = (StreamId(stream as u64), self.issued[stream]);
        let mut conflicts = Vec::new();
        let asked = self
            .manager
            .conflicts(id, stream_id, writes, &mut conflicts);
        assert!(asked.is_ok(), "a live id's conflicts are known");
        assert!(conflicts.iter().all(|&(other, _)| other != stream_id));
        let recorded = if writes {
            self.manager.record_write(id, stream_id, sequence)
        } else {
            self.manager.record_use(id, stream_id, sequence)
        };
        assert!(recorded.is_ok(), "a live id records a use");
    }

    fn complete(&mut self, input: &mut Input) {
        let stream = input.stream();
        let (done, issued) = (self.completed[stream], self.issued[stream]);
        let sequence = done + (issued - done) * u64::from(input.byte()) / 255;
        self.manager
            .stream_completed(StreamId(stream as u64), sequence);
        self.completed[stream] = sequence;
    }

    fn compact(&mut self, input: &mut Input) {
        let plan = self.manager.plan_compaction();
        for relocation in &plan.moves {
            assert!(self.live.iter().any(|live| live.id == relocation.id));
            assert_eq!(relocation.to.size, relocation.from.size);
        }
        if input.byte() & 1 == 1 {
            let committed = self.manager.commit_compaction(plan);
            assert!(committed.is_ok(), "the current plan commits: {committed:?}");
        } else {
            self.manager.abort_compaction(plan);
        }
    }

    fn pin(&mut self, input: &mut Input) {
        if self.live.is_empty() {
            return;
        }
        let id = self.live[input.pick(self.live.len())].id;
        let pinned = input.byte() & 1 == 1;
        assert!(
            self.manager.set_pinned(id, pinned).is_ok(),
            "a live id pins"
        );
    }

    fn locate(&mut self, input: &mut Input) {
        if self.live.is_empty() {
            return;
        }
        let live = &self.live[input.pick(self.live.len())];
        match self.manager.locate(live.id) {
            Ok(location) => assert!(location.size >= live.requested, "{location:?}"),
            Err(error) => panic!("a live id does not locate: {error}"),
        }
    }

    fn release_all(&mut self) {
        self.manager.release_all();
        self.freed.extend(self.live.drain(..).map(|live| live.id));
        assert_eq!(
            self.manager.stats().reserved_bytes,
            0,
            "release_all keeps pages"
        );
    }

    fn check(&self) {
        let stats = self.manager.stats();
        assert!(stats.in_use_bytes <= stats.reserved_bytes, "{stats:?}");
        assert!(stats.reserved_bytes <= LIMIT, "{stats:?}");
        let storage = self.manager.storage();
        assert_eq!(
            storage.held_bytes() + stats.unbacked_bytes,
            stats.reserved_bytes,
            "the storage holds what the manager counts: {stats:?}"
        );
        assert_eq!(storage.mapped_bytes(), stats.mapped_bytes, "{stats:?}");
        assert_eq!(stats.live_allocations, self.live.len() as u64);
        let requested: u64 = self.live.iter().map(|live| live.requested).sum();
        assert_eq!(stats.requested_bytes, requested, "{stats:?}");
    }

    fn finish(mut self) {
        for live in std::mem::take(&mut self.live) {
            assert!(self.manager.free(live.id).is_ok(), "a live id frees");
        }
        for (stream, &issued) in self.issued.iter().enumerate() {
            self.manager
                .stream_completed(StreamId(stream as u64), issued);
        }
        self.manager.reclaim();
        let stats = self.manager.stats();
        assert_eq!(
            (
                stats.in_use_bytes,
                stats.reserved_bytes,
                stats.pending_free_bytes
            ),
            (0, 0, 0),
            "everything freed, complete and reclaimed leaves nothing: {stats:?}"
        );
        assert_eq!(
            self.manager.storage().held_buffers(),
            0,
            "the storage holds nothing"
        );
    }
}
