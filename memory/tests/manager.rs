//! Focused tests of the memory manager: limits, policies, ids, pools.

mod common;

use cistern_memory::{
    AllocationId, AllocationPolicy, BookkeepingStorage, IoError, MemoryConfig, MemoryManager,
    PoolKind, Reason, SliceUse, Storage,
};
use common::*;

#[test]
fn a_request_larger_than_the_limit_is_buffer_too_big() {
    let mut m = manager(4 * MIB);
    let result = m.reserve(4 * MIB + 1, AllocationPolicy::Allow, 0, S0);
    assert!(matches!(result, Err(IoError::BufferTooBig { size, .. }) if size == 4 * MIB + 1));
    let result = m.reserve(u64::MAX, AllocationPolicy::Allow, 0, S0);
    assert!(matches!(result, Err(IoError::BufferTooBig { .. })));
    assert_eq!(m.stats().ooms, 0, "too big is not out of memory");
}

#[test]
fn a_request_larger_than_the_largest_buffer_is_buffer_too_big() {
    let storage = BookkeepingStorage::new(256).with_max_buffer_size(MIB);
    let mut m = MemoryManager::new(storage, small_config(64 * MIB)).expect("valid config");
    assert!(m.reserve(MIB, AllocationPolicy::Allow, 0, S0).is_ok());
    let result = m.reserve(MIB + 256, AllocationPolicy::Allow, 0, S0);
    assert!(matches!(result, Err(IoError::BufferTooBig { .. })));
}

#[test]
fn a_request_that_does_not_fit_now_is_out_of_memory_after_one_retry() {
    let mut m = manager(MIB);
    let _held = reserve(&mut m, 600 * KIB);
    let result = m.reserve(600 * KIB, AllocationPolicy::Allow, 0, S0);
    assert!(matches!(result, Err(IoError::OutOfMemory { size, .. }) if size == 600 * KIB));
    let stats = m.stats();
    assert_eq!((stats.retries, stats.ooms), (1, 1));
    assert!(stats.reserved_bytes <= MIB);
}

#[test]
fn an_outdated_page_is_released_once_empty() {
    let mut m = manager(MIB);
    let first = reserve(&mut m, 600 * KIB);
    m.free(first).expect("live id frees");
    // The empty exclusive page cannot hold 700 KiB within the waste bound,
    // and both do not fit under the limit: the retry releases it.
    let second = reserve(&mut m, 700 * KIB);
    let stats = m.stats();
    assert_eq!(stats.retries, 1);
    assert_eq!(stats.ooms, 0);
    assert_eq!(stats.storage_frees, 1);
    assert_eq!(m.storage().held_buffers(), 1);
    assert!(m.locate(second).is_ok());
}

#[test]
fn reclaim_releases_every_empty_page_and_only_those() {
    let mut m = manager(64 * MIB);
    let kept = reserve(&mut m, 10 * KIB);
    let big = reserve(&mut m, 600 * KIB);
    let small: Vec<AllocationId> = (0..40).map(|_| reserve(&mut m, 30 * KIB)).collect();
    m.free(big).expect("live");
    for id in small {
        m.free(id).expect("live");
    }
    let before = m.stats();
    let released = m.reclaim();
    let after = m.stats();
    assert!(released > 0);
    assert_eq!(after.reserved_bytes, before.reserved_bytes - released);
    assert_eq!(after.empty_page_bytes, 0);
    assert_eq!(after.reclaims, 1);
    assert!(m.locate(kept).is_ok(), "a page with a live slice stays");
    assert_eq!(m.storage().held_bytes(), after.reserved_bytes);
}

#[test]
fn freed_neighbours_merge_so_a_page_is_one_free_slice_again() {
    let mut m = manager(64 * MIB);
    let ids: Vec<AllocationId> = (0..8).map(|_| reserve(&mut m, 8 * KIB)).collect();
    for id in [
        ids[1], ids[3], ids[0], ids[2], ids[7], ids[5], ids[6], ids[4],
    ] {
        m.free(id).expect("live");
    }
    let snapshot = m.snapshot();
    for page in &snapshot.pages {
        assert_eq!(page.slices.len(), 1, "an empty page is one slice: {page:?}");
        assert_eq!(page.slices[0].state, SliceUse::Free);
    }
}

