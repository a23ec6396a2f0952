//! `Scratch`: device memory one stream owns outside the memory manager,
//! for a launch's intermediate values (LAMB's sums, ratios and work
//! items). Grown on demand and kept, freed when the stream drops; a
//! context reset destroys it with everything else, so it remembers the
//! epoch it was made in and is forgotten, never freed, after one.

use cudarc::driver::sys::CUstream;

use super::ffi::{self, Driver};

/// The smallest scratch allocated: a LAMB step of a few hundred segments.
const MIN_BYTES: usize = 64 * 1024;

#[derive(Clone, Copy, Debug)]
struct Held {
    epoch: u64,
    address: u64,
    bytes: usize,
}

/// One stream's scratch memory (none until first asked for).
#[derive(Debug, Default)]
pub(super) struct Scratch {
    held: Option<Held>,
}

impl Scratch {
    /// The address of at least `bytes` of scratch in context epoch `epoch`
    /// (the context bound on this thread). Growing it first waits for
    /// `stream`, whose queued work may still use the old memory.
    pub(super) fn ensure(&mut self, epoch: u64, bytes: usize, stream: CUstream) -> Driver<u64> {
        match self.held {
            Some(held) if held.epoch == epoch && held.bytes >= bytes => return Ok(held.address),
            Some(held) if held.epoch == epoch => {
                ffi::stream_synchronize(stream)?;
                self.held = None;
                // A failed free leaks the old memory; the new one is still good.
                let _ = ffi::free(held.address);
            }
            // An older epoch's memory died with its context.
            _ => self.held = None,
        }
        let size = grown_size(bytes);
        let address = ffi::alloc(size)?;
        self.held = Some(Held {
            epoch,
            address,
            bytes: size,
        });
        Ok(address)
    }

    /// Whether memory of epoch `epoch` is held.
    pub(super) fn holds(&self, epoch: u64) -> bool {
        self.held.is_some_and(|held| held.epoch == epoch)
    }

    /// Frees the memory if it is of epoch `epoch` (the context bound, no
    /// work queued that uses it); forgets it either way.
    pub(super) fn release(&mut self, epoch: u64) {
        if let Some(held) = self.held.take()
            && held.epoch == epoch
        {
            let _ = ffi::free(held.address);
        }
    }
}

/// The bytes allocated for a request of `bytes`: at least [`MIN_BYTES`],
/// rounded up to a power of two, so a growing table reallocates rarely.
fn grown_size(bytes: usize) -> usize {
    let bytes = bytes.max(MIN_BYTES);
    bytes.checked_next_power_of_two().unwrap_or(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_grows_in_powers_of_two_from_a_floor() {
        assert_eq!(grown_size(0), MIN_BYTES);
        assert_eq!(grown_size(MIN_BYTES), MIN_BYTES);
        assert_eq!(grown_size(MIN_BYTES + 1), 2 * MIN_BYTES);
        assert_eq!(grown_size(usize::MAX), usize::MAX);
    }

    #[test]
    fn an_empty_scratch_holds_nothing_and_releases_without_a_driver_call() {
        let mut scratch = Scratch::default();
        assert!(!scratch.holds(0));
        scratch.release(0);
        assert!(!scratch.holds(0));
    }
}
