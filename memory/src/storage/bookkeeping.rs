//! `BookkeepingStorage`: ids and sizes, no memory behind them.

use super::{Storage, StorageHandle, StorageId};
use crate::{BackTrace, IoError};

/// A storage that only counts: it hands out ids and remembers sizes, with no
/// memory behind them. For tests and the allocation benchmark, where memory
/// is not the point.
///
/// With [`BookkeepingStorage::with_map_granularity`] it can also reserve
/// address ranges and map buffers into them (like a device with virtual
/// memory management), refusing a map onto bytes already mapped or from
/// outside a buffer, so a manager bug shows as an error.
#[derive(Debug)]
pub struct BookkeepingStorage {
    alignment: u64,
    max_buffer_size: u64,
    capacity: u64,
    /// Sizes by id (ids are handed out in order); `None` once given back.
    held: Vec<Option<u64>>,
    held_buffers: usize,
    held_bytes: u64,
    map_granularity: Option<u64>,
    /// Reserved ranges: id, size, and which granules are mapped.
    ranges: Vec<Range>,
    mapped_bytes: u64,
}

#[derive(Debug)]
struct Range {
    id: StorageId,
    size: u64,
    mapped: Vec<bool>,
}

impl BookkeepingStorage {
    /// A storage with the given alignment (rounded up to a power of two) and
    /// no capacity limit.
    pub fn new(alignment: u64) -> Self {
        BookkeepingStorage {
            alignment: alignment.max(1).next_power_of_two(),
            max_buffer_size: u64::MAX / 2,
            capacity: u64::MAX,
            held: Vec::new(),
            held_buffers: 0,
            held_bytes: 0,
            map_granularity: None,
            ranges: Vec::new(),
            mapped_bytes: 0,
        }
    }

    /// The same storage, mapping at `granularity` bytes (rounded up to a power
    /// of two), or unable to map at all with `None` (the default).
    pub fn with_map_granularity(mut self, granularity: Option<u64>) -> Self {
        self.map_granularity = granularity.map(|g| g.max(1).next_power_of_two());
        self
    }

    /// Bytes mapped into ranges now.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped_bytes
    }

    /// Whether every byte of `offset..offset + size` of `range` is mapped.
    pub fn is_mapped(&self, range: StorageId, offset: u64, size: u64) -> bool {
        let Some(granularity) = self.map_granularity else {
            return false;
        };
        let shift = granularity.trailing_zeros();
        let first = (offset >> shift) as usize;
        let last = ((offset + size.max(1) - 1) >> shift) as usize;
        self.range(range)
            .and_then(|r| r.mapped.get(first..=last))
            .is_some_and(|span| span.iter().all(|&mapped| mapped))
    }

    /// Address ranges reserved now.
    pub fn held_ranges(&self) -> usize {
        self.ranges.len()
    }

    /// The next id, never handed out before; `size` for a buffer.
    fn new_id(&mut self, size: Option<u64>) -> StorageId {
        self.held.push(size);
        StorageId(self.held.len() as u64 - 1)
    }

    fn range(&self, id: StorageId) -> Option<&Range> {
        self.ranges.iter().find(|range| range.id == id)
    }

    fn range_mut(&mut self, id: StorageId) -> Option<&mut Range> {
        self.ranges.iter_mut().find(|range| range.id == id)
    }

    /// The granules `offset..offset + size` of a range, if the span is whole granules.
    fn granules(&self, offset: u64, size: u64) -> Option<std::ops::Range<usize>> {
        let granularity = self.map_granularity?;
        let shift = granularity.trailing_zeros();
        let aligned = (offset | size) & (granularity - 1) == 0 && size > 0;
        aligned.then(|| (offset >> shift) as usize..((offset + size) >> shift) as usize)
    }

    /// The same storage, refusing any single buffer above `bytes` (`max_buffer_size`).
    pub fn with_max_buffer_size(mut self, bytes: u64) -> Self {
        self.max_buffer_size = bytes;
        self
    }

    /// The same storage, answering `OutOfMemory` once it would hold more than `bytes`.
    pub fn with_capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Buffers held now.
    pub fn held_buffers(&self) -> usize {
        self.held_buffers
    }

    fn size_of(&self, id: StorageId) -> Option<u64> {
        *self.held.get(usize::try_from(id.0).ok()?)?
    }
}

