//! `Collective`: how the processes of a replica group reduce, broadcast and
//! gather, whatever carries it (one process, MPI); and `InProcess`, the
//! engine of a group that lives in one process.

use std::fmt::Debug;

use crate::sum;

/// A failure of a collective operation. Every rank of the group sees one
/// (a collective never half-completes on some ranks and hangs on others):
/// the group cannot go on.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    /// The engine needs a launcher that did not start this process (MPI
    /// outside `mpirun`): start it the way the message says.
    #[error("not launched as a group: {0}")]
    NotLaunched(String),
    /// The ranks called with buffers that disagree (lengths, counts): a
    /// bug in the caller; report it.
    #[error("the ranks disagree: {0}")]
    Mismatch(String),
    /// The engine itself failed: restart the job.
    #[error("the {engine} engine failed: {reason}")]
    Engine {
        /// The engine's name.
        engine: &'static str,
        /// What it said.
        reason: String,
    },
}

/// The collective operations a replica group needs, across the processes
/// of the group. Each process calls each operation in the same order with
/// buffers of the same lengths; `buffers` hold one entry per replica of the
/// calling process.
pub trait Collective: Send + Debug {
    /// The engine's name, as errors and benchmarks show it.
    fn name(&self) -> &'static str;

    /// This process's rank, `0..size()`.
    fn rank(&self) -> usize;

    /// How many processes the group spans.
    fn size(&self) -> usize;

    /// Sums `buffers` element-wise over every buffer of every process:
    /// afterwards `buffers[0]` holds the total on every process, bit for
    /// bit alike; the other buffers are scratch. Every buffer of every
    /// process has one length.
    fn all_reduce_sum(&mut self, buffers: &mut [Vec<f32>]) -> Result<(), CollectiveError>;

    /// [`all_reduce_sum`](Self::all_reduce_sum) of `buffers` (the
    /// native-endian bytes of `f32`s, as devices answer a read), each
    /// scaled by its entry of `weights` first (a weight of 1 leaves its
    /// values as they are): afterwards `buffers[0]` holds the total on
    /// every process, bit for bit as scaling each buffer and summing them
    /// with `all_reduce_sum` would; the other buffers are scratch. This
    /// default goes through `f32` copies; an engine overrides it to sum
    /// with fewer passes over the buffers.
    fn all_reduce_weighted(
        &mut self,
        buffers: &mut [Vec<u8>],
        weights: &[f32],
    ) -> Result<(), CollectiveError> {
        sum::check(buffers, weights)?;
        let mut floats: Vec<Vec<f32>> = buffers
            .iter()
            .zip(weights)
            .map(|(bytes, &weight)| {
                let mut scaled = vec![0.0; bytes.len() / 4];
                sum::weighted_sum(&[bytes.as_slice()], &[weight], &mut scaled);
                scaled
            })
            .collect();
        self.all_reduce_sum(&mut floats)?;
        if let (Some(total), Some(first)) = (floats.first(), buffers.first_mut()) {
            sum::store(total, first);
        }
        Ok(())
    }

    /// Copies `data` from process `root` to every process (same length).
    fn broadcast(&mut self, root: usize, data: &mut [f32]) -> Result<(), CollectiveError>;

    /// Every process's `words`, in rank order (each gives the same count).
    fn all_gather(&mut self, words: &[u64]) -> Result<Vec<u64>, CollectiveError>;
}

impl<C: Collective + ?Sized> Collective for Box<C> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn rank(&self) -> usize {
        (**self).rank()
    }

    fn size(&self) -> usize {
        (**self).size()
    }

    fn all_reduce_sum(&mut self, buffers: &mut [Vec<f32>]) -> Result<(), CollectiveError> {
        (**self).all_reduce_sum(buffers)
    }

    fn all_reduce_weighted(
        &mut self,
        buffers: &mut [Vec<u8>],
        weights: &[f32],
    ) -> Result<(), CollectiveError> {
        (**self).all_reduce_weighted(buffers, weights)
    }

    fn broadcast(&mut self, root: usize, data: &mut [f32]) -> Result<(), CollectiveError> {
        (**self).broadcast(root, data)
    }

    fn all_gather(&mut self, words: &[u64]) -> Result<Vec<u64>, CollectiveError> {
        (**self).all_gather(words)
    }
}

/// The engine of a group in one process (`cpu:0,cpu:1`, `wgpu:0`,
/// `cuda:0,cuda:1`, mixed): one rank, whose replicas' buffers are summed on
/// the host in replica order.
#[derive(Clone, Copy, Debug, Default)]
pub struct InProcess;

