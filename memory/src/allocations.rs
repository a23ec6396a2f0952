//! The allocation table: generational slots, so ids are never reused and a
//! lookup is one index and one compare.
//!
//! An `AllocationId` is `version << 32 | slot`. Freeing bumps the slot's
//! version; a slot whose versions run out is retired, never reused.

use crate::{AllocationId, Reason, StreamId};

/// What the manager knows about one live allocation.
#[derive(Debug)]
pub(crate) struct Allocation {
    pub(crate) slice: u32,
    pub(crate) requested: u64,
    pub(crate) generation: u64,
    /// The last recorded use per stream: (stream, sequence).
    pub(crate) uses: Vec<(StreamId, u64)>,
    /// The last recorded use that wrote, per stream.
    pub(crate) writes: Vec<(StreamId, u64)>,
    pub(crate) pinned: bool,
}

enum Slot {
    Live {
        version: u64,
        allocation: Allocation,
    },
    Vacant {
        next_version: u64,
    },
}

#[derive(Default)]
pub(crate) struct AllocationTable {
    slots: Vec<Slot>,
    vacant: Vec<u32>,
    live: u64,
}

fn split(id: AllocationId) -> (usize, u64) {
    ((id.0 & 0xffff_ffff) as usize, id.0 >> 32)
}

fn missing(slot: Option<&Slot>, version: u64) -> Reason {
    match slot {
        Some(Slot::Live {
            version: current, ..
        }) if version < *current => Reason::AlreadyFreed,
        Some(Slot::Vacant { next_version }) if version < *next_version => Reason::AlreadyFreed,
        _ => Reason::UnknownId,
    }
}

impl AllocationTable {
    #[inline]
    pub(crate) fn insert(&mut self, allocation: Allocation) -> AllocationId {
        self.live += 1;
        if let Some(slot) = self.vacant.pop() {
            let version = match self.slots[slot as usize] {
                Slot::Vacant { next_version } => next_version,
                Slot::Live { .. } => unreachable_live(),
            };
            self.slots[slot as usize] = Slot::Live {
                version,
                allocation,
            };
            return AllocationId(version << 32 | u64::from(slot));
        }
        let slot = self.slots.len() as u64;
        self.slots.push(Slot::Live {
            version: 0,
            allocation,
        });
        AllocationId(slot)
    }

    #[inline]
    pub(crate) fn get(&self, id: AllocationId) -> Result<&Allocation, Reason> {
        let (slot, version) = split(id);
        match self.slots.get(slot) {
            Some(Slot::Live {
                version: current,
                allocation,
            }) if *current == version => Ok(allocation),
            other => Err(missing(other, version)),
        }
    }

    pub(crate) fn get_mut(&mut self, id: AllocationId) -> Result<&mut Allocation, Reason> {
        let (slot, version) = split(id);
        let reason = missing(self.slots.get(slot), version);
        match self.slots.get_mut(slot) {
            Some(Slot::Live {
                version: current,
                allocation,
            }) if *current == version => Ok(allocation),
            _ => Err(reason),
        }
    }

    #[inline]
    pub(crate) fn remove(&mut self, id: AllocationId) -> Result<Allocation, Reason> {
        let (slot, version) = split(id);
        match self.slots.get(slot) {
            Some(Slot::Live {
                version: current, ..
            }) if *current == version => {}
            other => return Err(missing(other, version)),
        }
        let next_version = version + 1;
        let old = std::mem::replace(&mut self.slots[slot], Slot::Vacant { next_version });
        if next_version <= u64::from(u32::MAX) {
            self.vacant.push(slot as u32);
        }
        self.live -= 1;
        match old {
            Slot::Live { allocation, .. } => Ok(allocation),
            Slot::Vacant { .. } => Err(Reason::UnknownId),
        }
    }

    /// Frees every allocation; their ids answer `AlreadyFreed` from now on.
    pub(crate) fn clear(&mut self) {
        for slot in 0..self.slots.len() {
            if let Slot::Live { version, .. } = self.slots[slot] {
                let next_version = version + 1;
                self.slots[slot] = Slot::Vacant { next_version };
                if next_version <= u64::from(u32::MAX) {
                    self.vacant.push(slot as u32);
                }
            }
        }
        self.live = 0;
    }

    pub(crate) fn live(&self) -> u64 {
        self.live
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (AllocationId, &Allocation)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, entry)| match entry {
                Slot::Live {
                    version,
                    allocation,
                } => Some((AllocationId(version << 32 | slot as u64), allocation)),
                Slot::Vacant { .. } => None,
            })
    }
}

#[cold]
fn unreachable_live() -> u64 {
    debug_assert!(false, "a vacant-listed slot is live");
    // Never reached; a fresh high version keeps ids unique if it were.
    u64::from(u32::MAX)
}
