//! The batch order: each pass over the training part is a seeded
//! permutation cut into full batches (the last partial one is dropped, so every step
//! has the same shape), gathered on the host ([`Batches`]) or drawn on the
//! device from the part uploaded once ([`Feed::Device`]).

use cistern_client::{DeviceParamStore, ResidentDataset, Tensor};
use cistern_memory::SplitMix64;
use cistern_runtime::GatherSpec;

use super::failure::Failure;
use super::prep::Part;

/// Where a run's batches come from.
#[derive(Debug)]
pub enum Feed {
    /// Gathered on the host and written to the device every step.
    Host(Batches),
    /// The training part resident on the device, each batch drawn there:
    /// a step moves no bytes but its loss read.
    Device(ResidentDataset),
}

impl Feed {
    /// Rows per batch.
    pub fn batch(&self) -> usize {
        match self {
            Feed::Host(batches) => batches.batch(),
            Feed::Device(dataset) => dataset.batch(),
        }
    }

    /// Full batches per pass.
    pub fn per_epoch(&self) -> usize {
        match self {
            Feed::Host(batches) => batches.per_epoch(),
            Feed::Device(dataset) => dataset.per_epoch(),
        }
    }

    /// Where a resumed run's order stands after `steps` steps: skipped on
    /// the host, or the device's counter set (`store` holds the dataset).
    pub fn resume(&mut self, store: &DeviceParamStore, steps: u64) -> Result<(), Failure> {
        match self {
            Feed::Host(batches) => batches.skip(steps),
            Feed::Device(dataset) => store.seek_resident_dataset(dataset, steps)?,
        }
        Ok(())
    }

    /// The seed of the device's draw, from the run's seed.
    pub fn device_seed(seed: u64) -> u64 {
        SplitMix64::derived(seed, 3).next_u64()
    }
}

/// An endless, seeded sequence of batches of one part, gathered on the
/// host: the very rows the device draws for a resident dataset of the same
/// seed ([`GatherSpec::row`]), so every path trains on one order.
#[derive(Debug)]
pub struct Batches {
    spec: GatherSpec,
    step: u64,
}

impl Batches {
    /// Batches of `batch` rows (at most the rows held) of a part of `rows` rows.
    pub fn new(rows: usize, batch: usize, seed: u64) -> Self {
        let rows = u32::try_from(rows).unwrap_or(u32::MAX).max(1);
        let batch = u32::try_from(batch).unwrap_or(u32::MAX).min(rows).max(1);
        Batches {
            spec: GatherSpec {
                rows,
                width: 1,
                target_width: 1,
                batch,
                seed: Feed::device_seed(seed),
            },
            step: 0,
        }
    }

    /// Rows per batch.
    pub fn batch(&self) -> usize {
        self.spec.batch as usize
    }

    /// Full batches per pass.
    pub fn per_epoch(&self) -> usize {
        self.spec.per_epoch() as usize
    }

    /// Passes over the next `count` batches without gathering them: where
    /// a resumed run's order stands after `count` steps.
    pub fn skip(&mut self, count: u64) {
        self.step += count;
    }

    /// The next batch of `part`: features `batch × width`, targets `batch × 1`.
    pub fn next(
        &mut self,
        part: &Part,
        width: usize,
    ) -> Result<(Tensor<f32>, Tensor<f32>), String> {
        let step =
            u32::try_from(self.step).map_err(|_| format!("step {}: past 2^32 steps", self.step))?;
        self.step += 1;
        let rows: Vec<usize> = (0..self.spec.batch)
            .map(|i| self.spec.row(step, i) as usize)
            .collect();
        let features = rows
            .iter()
            .flat_map(|&r| part.features[r * width..(r + 1) * width].iter().copied())
            .collect();
        let targets = rows.iter().map(|&r| part.targets[r]).collect();
        let shaped =
            |shape: [usize; 2], data| Tensor::new(shape, data).map_err(|e| format!("batch: {e}"));
        Ok((
            shaped([self.batch(), width], features)?,
            shaped([self.batch(), 1], targets)?,
        ))
    }
}