impl Collective for InProcess {
    fn name(&self) -> &'static str {
        "in-process"
    }

    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn all_reduce_sum(&mut self, buffers: &mut [Vec<f32>]) -> Result<(), CollectiveError> {
        sum_into_first(buffers)
    }

    /// One pass over the buffers, cut among a thread per replica.
    fn all_reduce_weighted(
        &mut self,
        buffers: &mut [Vec<u8>],
        weights: &[f32],
    ) -> Result<(), CollectiveError> {
        sum::check(buffers, weights)?;
        sum::weighted_sum_into_first(buffers, weights);
        Ok(())
    }

    fn broadcast(&mut self, root: usize, _data: &mut [f32]) -> Result<(), CollectiveError> {
        match root {
            0 => Ok(()),
            _ => Err(CollectiveError::Mismatch(format!(
                "broadcast from rank {root} in a group of one process"
            ))),
        }
    }

    fn all_gather(&mut self, words: &[u64]) -> Result<Vec<u64>, CollectiveError> {
        Ok(words.to_vec())
    }
}

/// Adds every buffer after the first into the first, in order: the local
/// half of every engine's reduction.
pub(crate) fn sum_into_first(buffers: &mut [Vec<f32>]) -> Result<(), CollectiveError> {
    let Some((first, rest)) = buffers.split_first_mut() else {
        return Ok(());
    };
    if let Some(index) = rest.iter().position(|other| other.len() != first.len()) {
        return Err(CollectiveError::Mismatch(format!(
            "buffer {} holds {} floats, buffer 0 {}",
            index + 1,
            rest[index].len(),
            first.len()
        )));
    }
    for other in rest.iter() {
        for (total, value) in first.iter_mut().zip(other) {
            *total += value;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_process_sums_the_replicas_into_the_first_buffer_in_order() {
        let mut buffers = vec![vec![1.0, 2.0], vec![10.0, 20.0], vec![100.0, 200.0]];
        assert_eq!(InProcess.all_reduce_sum(&mut buffers), Ok(()));
        assert_eq!(buffers[0], vec![111.0, 222.0]);
    }

    #[test]
    fn buffers_of_different_lengths_are_a_mismatch_naming_the_buffer() {
        let mut buffers = vec![vec![1.0, 2.0], vec![1.0]];
        match InProcess.all_reduce_sum(&mut buffers) {
            Err(CollectiveError::Mismatch(why)) => assert!(why.contains("buffer 1"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(buffers[0], vec![1.0, 2.0], "nothing was added");
    }

    /// An engine with no reduction of its own: the trait's default path.
    #[derive(Debug)]
    struct Plain;

    impl Collective for Plain {
        fn name(&self) -> &'static str {
            "plain"
        }
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            1
        }
        fn all_reduce_sum(&mut self, buffers: &mut [Vec<f32>]) -> Result<(), CollectiveError> {
            sum_into_first(buffers)
        }
        fn broadcast(&mut self, _root: usize, _data: &mut [f32]) -> Result<(), CollectiveError> {
            Ok(())
        }
        fn all_gather(&mut self, words: &[u64]) -> Result<Vec<u64>, CollectiveError> {
            Ok(words.to_vec())
        }
    }

    #[test]
    fn the_in_process_weighted_reduction_equals_the_default_path_bit_for_bit() {
        let bytes = |seed: u32| -> Vec<u8> {
            (0..70_001u32)
                .flat_map(|i| (((i ^ seed) % 977) as f32 * 1.37e-3 - 0.6).to_ne_bytes())
                .collect()
        };
        let weights = [0.5, 0.5];
        let mut fast = vec![bytes(1), bytes(2)];
        let mut plain = fast.clone();
        assert_eq!(InProcess.all_reduce_weighted(&mut fast, &weights), Ok(()));
        assert_eq!(Plain.all_reduce_weighted(&mut plain, &weights), Ok(()));
        assert_eq!(fast[0], plain[0]);
        assert_ne!(fast[0], bytes(1));
        let mut ragged = vec![bytes(1), vec![0u8; 8]];
        assert!(
            InProcess
                .all_reduce_weighted(&mut ragged, &weights)
                .is_err()
        );
    }

    #[test]
    fn in_process_is_one_rank_that_gathers_its_own_words() {
        let mut engine = InProcess;
        assert_eq!((engine.rank(), engine.size()), (0, 1));
        assert_eq!(engine.all_gather(&[7, 9]), Ok(vec![7, 9]));
        assert!(engine.broadcast(1, &mut [0.0]).is_err());
    }
}
