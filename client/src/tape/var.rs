//! `Var`: a handle to a value recorded on a tape.

use std::fmt;

use super::node::VarIndex;
use super::tape::{Tape, TapeId};
use super::tensor::Tensor;
use crate::compute::Buffer;
use crate::error::AutodiffError;

/// A value on a [`Tape`]: a device buffer with a shape, and whether
/// gradients flow to it. Cheap to copy; it borrows its tape, so the tape
/// outlives it. Operations on it are the tape's (`tape.add(&a, &b)`); a
/// `Var` of another tape given to them is `TapeMismatch`.
#[derive(Clone, Copy)]
pub struct Var<'t> {
    tape: &'t Tape,
    index: VarIndex,
}

impl<'t> Var<'t> {
    pub(super) fn new(tape: &'t Tape, index: VarIndex) -> Self {
        Var { tape, index }
    }

    pub(super) fn tape(&self) -> &'t Tape {
        self.tape
    }

    pub(crate) fn index(&self) -> VarIndex {
        self.index
    }

    /// The id of the tape it is recorded on.
    pub fn tape_id(&self) -> TapeId {
        self.tape.id()
    }

    /// Its dimensions (`[]` for a scalar).
    pub fn shape(&self) -> Vec<usize> {
        self.tape.with_node(self.index, |node| node.shape.clone())
    }

    /// Its element count.
    pub fn len(&self) -> usize {
        self.tape.with_node(self.index, |node| node.len())
    }

    /// Always false: a tape holds no empty tensors.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether gradients flow to it.
    pub fn is_tracked(&self) -> bool {
        self.tape.with_node(self.index, |node| node.tracked)
    }

    /// The device buffer holding it (read it on the tape's stream).
    pub fn buffer(&self) -> Buffer {
        self.tape.with_node(self.index, |node| node.value.clone())
    }

    /// The same value as an untracked leaf: no gradient flows through the
    /// result. Nothing is copied.
    pub fn detach(&self) -> Var<'t> {
        self.tape.detached(self.index)
    }

    /// Reads it back; waits for the tape's stream to reach the read. A
    /// failed launch of the tape is returned instead of the value.
    /// A store's parameter is read through its store (`sync_to_host`):
    /// `InvalidArgument` here.
    pub fn to_host(&self) -> Result<Tensor<f32>, AutodiffError> {
        if self.tape.resident_mark(self.index).is_some() {
            return Err(AutodiffError::InvalidArgument(
                "a store's parameter is read through its store (sync_to_host)".into(),
            ));
        }
        let (value, shape, len) = self.tape.with_node(self.index, |node| {
            (node.value.clone(), node.shape.clone(), node.len())
        });
        let data = self.tape.read(&value, len)?;
        Ok(Tensor::new(shape, data)?)
    }

    /// Reads back a one-element value (a loss): `InvalidArgument` for any
    /// other, without touching the device.
    pub fn item(&self) -> Result<f32, AutodiffError> {
        let len = self.len();
        if len != 1 {
            return Err(AutodiffError::InvalidArgument(format!(
                "item() of a value of {len} elements"
            )));
        }
        let tensor = self.to_host()?;
        tensor
            .item()
            .ok_or_else(|| AutodiffError::InvalidArgument("the read returned no element".into()))
    }
}

impl fmt::Debug for Var<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Var")
            .field("tape", &self.tape.id().get())
            .field("index", &self.index)
            .finish()
    }
}
