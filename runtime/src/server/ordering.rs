//! Conflicting accesses across streams, ordered by the server.
//!
//! Work on one stream that touches an allocation another stream has
//! written, or is writing, and that has not completed there, waits for it:
//! the server queues a `WaitStream` for that stream's last conflicting item
//! before the work. Reads of one allocation on two streams do not conflict.
//! On the CPU this is what keeps the safe API sound (kernels get `&mut`
//! slices, and two live `&mut` to the same bytes are undefined behaviour);
//! on every device it orders an upload before its use on another stream.
//! Conflicts are tracked per allocation, not per byte range.

use cistern_memory::{AllocationId, MemoryManager, Storage, StreamId};

use crate::kernel::Access;

/// One use of an allocation by a work item.
pub(crate) type Use = (AllocationId, Access);

/// The waits that work on `stream` with `uses` needs: at most one
/// `(stream, sequence)` per other stream, the latest conflicting item.
pub(super) fn waits<S: Storage>(
    memory: &MemoryManager<S>,
    stream: StreamId,
    uses: impl Iterator<Item = Use>,
) -> Vec<(StreamId, u64)> {
    let mut waits = Vec::new();
    for (id, access) in uses {
        // An unknown id was refused by the caller's checks in this command.
        let _ = memory.conflicts(id, stream, access == Access::Write, &mut waits);
    }
    if waits.len() > 1 {
        waits.sort_unstable();
        // Sorted by stream, then sequence: keep each stream's last.
        waits.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1 = earlier.1.max(later.1);
            }
            same
        });
    }
    waits
}

#[cfg(test)]
mod tests {
    use cistern_memory::{AllocationPolicy, BookkeepingStorage, MemoryConfig};

    use super::*;

    const A: StreamId = StreamId(0);
    const B: StreamId = StreamId(1);

    fn memory() -> (MemoryManager<BookkeepingStorage>, AllocationId) {
        let mut memory = MemoryManager::new(
            BookkeepingStorage::default(),
            MemoryConfig::with_limit(1 << 20),
        )
        .unwrap_or_else(|e| panic!("config: {e}"));
        let id = memory
            .reserve(256, AllocationPolicy::Allow, 0, A)
            .unwrap_or_else(|e| panic!("reserve: {e}"));
        (memory, id)
    }

    #[test]
    fn a_read_waits_for_another_streams_write_in_flight() {
        let (mut memory, id) = memory();
        assert!(memory.record_write(id, A, 3).is_ok());
        assert_eq!(
            waits(&memory, B, [(id, Access::Read)].into_iter()),
            vec![(A, 3)]
        );
        memory.stream_completed(A, 3);
        assert!(waits(&memory, B, [(id, Access::Read)].into_iter()).is_empty());
    }

    #[test]
    fn reads_on_two_streams_do_not_conflict_but_a_write_waits_for_them() {
        let (mut memory, id) = memory();
        assert!(memory.record_use(id, A, 5).is_ok());
        assert!(waits(&memory, B, [(id, Access::Read)].into_iter()).is_empty());
        assert_eq!(
            waits(&memory, B, [(id, Access::Write)].into_iter()),
            vec![(A, 5)]
        );
    }

    #[test]
    fn a_streams_own_uses_need_no_wait_and_each_stream_is_waited_for_once() {
        let (mut memory, id) = memory();
        assert!(memory.record_write(id, B, 9).is_ok());
        assert!(waits(&memory, B, [(id, Access::Write)].into_iter()).is_empty());
        assert!(memory.record_write(id, A, 2).is_ok());
        assert!(memory.record_write(id, A, 4).is_ok());
        let uses = [(id, Access::Write), (id, Access::Read)];
        assert_eq!(waits(&memory, B, uses.into_iter()), vec![(A, 4)]);
    }
}
