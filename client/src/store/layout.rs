//! `Layout`: where each parameter tensor lives in the store's one buffer.

use cistern_runtime::Segment;

use crate::error::BackendError;
use crate::tape::Tensor;

/// One parameter tensor's place in the concatenated buffer, in `f32`s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SlotLayout {
    pub(crate) shape: Vec<usize>,
    pub(crate) offset: usize,
    pub(crate) numel: usize,
}

impl SlotLayout {
    /// Its byte offset and byte length.
    pub(crate) fn bytes(&self) -> (u64, u64) {
        (self.offset as u64 * 4, self.numel as u64 * 4)
    }
}

/// The slots in registration order, packed without gaps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    slots: Vec<SlotLayout>,
    numel: usize,
}

impl Layout {
    /// The layout of `params`, in order: `InvalidArgument` for no tensors,
    /// an empty one, or a total whose byte size overflows.
    pub(crate) fn of(params: &[&Tensor<f32>]) -> Result<Layout, BackendError> {
        if params.is_empty() {
            return Err(BackendError::InvalidArgument(
                "a parameter store needs at least one tensor".into(),
            ));
        }
        let mut slots = Vec::with_capacity(params.len());
        let mut numel = 0usize;
        for (slot, tensor) in params.iter().enumerate() {
            if tensor.is_empty() {
                return Err(BackendError::InvalidArgument(format!(
                    "parameter {slot} is empty"
                )));
            }
            slots.push(SlotLayout {
                shape: tensor.shape().to_vec(),
                offset: numel,
                numel: tensor.len(),
            });
            numel = numel
                .checked_add(tensor.len())
                .filter(|total| {
                    total
                        .checked_mul(4)
                        .is_some_and(|b| u64::try_from(b).is_ok())
                })
                .ok_or_else(|| {
                    BackendError::InvalidArgument(format!(
                        "the parameters overflow a buffer at slot {slot}"
                    ))
                })?;
        }
        Ok(Layout { slots, numel })
    }

    /// The slots, in registration order.
    pub(crate) fn slots(&self) -> &[SlotLayout] {
        &self.slots
    }

    /// The slot `slot`.
    pub(crate) fn slot(&self, slot: usize) -> Option<&SlotLayout> {
        self.slots.get(slot)
    }

    /// The parameter count.
    pub(crate) fn numel(&self) -> usize {
        self.numel
    }

    /// The buffer's byte size.
    pub(crate) fn bytes(&self) -> u64 {
        self.numel as u64 * 4
    }

    /// One optimizer segment per slot (LAMB's trust ratios are per segment).
    pub(crate) fn segments(&self) -> Vec<Segment> {
        self.slots
            .iter()
            .map(|slot| Segment::new(slot.offset, slot.numel))
            .collect()
    }

    /// `values` (the whole buffer, in order) cut into one tensor per slot.
    pub(crate) fn split(&self, values: &[f32]) -> Result<Vec<Tensor<f32>>, BackendError> {
        self.slots
            .iter()
            .map(|slot| {
                let data = values
                    .get(slot.offset..slot.offset + slot.numel)
                    .ok_or_else(|| {
                        BackendError::TransferFailed(format!(
                            "the read returned {} of {} elements",
                            values.len(),
                            self.numel
                        ))
                    })?
                    .to_vec();
                Ok(Tensor::new(slot.shape.clone(), data)?)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_packed_in_registration_order() {
        let a = Tensor::full([2, 3], 1.0f32).expect("a tensor");
        let b = Tensor::full([4], 2.0f32).expect("a tensor");
        let layout = Layout::of(&[&a, &b]).expect("a layout");
        assert_eq!(layout.numel(), 10);
        assert_eq!(layout.slot(1).map(|slot| slot.offset), Some(6));
        assert_eq!(layout.segments().len(), 2);
    }

    #[test]
    fn no_tensors_is_an_invalid_argument() {
        assert!(matches!(
            Layout::of(&[]),
            Err(BackendError::InvalidArgument(_))
        ));
    }
}