#[test]
fn a_split_keeps_other_allocations_where_they_are() {
    let mut m = manager(64 * MIB);
    let a = reserve(&mut m, 4 * KIB);
    let b = reserve(&mut m, 4 * KIB);
    let where_b = locate(&mut m, b);
    m.free(a).expect("live");
    let _c = reserve(&mut m, KIB);
    let _d = reserve(&mut m, KIB);
    assert_eq!(
        locate(&mut m, b),
        where_b,
        "handles name allocations; splits move nothing"
    );
}

#[test]
fn every_slice_is_aligned_even_for_odd_and_zero_sizes() {
    let mut m = manager(64 * MIB);
    for size in [0, 1, 255, 256, 257, 1000, 4097, 700 * KIB + 3] {
        let id = reserve(&mut m, size);
        let location = locate(&mut m, id);
        assert_eq!(location.offset % 256, 0);
        assert_eq!(location.size % 256, 0);
        assert!(location.size >= size.max(1));
        assert_eq!(m.size_of(id).expect("live"), size);
    }
}

#[test]
fn unknown_and_freed_ids_are_not_found_with_their_reason() {
    let mut m = manager(4 * MIB);
    let id = reserve(&mut m, KIB);
    m.free(id).expect("live");
    let freed = m.free(id);
    assert!(matches!(
        freed,
        Err(IoError::NotFound {
            reason: Reason::AlreadyFreed,
            ..
        })
    ));
    for call in [
        m.locate(id).err(),
        m.size_of(id).err(),
        m.generation_of(id).err(),
        m.record_use(id, S0, 1).err(),
        m.set_pinned(id, true).err(),
    ] {
        assert!(matches!(
            call,
            Some(IoError::NotFound {
                reason: Reason::AlreadyFreed,
                ..
            })
        ));
    }
    for unknown in [
        AllocationId(12345),
        AllocationId(u64::MAX),
        AllocationId(1 << 40),
    ] {
        let result = m.free(unknown);
        assert!(matches!(
            result,
            Err(IoError::NotFound {
                reason: Reason::UnknownId,
                ..
            })
        ));
    }
}

#[test]
fn ids_are_never_reused() {
    let mut m = manager(4 * MIB);
    let mut seen = std::collections::HashSet::new();
    for round in 0..50 {
        let id = reserve(&mut m, KIB * (round % 7 + 1));
        assert!(seen.insert(id), "{id:?} handed out twice");
        m.free(id).expect("live");
    }
    m.release_all();
    let id = reserve(&mut m, KIB);
    assert!(seen.insert(id));
}

#[test]
fn each_allocation_records_the_generation_it_was_made_in() {
    let mut m = manager(4 * MIB);
    let old = m
        .reserve(KIB, AllocationPolicy::Allow, 3, S0)
        .expect("fits");
    let new = m
        .reserve(KIB, AllocationPolicy::Allow, 4, S0)
        .expect("fits");
    assert_eq!(m.generation_of(old).expect("live"), 3);
    assert_eq!(m.generation_of(new).expect("live"), 4);
}

#[test]
fn release_all_empties_the_storage_and_frees_every_id() {
    let mut m = manager(8 * MIB);
    let ids: Vec<AllocationId> = [KIB, 100 * KIB, 600 * KIB]
        .map(|s| reserve(&mut m, s))
        .into();
    let released = m.release_all();
    assert!(released > 0);
    assert_eq!(m.storage().held_buffers(), 0);
    let stats = m.stats();
    assert_eq!(
        (
            stats.reserved_bytes,
            stats.in_use_bytes,
            stats.live_allocations
        ),
        (0, 0, 0)
    );
    for id in ids {
        assert!(matches!(
            m.free(id),
            Err(IoError::NotFound {
                reason: Reason::AlreadyFreed,
                ..
            })
        ));
    }
    assert!(
        m.reserve(KIB, AllocationPolicy::Allow, 1, S0).is_ok(),
        "usable afterwards"
    );
}

#[test]
fn the_forbidden_policy_uses_held_pages_but_never_adds_one() {
    let mut m = manager(8 * MIB);
    let warm = reserve(&mut m, 32 * KIB);
    m.free(warm).expect("live");
    let reserved = m.stats().reserved_bytes;
    let inside = m.reserve(16 * KIB, AllocationPolicy::Forbidden, 0, S0);
    assert!(inside.is_ok(), "fits in the held page");
    let outside = m.reserve(2 * MIB, AllocationPolicy::Forbidden, 0, S0);
    assert!(matches!(outside, Err(IoError::PageUpdateForbidden { .. })));
    let outside = m.reserve(300 * KIB, AllocationPolicy::Forbidden, 0, S0);
    assert!(matches!(outside, Err(IoError::PageUpdateForbidden { .. })));
    assert_eq!(m.stats().reserved_bytes, reserved);
    assert_eq!(m.stats().ooms, 0);
}

