//! Property tests of the memory manager against a simple model: random
//! reserves, frees, reclaims, compactions and stream uses under a small limit,
//! on pages and on the virtual range (a storage that can map).

mod common;

use cistern_memory::{
    AllocationId, AllocationPolicy, BookkeepingStorage, IoError, MemoryManager, PoolKind, Reason,
    SliceLocation, SliceUse, StreamId,
};
use common::*;
use proptest::prelude::*;

const LIMIT: u64 = 4 * MIB;
const STREAMS: usize = 3;

#[derive(Clone, Debug)]
enum Step {
    Reserve {
        size: u64,
        stream: usize,
        forbidden: bool,
    },
    Free {
        pick: usize,
    },
    FreeStale {
        pick: usize,
    },
    Use {
        pick: usize,
        stream: usize,
    },
    Complete {
        stream: usize,
        all: bool,
    },
    Reclaim,
    Compact {
        commit: bool,
    },
    Pin {
        pick: usize,
        pinned: bool,
    },
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0..20_000u64,
        3 => 20_000..300_000u64,
        2 => 500_000..1_300_000u64,
        1 => 3_000_000..5_000_000u64,
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (size(), 0..STREAMS, prop::bool::weighted(0.1))
            .prop_map(|(size, stream, forbidden)| Step::Reserve { size, stream, forbidden }),
        4 => any::<usize>().prop_map(|pick| Step::Free { pick }),
        1 => any::<usize>().prop_map(|pick| Step::FreeStale { pick }),
        2 => (any::<usize>(), 0..STREAMS).prop_map(|(pick, stream)| Step::Use { pick, stream }),
        2 => (0..STREAMS, any::<bool>()).prop_map(|(stream, all)| Step::Complete { stream, all }),
        1 => Just(Step::Reclaim),
        1 => any::<bool>().prop_map(|commit| Step::Compact { commit }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, pinned)| Step::Pin { pick, pinned }),
    ]
}

struct Live {
    id: AllocationId,
    requested: u64,
    location: SliceLocation,
    uses: Vec<(usize, u64)>,
    pinned: bool,
}

struct Pending {
    location: SliceLocation,
    outstanding: Vec<(usize, u64)>,
}

#[derive(Default)]
struct Model {
    live: Vec<Live>,
    freed: Vec<AllocationId>,
    issued: [u64; STREAMS],
    completed: [Option<u64>; STREAMS],
    pending: Vec<Pending>,
}

impl Model {
    fn in_flight(&self, uses: &[(usize, u64)]) -> Vec<(usize, u64)> {
        uses.iter()
            .copied()
            .filter(|&(stream, seq)| self.completed[stream].is_none_or(|done| done < seq))
            .collect()
    }
}

fn padded(size: u64) -> u64 {
    size.max(1).next_multiple_of(256)
}

fn overlaps(a: &SliceLocation, b: &SliceLocation) -> bool {
    a.storage == b.storage && a.offset < b.offset + b.size && b.offset < a.offset + a.size
}

fn check_invariants(m: &MemoryManager<BookkeepingStorage>, model: &Model) {
    let stats = m.stats();
    assert_eq!(m.storage().mapped_bytes(), stats.mapped_bytes, "{stats:?}");
    assert!(m.storage().held_ranges() <= 1, "one virtual range at most");
    assert!(stats.in_use_bytes <= stats.reserved_bytes, "{stats:?}");
    assert!(stats.reserved_bytes <= LIMIT, "{stats:?}");
    assert_eq!(m.storage().held_bytes(), stats.reserved_bytes);
    assert_eq!(stats.live_allocations, model.live.len() as u64);
    let requested: u64 = model.live.iter().map(|l| l.requested).sum();
    assert_eq!(stats.requested_bytes, requested);
    let pending: u64 = model.pending.iter().map(|p| p.location.size).sum();
    assert_eq!(stats.pending_free_bytes, pending);
    let snapshot = m.snapshot();
    let mut allocated = Vec::new();
    for page in &snapshot.pages {
        let mut offset = 0;
        for slice in &page.slices {
            assert_eq!(slice.offset, offset, "slices tile the page: {page:?}");
            assert_eq!(slice.offset % 256, 0, "aligned offset");
            assert_eq!(slice.size % 256, 0, "aligned size");
            assert!(slice.size > 0);
            offset += slice.size;
            let storage = page.storage.expect("no dry runs here");
            if page.pool == PoolKind::Virtual && slice.state != SliceUse::Free {
                assert!(
                    m.storage().is_mapped(storage, slice.offset, slice.size),
                    "a held slice of the virtual range is backed: {slice:?}"
                );
            }
            if let SliceUse::Allocated { id, .. } = slice.state {
                allocated.push((
                    id,
                    SliceLocation {
                        storage,
                        offset: slice.offset,
                        size: slice.size,
                    },
                ));
            }
        }
        assert_eq!(offset, page.size, "slices cover the page");
    }
    assert_eq!(allocated.len(), model.live.len());
    for live in &model.live {
        assert!(
            allocated.contains(&(live.id, live.location)),
            "{:?} is where the model says",
            live.id
        );
    }
}

