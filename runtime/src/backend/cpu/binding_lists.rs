//! The host-slice lists of single launches, passed back and forth between
//! the server and a stream's executor instead of allocated per launch.
//!
//! The server fills a list per launch and the executor empties it. Allocated
//! on one thread and freed on the other, the lists emptied glibc's
//! per-thread cache on the server and overflowed it on the executor, so
//! both fell through to the arena under its lock on most launches. The
//! executor now sends emptied lists back once per batch: a launch of `Fill`
//! on 16 floats went from 230–269 to 203–226 ns. `submit_bound` in `bench
//! roundtrip` measures the bound case (`docs/benchmarks.md`, "roundtrip").

use super::memory::HostSlice;
use crate::sync::{Receiver, Sender, unbounded};

/// Lists waiting to be filled beyond this many are freed instead.
const MAX_SPARE_LISTS: usize = 4096;

/// Lists longer than this are freed, not reused (rare, and they would
/// pin their memory).
const MAX_REUSED_LEN: usize = 16;

/// An emptied list going back to the server.
type Lists = Vec<Vec<HostSlice>>;

/// The server's side: lists to fill.
#[derive(Debug)]
pub(super) struct SpareLists {
    spare: Lists,
    returned: Receiver<Lists>,
}

/// The executor's side: lists it emptied, sent back a batch at a time.
#[derive(Debug)]
pub(super) struct SpentLists {
    spent: Lists,
    back: Sender<Lists>,
}

/// A new pair for one stream.
pub(super) fn binding_lists() -> (SpareLists, SpentLists) {
    let (back, returned) = unbounded();
    (
        SpareLists {
            spare: Vec::new(),
            returned,
        },
        SpentLists {
            spent: Vec::new(),
            back,
        },
    )
}

impl SpareLists {
    /// An empty list with room for `len` slices (a reused one if any came back).
    pub(super) fn take(&mut self, len: usize) -> Vec<HostSlice> {
        if len == 0 {
            return Vec::new();
        }
        if self.spare.is_empty() {
            while let Ok(mut lists) = self.returned.try_recv() {
                if self.spare.len() < MAX_SPARE_LISTS {
                    self.spare.append(&mut lists);
                }
            }
        }
        let mut list = self.spare.pop().unwrap_or_default();
        list.reserve_exact(len);
        list
    }
}

impl SpentLists {
    /// Keeps `list`'s memory for the server (dropping its slices here).
    pub(super) fn give(&mut self, mut list: Vec<HostSlice>) {
        if (1..=MAX_REUSED_LEN).contains(&list.capacity()) {
            list.clear();
            self.spent.push(list);
        }
    }

    /// Sends what was given since the last call; a server that has gone
    /// lets the lists drop.
    pub(super) fn send(&mut self) {
        if !self.spent.is_empty() {
            let _ = self.back.send(std::mem::take(&mut self.spent));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emptied_list_comes_back_to_be_filled_again() {
        let (mut spare, mut spent) = binding_lists();
        let list = spare.take(2);
        let address = list.as_ptr();
        spent.give(list);
        spent.send();
        let again = spare.take(2);
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty() && again.capacity() >= 2);
    }

    #[test]
    fn a_launch_without_bindings_takes_no_list() {
        let (mut spare, _spent) = binding_lists();
        assert_eq!(spare.take(0).capacity(), 0);
    }

    #[test]
    fn long_lists_are_freed_not_kept() {
        let (spare, mut spent) = binding_lists();
        spent.give(Vec::with_capacity(MAX_REUSED_LEN + 1));
        spent.send();
        assert!(spare.returned.try_recv().is_err());
    }
}
