//! Compaction: plan, copy, commit or abort.

mod common;

use cistern_memory::{AllocationId, BookkeepingStorage, MemoryManager};
use common::*;

/// Two pages: a dense one with free holes and a sparse one with two slices.
fn sparse_layout() -> (
    MemoryManager<BookkeepingStorage>,
    Vec<AllocationId>,
    Vec<AllocationId>,
) {
    let mut m = manager(64 * MIB);
    let first: Vec<AllocationId> = (0..16).map(|_| reserve(&mut m, 4 * KIB)).collect();
    let second: Vec<AllocationId> = (0..16).map(|_| reserve(&mut m, 4 * KIB)).collect();
    assert_eq!(m.stats().sliced_pages, 2, "layout assumes two 64 KiB pages");
    for id in &first[..4] {
        m.free(*id).expect("live");
    }
    for id in &second[2..] {
        m.free(*id).expect("live");
    }
    (m, first[4..].to_vec(), second[..2].to_vec())
}

#[test]
fn a_committed_compaction_moves_slices_off_a_sparse_page_and_releases_it() {
    let (mut m, _dense, sparse) = sparse_layout();
    let plan = m.plan_compaction();
    assert_eq!(plan.moves.len(), 2);
    for relocation in &plan.moves {
        assert!(sparse.contains(&relocation.id));
        assert_eq!(locate(&mut m, relocation.id), relocation.from);
        assert_ne!(relocation.from.storage, relocation.to.storage);
    }
    let targets: Vec<_> = plan.moves.iter().map(|r| (r.id, r.to)).collect();
    m.commit_compaction(plan).expect("current plan");
    for (id, to) in targets {
        assert_eq!(locate(&mut m, id), to, "the handle names the new location");
    }
    let stats = m.stats();
    assert_eq!(stats.sliced_pages, 1);
    assert_eq!((stats.compactions, stats.relocations), (1, 2));
    assert_eq!(m.storage().held_buffers(), 1);
}

#[test]
fn an_aborted_compaction_leaves_everything_as_it_was() {
    let (mut m, _, _) = sparse_layout();
    let before = m.snapshot();
    let plan = m.plan_compaction();
    assert!(!plan.is_empty());
    assert_ne!(
        m.snapshot(),
        before,
        "destinations are reserved while planned"
    );
    m.abort_compaction(plan);
    assert_eq!(m.snapshot(), before);
}

#[test]
fn pinned_and_in_flight_slices_never_move() {
    let (mut m, _, sparse) = sparse_layout();
    m.set_pinned(sparse[0], true).expect("live");
    assert!(
        m.plan_compaction().is_empty(),
        "a pinned slice keeps its page"
    );
    m.set_pinned(sparse[0], false).expect("live");
    m.record_use(sparse[1], S1, 4).expect("live");
    assert!(
        m.plan_compaction().is_empty(),
        "a slice in use keeps its page"
    );
    m.stream_completed(S1, 4);
    assert_eq!(m.plan_compaction().moves.len(), 2);
}

#[test]
fn a_stale_plan_is_refused_and_a_second_plan_is_empty_while_one_is_outstanding() {
    let (mut m, _, _) = sparse_layout();
    let plan = m.plan_compaction();
    assert!(m.plan_compaction().is_empty());
    m.release_all();
    assert!(m.commit_compaction(plan).is_err());
}

#[test]
fn an_allocation_freed_after_planning_stays_freed_at_commit() {
    let (mut m, _, sparse) = sparse_layout();
    let plan = m.plan_compaction();
    m.free(sparse[0]).expect("live");
    m.commit_compaction(plan).expect("current plan");
    let stats = m.stats();
    assert_eq!(stats.relocations, 1);
    assert_eq!(stats.live_allocations, 12 + 1);
    let free = stats.inactive_split_bytes + stats.empty_page_bytes;
    assert_eq!(stats.in_use_bytes, m.storage().held_bytes() - free);
}