#[test]
fn a_dry_run_page_is_backed_on_first_locate() {
    let mut m = manager(8 * MIB);
    let id = m
        .reserve(10 * KIB, AllocationPolicy::DryRun, 0, S0)
        .expect("fits");
    let stats = m.stats();
    assert_eq!(stats.storage_allocs, 0);
    assert_eq!(stats.unbacked_bytes, stats.reserved_bytes);
    let first = locate(&mut m, id);
    let again = locate(&mut m, id);
    assert_eq!(first, again);
    let stats = m.stats();
    assert_eq!((stats.storage_allocs, stats.unbacked_bytes), (1, 0));
    assert!(m.storage().contains(first.storage));
}

#[test]
fn a_failing_storage_makes_a_dry_run_locate_storage_mapping_failed() {
    let storage = FailingStorage::failing_after(0);
    let mut m = MemoryManager::new(storage, small_config(8 * MIB)).expect("valid config");
    let id = m
        .reserve(10 * KIB, AllocationPolicy::DryRun, 0, S0)
        .expect("no memory needed yet");
    let result = m.locate(id);
    match result {
        Err(IoError::StorageMappingFailed { source, .. }) => {
            assert!(matches!(*source, IoError::OutOfMemory { .. }));
        }
        other => panic!("expected StorageMappingFailed, got {other:?}"),
    }
    m.storage_mut().remaining = 1;
    assert!(
        m.locate(id).is_ok(),
        "mapping is retried on the next resolve"
    );
}

#[test]
fn a_storage_out_of_memory_is_retried_then_reported() {
    let storage = FailingStorage::failing_after(1);
    let mut m = MemoryManager::new(storage, small_config(8 * MIB)).expect("valid config");
    let _first = reserve(&mut m, 600 * KIB);
    let second = m.reserve(600 * KIB, AllocationPolicy::Allow, 0, S0);
    assert!(matches!(second, Err(IoError::OutOfMemory { .. })));
    assert_eq!((m.stats().retries, m.stats().ooms), (1, 1));
}

#[test]
fn a_page_deallocated_behind_the_managers_back_is_storage_handle_not_found() {
    let mut m = manager(8 * MIB);
    let id = reserve(&mut m, KIB);
    let location = locate(&mut m, id);
    m.storage_mut().dealloc(location.storage);
    let result = m.locate(id);
    assert!(matches!(
        result,
        Err(IoError::StorageHandleNotFound {
            reason: Reason::StorageReleased,
            ..
        })
    ));
}

#[test]
fn one_page_size_too_many_is_page_sizes_exhausted() {
    let config = MemoryConfig {
        max_page_sizes: 1,
        min_page_size: 64 * KIB,
        exclusive_threshold: 4 * MIB,
        ..small_config(8 * MIB)
    };
    let mut m = MemoryManager::new(BookkeepingStorage::new(256), config).expect("valid");
    let first = reserve(&mut m, 64 * KIB);
    let result = m.reserve(200 * KIB, AllocationPolicy::Allow, 0, S0);
    assert!(matches!(result, Err(IoError::PageSizesExhausted { .. })));
    m.free(first).expect("live");
    assert!(
        m.reserve(200 * KIB, AllocationPolicy::Allow, 0, S0).is_ok(),
        "the retry releases the unused size"
    );
}

#[test]
fn large_requests_get_exclusive_pages_reused_within_the_waste_bound() {
    let mut m = manager(64 * MIB);
    let big = reserve(&mut m, 800 * KIB);
    let page = locate(&mut m, big).storage;
    m.free(big).expect("live");
    let close = reserve(&mut m, 700 * KIB);
    assert_eq!(
        locate(&mut m, close).storage,
        page,
        "reused: wastes under a quarter"
    );
    m.free(close).expect("live");
    let far = reserve(&mut m, 520 * KIB);
    assert_ne!(
        locate(&mut m, far).storage,
        page,
        "not reused: would waste over a quarter"
    );
    let snapshot = m.snapshot();
    assert!(
        snapshot
            .pages
            .iter()
            .filter(|p| p.pool == PoolKind::Exclusive)
            .count()
            >= 1
    );
}