impl Default for BookkeepingStorage {
    fn default() -> Self {
        BookkeepingStorage::new(256)
    }
}

impl Storage for BookkeepingStorage {
    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        // Cheap errors: the manager captures its own backtrace if it gives up.
        if size > self.max_buffer_size {
            return Err(IoError::BufferTooBig {
                size,
                backtrace: BackTrace::none(),
            });
        }
        if self.held_bytes.saturating_add(size) > self.capacity {
            return Err(IoError::OutOfMemory {
                size,
                backtrace: BackTrace::none(),
            });
        }
        let id = self.new_id(Some(size));
        self.held_buffers += 1;
        self.held_bytes += size;
        Ok(StorageHandle { id, size })
    }

    fn dealloc(&mut self, id: StorageId) {
        let slot = usize::try_from(id.0)
            .ok()
            .and_then(|at| self.held.get_mut(at));
        if let Some(size) = slot.and_then(Option::take) {
            self.held_buffers -= 1;
            self.held_bytes -= size;
        }
    }

    fn alignment(&self) -> u64 {
        self.alignment
    }

    fn max_buffer_size(&self) -> u64 {
        self.max_buffer_size
    }

    fn contains(&self, id: StorageId) -> bool {
        self.size_of(id).is_some() || self.range(id).is_some()
    }

    fn map_granularity(&self) -> Option<u64> {
        self.map_granularity
    }

    fn reserve_range(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let Some(granularity) = self.map_granularity else {
            return Err(IoError::unknown("this bookkeeping storage cannot map"));
        };
        let size = size.max(1).next_multiple_of(granularity);
        let id = self.new_id(None);
        self.ranges.push(Range {
            id,
            size,
            mapped: Vec::new(),
        });
        Ok(StorageHandle { id, size })
    }

    fn release_range(&mut self, range: StorageId) {
        let Some(at) = self.ranges.iter().position(|r| r.id == range) else {
            return;
        };
        let released = self.ranges.swap_remove(at);
        let granularity = self.map_granularity.unwrap_or(0);
        let granules = released.mapped.iter().filter(|&&mapped| mapped).count() as u64;
        self.mapped_bytes -= granules * granularity;
    }

    fn map(
        &mut self,
        range: StorageId,
        range_offset: u64,
        buffer: StorageId,
        buffer_offset: u64,
        size: u64,
    ) -> Result<(), IoError> {
        let refuse = |what: &str| {
            Err(IoError::unknown(format!(
                "bookkeeping map of {size} bytes at {range_offset} of range {range:?} \
                 from {buffer_offset} of buffer {buffer:?}: {what}"
            )))
        };
        let Some(granules) = self.granules(range_offset, size) else {
            return refuse("not whole granules");
        };
        match self.size_of(buffer) {
            Some(held)
                if buffer_offset & (self.alignment - 1) == 0 && buffer_offset + size <= held => {}
            _ => return refuse("outside any buffer held"),
        }
        let Some(target) = self.range_mut(range) else {
            return refuse("no such range");
        };
        if range_offset + size > target.size {
            return refuse("past the end of the range");
        }
        if target.mapped.len() < granules.end {
            target.mapped.resize(granules.end, false);
        }
        let span = &mut target.mapped[granules];
        if span.iter().any(|&mapped| mapped) {
            return refuse("already mapped");
        }
        set_all(span, true);
        self.mapped_bytes += size;
        Ok(())
    }

    fn unmap(&mut self, range: StorageId, range_offset: u64, size: u64) {
        let Some(granules) = self.granules(range_offset, size) else {
            return;
        };
        let Some(target) = self.range_mut(range) else {
            return;
        };
        let Some(span) = target.mapped.get_mut(granules) else {
            return;
        };
        let unmapped = span.iter().filter(|&&mapped| mapped).count() as u64;
        set_all(span, false);
        let granularity = self.map_granularity.unwrap_or(0);
        self.mapped_bytes -= unmapped * granularity;
    }
}

/// `span.fill(value)`, without a `memset` call for the usual one granule.
fn set_all(span: &mut [bool], value: bool) {
    if let [only] = span {
        *only = value;
    } else {
        span.fill(value);
    }
}
