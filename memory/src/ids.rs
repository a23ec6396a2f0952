//! The names the manager hands out and takes: allocations, streams, locations.

use serde::{Deserialize, Serialize};

use crate::StorageId;

/// Names one allocation for its whole life. Never reused by a manager, even
/// after the allocation is freed or the manager is invalidated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AllocationId(pub u64);

/// Names a stream of work: uses are ordered within a stream, not across streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamId(pub u64);

/// Where an allocation's bytes are now: a range of one storage buffer.
///
/// Valid until the allocation is freed or moved by a committed compaction;
/// resolve the allocation again rather than keeping this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceLocation {
    /// The storage buffer (page) holding the bytes.
    pub storage: StorageId,
    /// Byte offset of the slice in that buffer; a multiple of the storage alignment.
    pub offset: u64,
    /// Bytes the slice spans: the requested size rounded up to the alignment (or more).
    pub size: u64,
}
