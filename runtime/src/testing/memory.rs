//! `SimulatedMemory`: the test device's bytes, one growable byte map per
//! storage buffer of a `BookkeepingStorage`.

use std::collections::HashMap;

use cistern_memory::{SliceLocation, StorageId};

use crate::backend::StrideLayout;

/// Device memory as the test device sees it: bytes never written read as
/// zero.
#[derive(Debug, Default)]
pub struct SimulatedMemory {
    buffers: HashMap<StorageId, Vec<u8>>,
}

impl SimulatedMemory {
    /// The bytes of `location`, grown with zeros on first use.
    pub fn bytes_mut(&mut self, location: SliceLocation) -> &mut [u8] {
        let buffer = self.buffers.entry(location.storage).or_default();
        let end = (location.offset + location.size) as usize;
        if buffer.len() < end {
            buffer.resize(end, 0);
        }
        &mut buffer[location.offset as usize..end]
    }

    /// Copies the bytes of `from` to `to` (the same size).
    pub fn copy(&mut self, from: SliceLocation, to: SliceLocation) {
        let bytes = self.bytes_mut(from).to_vec();
        self.bytes_mut(to).copy_from_slice(&bytes);
    }

    /// Copies every element `layout` addresses from `source` to `target`.
    pub fn strided_copy(
        &mut self,
        source: SliceLocation,
        target: SliceLocation,
        layout: &StrideLayout,
    ) {
        let size = layout.element_size;
        let mut index = vec![0u64; layout.shape.len()];
        if layout.shape.contains(&0) {
            return;
        }
        loop {
            let offset = |strides: &[u64]| -> u64 {
                index
                    .iter()
                    .zip(strides)
                    .map(|(i, stride)| i * stride)
                    .sum::<u64>()
                    * size
            };
            let from = element(source, offset(&layout.source_strides), size);
            let to = element(target, offset(&layout.target_strides), size);
            self.copy(from, to);
            // Advance the index like an odometer, last dimension fastest.
            let mut dimension = index.len();
            loop {
                if dimension == 0 {
                    return;
                }
                dimension -= 1;
                index[dimension] += 1;
                if index[dimension] < layout.shape[dimension] {
                    break;
                }
                index[dimension] = 0;
            }
        }
    }
}

/// The `size` bytes at `offset` inside `location`.
fn element(location: SliceLocation, offset: u64, size: u64) -> SliceLocation {
    SliceLocation {
        storage: location.storage,
        offset: location.offset + offset,
        size,
    }
}

#[cfg(test)]
mod tests {
    use cistern_memory::{SliceLocation, StorageId};

    use super::SimulatedMemory;
    use crate::backend::StrideLayout;

    fn at(storage: u64, offset: u64, size: u64) -> SliceLocation {
        SliceLocation {
            storage: StorageId(storage),
            offset,
            size,
        }
    }

    #[test]
    fn bytes_never_written_read_as_zero() {
        let mut memory = SimulatedMemory::default();
        assert_eq!(memory.bytes_mut(at(1, 8, 4)), &[0; 4]);
    }

    #[test]
    fn a_strided_copy_with_swapped_strides_transposes() {
        let mut memory = SimulatedMemory::default();
        memory
            .bytes_mut(at(1, 0, 6))
            .copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        let layout = StrideLayout {
            shape: vec![2, 3],
            source_strides: vec![3, 1],
            target_strides: vec![1, 2],
            element_size: 1,
        };
        memory.strided_copy(at(1, 0, 6), at(2, 0, 6), &layout);
        assert_eq!(memory.bytes_mut(at(2, 0, 6)), &[1, 4, 2, 5, 3, 6]);
    }
}