#[test]
fn page_sizes_grow_with_demand_and_stay_few() {
    let mut m = manager(64 * MIB);
    let _ids: Vec<AllocationId> = (0..400).map(|_| reserve(&mut m, 40 * KIB)).collect();
    let stats = m.stats();
    assert!(stats.page_sizes.len() <= 8);
    assert!(
        stats.page_sizes.len() >= 2,
        "pages grew: {:?}",
        stats.page_sizes
    );
    assert!(stats.sliced_pages < 100);
}

#[test]
fn an_invalid_config_is_refused() {
    for config in [
        MemoryConfig {
            limit: 0,
            ..small_config(MIB)
        },
        MemoryConfig {
            max_page_sizes: 0,
            ..small_config(MIB)
        },
        MemoryConfig {
            min_page_size: 2 * MIB,
            max_page_size: MIB,
            ..small_config(MIB)
        },
        MemoryConfig {
            exclusive_max_waste_percent: 101,
            ..small_config(MIB)
        },
        MemoryConfig {
            chunk_size: 3 * KIB,
            ..small_config(MIB)
        },
        MemoryConfig {
            max_block_chunks: 0,
            ..small_config(MIB)
        },
    ] {
        assert!(MemoryManager::new(BookkeepingStorage::new(256), config).is_err());
    }
}

#[test]
fn stats_snapshot_and_summary_describe_the_pools() {
    let mut m = manager(64 * MIB);
    let a = reserve(&mut m, 1000);
    let _b = reserve(&mut m, 600 * KIB);
    m.free(a).expect("live");
    let _c = reserve(&mut m, 3000);
    let stats = m.stats();
    assert_eq!(stats.live_allocations, 2);
    assert_eq!(stats.requested_bytes, 600 * KIB + 3000);
    assert_eq!(
        stats.padding_bytes,
        stats.in_use_bytes - stats.requested_bytes
    );
    assert!(stats.peak_in_use_bytes >= stats.in_use_bytes);
    assert_eq!((stats.sliced_pages, stats.exclusive_pages), (1, 1));
    let json = serde_json::to_string(&stats).expect("serializes");
    let back: cistern_memory::MemoryStats = serde_json::from_str(&json).expect("deserializes");
    assert_eq!(back, stats);
    let snapshot = m.snapshot();
    let bytes =
        bincode::serde::encode_to_vec(&snapshot, bincode::config::standard()).expect("encodes");
    let (decoded, _): (cistern_memory::MemorySnapshot, usize) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).expect("decodes");
    assert_eq!(decoded, snapshot);
    let summary = m.memory_summary();
    for row in ["in use", "reserved", "storage allocs", "out of memory"] {
        assert!(summary.contains(row), "summary lacks {row}:\n{summary}");
    }
}

/// A storage whose device refuses its next `refusals` allocations for a
/// reason other than exhaustion.
struct Refusing {
    inner: BookkeepingStorage,
    refusals: u32,
}

impl Storage for Refusing {
    fn alloc(&mut self, size: u64) -> Result<cistern_memory::StorageHandle, IoError> {
        if self.refusals > 0 {
            self.refusals -= 1;
            return Err(IoError::allocation_failed(size, "the driver said no"));
        }
        self.inner.alloc(size)
    }

    fn dealloc(&mut self, id: cistern_memory::StorageId) {
        self.inner.dealloc(id);
    }

    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }

    fn max_buffer_size(&self) -> u64 {
        self.inner.max_buffer_size()
    }
}

fn refusing(refusals: u32) -> MemoryManager<Refusing> {
    let inner = BookkeepingStorage::new(256);
    match MemoryManager::new(Refusing { inner, refusals }, small_config(4 * MIB)) {
        Ok(manager) => manager,
        Err(e) => panic!("a valid config is accepted: {e}"),
    }
}

#[test]
fn a_device_refusal_is_retried_once_and_a_second_is_allocation_failed_not_out_of_memory() {
    let mut once = refusing(1);
    assert!(once.reserve(KIB, AllocationPolicy::Allow, 0, S0).is_ok());
    assert_eq!(once.stats().retries, 1);

    let mut twice = refusing(2);
    let result = twice.reserve(KIB, AllocationPolicy::Allow, 0, S0);
    let Err(error) = result else {
        panic!("two refusals: {result:?}");
    };
    assert!(
        matches!(error, IoError::AllocationFailed { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("the driver said no"), "{error}");
    assert_eq!(twice.stats().ooms, 0, "a refusal is not out of memory");
    assert!(twice.reserve(KIB, AllocationPolicy::Allow, 0, S0).is_ok());
}
