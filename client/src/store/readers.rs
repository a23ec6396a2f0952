//! The store's reads: the parameters, the staged gradients, and a wait.
//! Each re-checks the store's queued work after its download or wait, so a
//! value is returned only when every step before it succeeded.

use super::store::DeviceParamStore;
use crate::compute::bytes_f32;
use crate::error::BackendError;
use crate::tape::{Gradients, Tensor};

impl DeviceParamStore {
    /// The parameters, one tensor per slot in registration order, in one
    /// download (after every step queued before). A failed step is
    /// returned instead (and latches the store), never the bytes.
    pub fn sync_to_host(&self) -> Result<Vec<Tensor<f32>>, BackendError> {
        self.enter()?;
        let values = self.download(&self.params)?;
        self.layout.split(&values)
    }

    /// The staged gradients of the latest backward, one entry per slot:
    /// `None` where that backward did not reach the slot. Valid after
    /// [`backward`](Self::backward) and before the step
    /// (`InvalidArgument` otherwise). One download.
    pub fn resident_grads_to_host(&self) -> Result<Vec<Option<Tensor<f32>>>, BackendError> {
        self.enter()?;
        let filled = self.staged_slots()?;
        let values = self.download(&self.staging)?;
        let tensors = self.layout.split(&values)?;
        Ok(tensors
            .into_iter()
            .zip(filled)
            .map(|(tensor, filled)| filled.then_some(tensor))
            .collect())
    }

    /// Every slot's gradient: the staged ones where the latest backward
    /// filled them, the rest read from `gradients` (of the pending
    /// forward's tape). All or nothing: gradients of another tape are
    /// `TapeMismatch`, a slot neither has `MissingGradient`, no pending
    /// forward `InvalidArgument`.
    pub fn param_grads_to_host(
        &self,
        gradients: &Gradients<'_>,
    ) -> Result<Vec<Tensor<f32>>, BackendError> {
        self.enter()?;
        self.check_tape_device(gradients.tape())?;
        let pending = self.state.pending_forward().ok_or_else(|| {
            BackendError::InvalidArgument("no pending forward has gradients".into())
        })?;
        if gradients.tape_id() != pending.tape() {
            return Err(BackendError::TapeMismatch);
        }
        let staged = match (self.state.staged_gradients(), gradients.staging()) {
            (Some(staged), Some(tag)) if tag.store == self.id && tag.serial == staged.serial() => {
                staged.filled().to_vec()
            }
            _ => vec![false; self.layout.slots().len()],
        };
        let mut sources = Vec::with_capacity(staged.len());
        for (slot, &from_staging) in staged.iter().enumerate() {
            let buffer = match from_staging {
                true => None,
                false => Some(
                    pending
                        .leaves()
                        .get(slot)
                        .and_then(|&leaf| gradients.buffer_at(leaf))
                        .ok_or_else(|| self.missing(slot))?,
                ),
            };
            sources.push(buffer);
        }
        let staging = match staged.iter().any(|&filled| filled) {
            true => Some(self.layout.split(&self.download(&self.staging)?)?),
            false => None,
        };
        let mut out = Vec::with_capacity(sources.len());
        for (slot, source) in sources.into_iter().enumerate() {
            let tensor = match (source, &staging) {
                (Some(buffer), _) => {
                    let shape = self.layout.slot(slot).map(|slot| slot.shape.clone());
                    Tensor::new(shape.unwrap_or_default(), self.download(buffer)?)?
                }
                (None, Some(staged)) => staged
                    .get(slot)
                    .cloned()
                    .ok_or_else(|| self.missing(slot))?,
                (None, None) => return Err(self.missing(slot)),
            };
            out.push(tensor);
        }
        Ok(out)
    }

    /// Waits until the store's work queued so far has run, without a
    /// download. A failed step, or a failed wait, is returned and latches
    /// the store.
    pub fn wait_device(&self) -> Result<(), BackendError> {
        self.enter()?;
        let waited = self.client.sync(self.stream.id);
        self.after_wait(waited)
    }

    /// Which slots the latest backward staged, while a step has not
    /// consumed them.
    fn staged_slots(&self) -> Result<Vec<bool>, BackendError> {
        match self.state.staged_gradients() {
            Some(staged) => Ok(staged.filled().to_vec()),
            None => Err(BackendError::InvalidArgument(
                "the staged gradients are readable after backward and before the step".into(),
            )),
        }
    }

    /// All of `buffer`'s `f32`s, read on the store's stream.
    fn download(&self, buffer: &crate::compute::Buffer) -> Result<Vec<f32>, BackendError> {
        let read = self
            .client
            .read_on(self.stream.id, buffer, 0, buffer.size());
        let bytes = self.after_wait(read)?;
        Ok(bytes_f32(&bytes))
    }
}
