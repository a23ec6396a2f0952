//! The virtual range: on a storage that can map, requests share one address
//! range backed chunk by chunk (see `docs/memory.md`).

mod common;

use cistern_memory::{AllocationPolicy, IoError, MemoryManager, PoolKind, Storage};
use common::*;

fn pools_of(m: &MemoryManager<impl Storage>) -> Vec<PoolKind> {
    m.snapshot().pages.iter().map(|page| page.pool).collect()
}

#[test]
fn requests_on_a_mapping_storage_share_one_virtual_range() {
    let mut m = virtual_manager(4 * MIB);
    let small = reserve(&mut m, 1000);
    let large = reserve(&mut m, 700 * KIB);
    let (a, b) = (locate(&mut m, small), locate(&mut m, large));
    assert_eq!(a.storage, b.storage, "one range");
    assert_eq!(pools_of(&m), vec![PoolKind::Virtual]);
    let stats = m.stats();
    assert_eq!((stats.sliced_pages, stats.exclusive_pages), (0, 0));
    assert!(stats.virtual_blocks > 0);
    assert!(m.storage().is_mapped(b.storage, b.offset, b.size));
    assert_eq!(stats.reserved_bytes, m.storage().held_bytes());
    assert!(stats.reserved_bytes < 2 * MIB, "memory, not address space");
}

#[test]
fn a_storage_that_cannot_map_gets_pages() {
    let mut m = manager(4 * MIB);
    reserve(&mut m, 700 * KIB);
    assert!(!pools_of(&m).contains(&PoolKind::Virtual));
    assert_eq!(m.stats().virtual_blocks, 0);
}

#[test]
fn space_freed_anywhere_serves_a_larger_request_without_new_memory() {
    let mut m = virtual_manager(4 * MIB);
    let ids: Vec<_> = (0..6).map(|_| reserve(&mut m, 4 * CHUNK)).collect();
    // Free every other one: three holes of four chunks, none large enough alone.
    for id in ids.iter().step_by(2) {
        m.free(*id).expect("live");
    }
    let before = m.stats();
    let big = reserve(&mut m, 12 * CHUNK);
    let after = m.stats();
    assert_eq!(after.reserved_bytes, before.reserved_bytes, "no new memory");
    assert_eq!(after.storage_allocs, before.storage_allocs);
    let location = locate(&mut m, big);
    assert!(
        m.storage()
            .is_mapped(location.storage, location.offset, location.size)
    );
}

#[test]
fn a_freed_chunk_stays_mapped_until_its_memory_is_wanted() {
    let mut m = virtual_manager(4 * MIB);
    let id = reserve(&mut m, 8 * CHUNK);
    let mapped = m.storage().mapped_bytes();
    m.free(id).expect("live");
    assert_eq!(m.storage().mapped_bytes(), mapped, "idle, still mapped");
    let again = reserve(&mut m, 8 * CHUNK);
    assert_eq!(m.storage().mapped_bytes(), mapped, "mapped where it was");
    m.free(again).expect("live");
}

#[test]
fn reclaim_unmaps_idle_chunks_and_releases_empty_blocks() {
    let mut m = virtual_manager(4 * MIB);
    let keep = reserve(&mut m, 1000);
    let ids: Vec<_> = (0..5).map(|_| reserve(&mut m, 5 * CHUNK)).collect();
    for id in ids {
        m.free(id).expect("live");
    }
    let released = m.reclaim();
    assert!(released > 0);
    let stats = m.stats();
    assert_eq!(stats.empty_page_bytes, 0);
    assert_eq!(
        stats.mapped_bytes, CHUNK,
        "only the chunk under the kept slice"
    );
    assert_eq!(stats.reserved_bytes, m.storage().held_bytes());
    m.free(keep).expect("live");
    m.reclaim();
    let stats = m.stats();
    assert_eq!((stats.reserved_bytes, stats.mapped_bytes), (0, 0));
    assert_eq!(m.storage().held_buffers(), 0);
}

#[test]
fn blocks_grow_with_the_bytes_held_up_to_the_configured_chunks() {
    let mut m = virtual_manager(64 * MIB);
    reserve(&mut m, CHUNK);
    assert_eq!(
        m.stats().reserved_bytes,
        CHUNK,
        "the first block is one chunk"
    );
    for _ in 0..40 {
        reserve(&mut m, 3 * CHUNK);
    }
    let stats = m.stats();
    let largest = small_config(0).max_block_chunks * CHUNK;
    assert!(
        stats.storage_allocs * largest >= stats.reserved_bytes,
        "no block above {largest} bytes: {stats:?}"
    );
    assert!(
        stats.storage_allocs < stats.reserved_bytes / CHUNK,
        "later blocks hold several chunks: {stats:?}"
    );
}