/// The most bytes of chunks a request of `padded` bytes can need: its own,
/// rounded up, and one more where it straddles a boundary.
fn chunk_need(padded: u64) -> u64 {
    (padded.div_ceil(CHUNK) + 1) * CHUNK
}

fn run(steps: Vec<Step>, mapping: bool) {
    let mut m = if mapping {
        virtual_manager(LIMIT)
    } else {
        manager(LIMIT)
    };
    let mut model = Model::default();
    for step in steps {
        match step {
            Step::Reserve {
                size,
                stream,
                forbidden,
            } => {
                let policy = if forbidden {
                    AllocationPolicy::Forbidden
                } else {
                    AllocationPolicy::Allow
                };
                let reserved_before = m.stats().reserved_bytes;
                match m.reserve(size, policy, 0, StreamId(stream as u64)) {
                    Ok(id) => {
                        assert!(padded(size) <= LIMIT, "a too-big request succeeded");
                        if mapping {
                            assert!(m.stats().virtual_blocks > 0, "the virtual range serves");
                        }
                        if forbidden {
                            assert_eq!(
                                m.stats().reserved_bytes,
                                reserved_before,
                                "Forbidden added a page"
                            );
                        }
                        let location = m.locate(id).expect("a fresh id resolves");
                        assert!(location.size >= padded(size));
                        let mut uses = Vec::new();
                        if let Some(at) = model
                            .pending
                            .iter()
                            .position(|p| overlaps(&p.location, &location))
                        {
                            let taken = model.pending.remove(at);
                            assert_eq!(
                                taken.location, location,
                                "a pending slice is reused whole or not at all"
                            );
                            assert!(
                                taken.outstanding.iter().all(|&(s, _)| s == stream),
                                "stream {stream} reused a slice other streams still use: {:?}",
                                taken.outstanding
                            );
                            uses = taken.outstanding;
                        }
                        model.live.push(Live {
                            id,
                            requested: size,
                            location,
                            uses,
                            pinned: false,
                        });
                    }
                    Err(IoError::BufferTooBig { .. }) => assert!(padded(size) > LIMIT),
                    Err(IoError::OutOfMemory { .. }) => {
                        assert!(!forbidden);
                        let stats = m.stats();
                        let need = if mapping {
                            chunk_need(padded(size))
                        } else {
                            padded(size)
                        };
                        assert!(
                            stats.reserved_bytes + need > LIMIT,
                            "OOM with room: {stats:?}"
                        );
                        assert_eq!(stats.empty_page_bytes, 0, "OOM released empty pages first");
                    }
                    Err(IoError::PageUpdateForbidden { .. }) => assert!(forbidden),
                    Err(IoError::PageSizesExhausted { .. }) => {
                        assert_eq!(
                            m.stats().page_sizes.len(),
                            small_config(LIMIT).max_page_sizes
                        );
                    }
                    Err(other) => panic!("unexpected error {other:?}"),
                }
            }
            Step::Free { pick } => {
                if model.live.is_empty() {
                    continue;
                }
                let live = model.live.swap_remove(pick % model.live.len());
                m.free(live.id).expect("a live id frees");
                let outstanding = model.in_flight(&live.uses);
                if !outstanding.is_empty() {
                    model.pending.push(Pending {
                        location: live.location,
                        outstanding,
                    });
                }
                model.freed.push(live.id);
            }
            Step::FreeStale { pick } => {
                if model.freed.is_empty() {
                    let result = m.free(AllocationId(u64::MAX - pick as u64 % 1000));
                    assert!(matches!(
                        result,
                        Err(IoError::NotFound {
                            reason: Reason::UnknownId,
                            ..
                        })
                    ));
                } else {
                    let id = model.freed[pick % model.freed.len()];
                    let result = m.free(id);
                    assert!(matches!(
                        result,
                        Err(IoError::NotFound {
                            reason: Reason::AlreadyFreed,
                            ..
                        })
                    ));
                }
            }
            Step::Use { pick, stream } => {
                if model.live.is_empty() {
                    continue;
                }
                model.issued[stream] += 1;
                let seq = model.issued[stream];
                let at = pick % model.live.len();
                m.record_use(model.live[at].id, StreamId(stream as u64), seq)
                    .expect("live");
                let uses = &mut model.live[at].uses;
                uses.retain(|&(s, _)| s != stream);
                uses.push((stream, seq));
            }
            Step::Complete { stream, all } => {
                let seq = if all {
                    model.issued[stream]
                } else {
                    model.issued[stream] / 2
                };
                m.stream_completed(StreamId(stream as u64), seq);
                let done = model.completed[stream].map_or(seq, |c| c.max(seq));
                model.completed[stream] = Some(done);
                for pending in &mut model.pending {
                    pending
                        .outstanding
                        .retain(|&(s, q)| s != stream || q > done);
                }
                model.pending.retain(|p| !p.outstanding.is_empty());
            }
            Step::Reclaim => {
                m.reclaim();
                assert_eq!(m.stats().empty_page_bytes, 0);
            }
            Step::Compact { commit } => {
                let before = m.snapshot();
                let plan = m.plan_compaction();
                for relocation in &plan.moves {
                    let live = model
                        .live
                        .iter()
                        .find(|l| l.id == relocation.id)
                        .expect("moves live ids");
                    assert!(!live.pinned, "a pinned allocation moves");
                    assert!(
                        model.in_flight(&live.uses).is_empty(),
                        "an allocation in use moves"
                    );
                    assert_eq!(live.location, relocation.from);
                    assert_eq!(relocation.to.size, relocation.from.size);
                }
                if commit {
                    let moves = plan.moves.clone();
                    m.commit_compaction(plan).expect("the current plan commits");
                    for relocation in moves {
                        let live = model
                            .live
                            .iter_mut()
                            .find(|l| l.id == relocation.id)
                            .expect("live");
                        live.location = relocation.to;
                    }
                } else {
                    m.abort_compaction(plan);
                    assert_eq!(m.snapshot(), before, "abort leaves everything as it was");
                }
            }
            Step::Pin { pick, pinned } => {
                if model.live.is_empty() {
                    continue;
                }
                let at = pick % model.live.len();
                m.set_pinned(model.live[at].id, pinned).expect("live");
                model.live[at].pinned = pinned;
            }
        }
        check_invariants(&m, &model);
    }
    for live in std::mem::take(&mut model.live) {
        m.free(live.id).expect("live");
    }
    for stream in 0..STREAMS {
        m.stream_completed(StreamId(stream as u64), model.issued[stream]);
    }
    m.reclaim();
    let stats = m.stats();
    assert_eq!((stats.reserved_bytes, stats.pending_free_bytes), (0, 0));
    assert_eq!(m.storage().held_buffers(), 0, "the storage holds nothing");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn the_manager_agrees_with_the_model(steps in prop::collection::vec(step(), 1..160)) {
        run(steps, false);
    }

    #[test]
    fn the_manager_on_a_mapping_storage_agrees_with_the_model(
        steps in prop::collection::vec(step(), 1..160),
    ) {
        run(steps, true);
    }
}
