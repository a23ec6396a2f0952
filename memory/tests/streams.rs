//! Stream-ordered reuse: a freed slice waits for the streams that used it.

mod common;

use cistern_memory::{AllocationPolicy, SliceUse, StreamId};
use common::*;

#[test]
fn a_freed_slice_is_reused_at_once_by_its_only_stream() {
    let mut m = manager(8 * MIB);
    let a = reserve_on(&mut m, 4 * KIB, S0);
    let where_a = locate(&mut m, a);
    m.record_use(a, S0, 7).expect("live");
    m.free(a).expect("live");
    assert_eq!(m.stats().pending_free_bytes, 4 * KIB);
    let b = reserve_on(&mut m, 4 * KIB, S0);
    assert_eq!(
        locate(&mut m, b),
        where_a,
        "the stream's own order keeps old work first"
    );
    assert_eq!(m.stats().pending_free_bytes, 0);
}

#[test]
fn a_freed_slice_is_not_reused_by_another_stream_before_completion() {
    let mut m = manager(8 * MIB);
    let a = reserve_on(&mut m, 4 * KIB, S0);
    let where_a = locate(&mut m, a);
    m.record_use(a, S0, 7).expect("live");
    m.free(a).expect("live");
    m.stream_completed(S0, 6);
    let b = reserve_on(&mut m, 4 * KIB, S1);
    let where_b = locate(&mut m, b);
    assert!(
        where_b.storage != where_a.storage
            || where_b.offset + where_b.size <= where_a.offset
            || where_a.offset + where_a.size <= where_b.offset,
        "{where_b:?} overlaps the pending {where_a:?}"
    );
}

#[test]
fn a_freed_slice_is_reused_by_another_stream_after_completion() {
    let mut m = manager(8 * MIB);
    let a = reserve_on(&mut m, 4 * KIB, S0);
    let where_a = locate(&mut m, a);
    m.record_use(a, S0, 7).expect("live");
    m.free(a).expect("live");
    m.stream_completed(S0, 7);
    assert_eq!(m.stats().pending_free_bytes, 0);
    let b = reserve_on(&mut m, 4 * KIB, S1);
    assert_eq!(locate(&mut m, b), where_a);
}

#[test]
fn a_slice_used_by_two_streams_waits_for_both() {
    let mut m = manager(8 * MIB);
    let a = reserve_on(&mut m, 4 * KIB, S0);
    m.record_use(a, S0, 3).expect("live");
    m.record_use(a, S1, 5).expect("live");
    m.free(a).expect("live");
    let other = reserve_on(&mut m, 4 * KIB, S0);
    assert_ne!(
        locate(&mut m, other).offset,
        0,
        "not reused by one of two users while the other runs"
    );
    m.stream_completed(S1, 5);
    assert_eq!(m.stats().pending_free_bytes, 4 * KIB);
    m.stream_completed(S0, 3);
    assert_eq!(m.stats().pending_free_bytes, 0);
}

#[test]
fn uses_already_completed_do_not_delay_a_free() {
    let mut m = manager(8 * MIB);
    m.stream_completed(S1, 10);
    let a = reserve_on(&mut m, 4 * KIB, S0);
    m.record_use(a, S1, 9).expect("live");
    m.free(a).expect("live");
    assert_eq!(m.stats().pending_free_bytes, 0);
}

#[test]
fn a_reused_pending_slice_keeps_its_use_in_flight() {
    let mut m = manager(8 * MIB);
    let a = reserve_on(&mut m, 4 * KIB, S0);
    m.record_use(a, S0, 7).expect("live");
    m.free(a).expect("live");
    let b = reserve_on(&mut m, 4 * KIB, S0);
    m.free(b).expect("live");
    assert_eq!(
        m.stats().pending_free_bytes,
        4 * KIB,
        "the old use on S0 still runs in that slice"
    );
    m.stream_completed(S0, 7);
    assert_eq!(m.stats().pending_free_bytes, 0);
}

#[test]
fn pending_frees_show_in_the_snapshot_and_are_never_reclaimed() {
    let mut m = manager(8 * MIB);
    let a = m
        .reserve(700 * KIB, AllocationPolicy::Allow, 0, StreamId(3))
        .expect("fits");
    m.record_use(a, StreamId(3), 1).expect("live");
    m.free(a).expect("live");
    assert_eq!(m.reclaim(), 0, "a pending page is not empty");
    let pending = m
        .snapshot()
        .pages
        .iter()
        .flat_map(|p| p.slices.clone())
        .filter(|s| s.state == SliceUse::PendingFree)
        .count();
    assert_eq!(pending, 1);
    m.stream_completed(StreamId(3), 1);
    assert!(m.reclaim() > 0);
}