#[test]
fn the_limit_counts_memory_and_an_overflow_is_out_of_memory() {
    let mut m = virtual_manager(MIB);
    let ids: Vec<_> = (0..4).map(|_| reserve(&mut m, 4 * CHUNK)).collect();
    assert_eq!(m.stats().reserved_bytes, MIB);
    let result = m.reserve(CHUNK, AllocationPolicy::Allow, 0, S0);
    assert!(
        matches!(result, Err(IoError::OutOfMemory { .. })),
        "{result:?}"
    );
    assert_eq!(m.stats().ooms, 1);
    m.free(ids[0]).expect("live");
    reserve(&mut m, 4 * CHUNK);
    assert_eq!(m.stats().reserved_bytes, MIB, "the freed chunks served it");
}

#[test]
fn a_forbidden_request_maps_idle_chunks_but_adds_no_block() {
    let mut m = virtual_manager(4 * MIB);
    let id = reserve(&mut m, 4 * CHUNK);
    m.free(id).expect("live");
    let before = m.stats();
    let forbidden = m
        .reserve(4 * CHUNK, AllocationPolicy::Forbidden, 0, S0)
        .expect("idle chunks serve it");
    assert_eq!(m.stats().reserved_bytes, before.reserved_bytes);
    let more = m.reserve(64 * CHUNK, AllocationPolicy::Forbidden, 0, S0);
    assert!(matches!(more, Err(IoError::PageUpdateForbidden { .. })));
    assert_eq!(m.stats().reserved_bytes, before.reserved_bytes);
    m.free(forbidden).expect("live");
}

#[test]
fn dry_runs_use_pages_even_on_a_mapping_storage() {
    let mut m = virtual_manager(4 * MIB);
    let id = m
        .reserve(1000, AllocationPolicy::DryRun, 0, S0)
        .expect("fits");
    assert_eq!(m.stats().unbacked_bytes, m.stats().reserved_bytes);
    assert_eq!(pools_of(&m), vec![PoolKind::Sliced]);
    locate(&mut m, id);
    assert_eq!(m.stats().unbacked_bytes, 0, "backed on first use");
}

#[test]
fn compaction_leaves_the_virtual_range_alone() {
    let mut m = virtual_manager(4 * MIB);
    let ids: Vec<_> = (0..8).map(|_| reserve(&mut m, 2 * CHUNK)).collect();
    for id in ids.iter().step_by(2) {
        m.free(*id).expect("live");
    }
    let plan = m.plan_compaction();
    assert!(plan.moves.is_empty(), "fragmentation there costs no memory");
    m.abort_compaction(plan);
}

#[test]
fn release_all_gives_back_the_range_and_every_block() {
    let mut m = virtual_manager(4 * MIB);
    let id = reserve(&mut m, 5 * CHUNK);
    reserve(&mut m, 3 * CHUNK);
    let released = m.release_all();
    assert!(released >= 8 * CHUNK);
    assert_eq!(m.storage().held_buffers(), 0);
    assert_eq!(m.storage().held_ranges(), 0);
    assert_eq!(m.storage().mapped_bytes(), 0);
    assert!(matches!(m.locate(id), Err(IoError::NotFound { .. })));
    let fresh = reserve(&mut m, CHUNK);
    assert_eq!(pools_of(&m), vec![PoolKind::Virtual], "a new range");
    m.free(fresh).expect("live");
}

#[test]
fn a_failed_map_leaves_the_manager_as_it_was() {
    let mut m =
        MemoryManager::new(FailingStorage::mapping(), small_config(4 * MIB)).expect("valid");
    let kept = reserve(&mut m, 3 * CHUNK);
    let before = m.stats();
    m.storage_mut().fail_maps = true;
    let result = m.reserve(6 * CHUNK, AllocationPolicy::Allow, 0, S0);
    assert!(
        matches!(result, Err(IoError::OutOfMemory { .. })),
        "{result:?}"
    );
    let after = m.stats();
    assert_eq!(after.live_allocations, before.live_allocations);
    assert_eq!(after.in_use_bytes, before.in_use_bytes);
    assert_eq!(after.mapped_bytes, m.storage().inner.mapped_bytes());
    m.storage_mut().fail_maps = false;
    let id = reserve(&mut m, 6 * CHUNK);
    let location = locate(&mut m, id);
    assert!(
        m.storage()
            .inner
            .is_mapped(location.storage, location.offset, location.size)
    );
    let kept_at = locate(&mut m, kept);
    assert!(
        m.storage()
            .inner
            .is_mapped(kept_at.storage, kept_at.offset, kept_at.size)
    );
}
