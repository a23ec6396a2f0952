//! `Gradients`: what a backward produced (or a host autodiff handed over),
//! one slot per value of the tape.

use super::node::VarIndex;
use super::tape::{Tape, TapeId};
use super::tensor::Tensor;
use super::var::Var;
use crate::compute::{Buffer, f32_bytes};
use crate::error::AutodiffError;
use crate::shape::ShapeError;

/// The gradient of each value of a tape, on its device.
///
/// Made by [`Tape::backward`] or [`Gradients::from_host`]; borrows its tape.
/// Holds the gradient buffers until dropped.
#[derive(Debug)]
pub struct Gradients<'t> {
    tape: &'t Tape,
    slots: Vec<Slot>,
    /// Set by a store's backward: which store staged the resident
    /// gradients, and that backward's serial.
    staged: Option<StagedBy>,
}

/// The store backward that made a [`Gradients`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StagedBy {
    /// The store's process-unique id.
    pub(crate) store: u64,
    /// The store's backward serial.
    pub(crate) serial: u64,
}

/// What is known of one value's gradient.
#[derive(Debug)]
pub(super) enum Slot {
    /// The value is untracked.
    Untracked,
    /// Tracked, but the loss does not reach it.
    Unreached,
    /// Its gradient, as many elements as the value.
    Grad(Buffer),
}

/// One value's gradient on the device: a view into [`Gradients`].
#[derive(Clone, Copy, Debug)]
pub struct Gradient<'g> {
    tape: &'g Tape,
    buffer: &'g Buffer,
    index: VarIndex,
}

impl<'t> Gradients<'t> {
    pub(super) fn new(tape: &'t Tape, slots: Vec<Slot>) -> Self {
        Gradients {
            tape,
            slots,
            staged: None,
        }
    }

    /// The same gradients, marked as staged by a store's backward.
    pub(crate) fn staged_by(mut self, staged: StagedBy) -> Self {
        self.staged = Some(staged);
        self
    }

    /// The store backward that made them, if one did.
    pub(crate) fn staging(&self) -> Option<StagedBy> {
        self.staged
    }

    /// The tape they are of.
    pub(crate) fn tape(&self) -> &'t Tape {
        self.tape
    }

    /// The gradient buffer of value `index`, where there is one.
    pub(crate) fn buffer_at(&self, index: VarIndex) -> Option<&Buffer> {
        match self.slots.get(index) {
            Some(Slot::Grad(buffer)) => Some(buffer),
            _ => None,
        }
    }

    /// Gradients computed elsewhere (another autodiff, on the host), for
    /// the tracked vars of `tape` listed with theirs: each is uploaded on
    /// the tape's stream. Every other tracked var answers `Ok(None)`.
    ///
    /// A var of another tape is `TapeMismatch`, an untracked one
    /// `GradientTrackingDisabled`, a gradient whose shape is not its var's a
    /// `ShapeError`; a var listed twice keeps its last gradient.
    pub fn from_host<'v>(
        tape: &'t Tape,
        gradients: impl IntoIterator<Item = (Var<'v>, Tensor<f32>)>,
    ) -> Result<Self, AutodiffError> {
        let mut slots = tape.with_nodes(|nodes| {
            nodes
                .iter()
                .map(|node| match node.tracked {
                    true => Slot::Unreached,
                    false => Slot::Untracked,
                })
                .collect::<Vec<_>>()
        });
        for (var, gradient) in gradients {
            let index = tape.index_of(&var)?;
            if !var.is_tracked() {
                return Err(AutodiffError::GradientTrackingDisabled);
            }
            ShapeError::check_dims(&var.shape(), gradient.shape())?;
            let buffer = tape.reserve(gradient.len())?;
            tape.client()
                .write_on(tape.stream(), &buffer, 0, &f32_bytes(gradient.data()))?;
            if let Some(slot) = slots.get_mut(index) {
                *slot = Slot::Grad(buffer);
            }
        }
        Ok(Gradients::new(tape, slots))
    }

    /// The id of the tape these gradients are of.
    pub fn tape_id(&self) -> TapeId {
        self.tape.id()
    }

    /// The gradient of `var`: `Ok(Some(_))` where the loss reaches it,
    /// `Ok(None)` where it does not (a var recorded after the backward
    /// included), `GradientTrackingDisabled` for an untracked var,
    /// `TapeMismatch` for a var of another tape.
    pub fn get(&self, var: &Var<'_>) -> Result<Option<Gradient<'_>>, AutodiffError> {
        let index = self.tape.index_of(var)?;
        match self.slots.get(index) {
            Some(Slot::Grad(buffer)) => Ok(Some(Gradient {
                tape: self.tape,
                buffer,
                index,
            })),
            Some(Slot::Untracked) => Err(AutodiffError::GradientTrackingDisabled),
            Some(Slot::Unreached) => Ok(None),
            None if var.is_tracked() => Ok(None),
            None => Err(AutodiffError::GradientTrackingDisabled),
        }
    }

    /// [`get`](Gradients::get), read back to the host (waits for the tape's
    /// stream): `Ok(None)` where the loss does not reach `var`.
    pub fn to_host(&self, var: &Var<'_>) -> Result<Option<Tensor<f32>>, AutodiffError> {
        self.get(var)?
            .map(|gradient| gradient.to_host())
            .transpose()
    }
}

impl Gradient<'_> {
    /// The device buffer holding it (as many `f32`s as its var).
    pub fn buffer(&self) -> &Buffer {
        self.buffer
    }

    /// Its dimensions: its var's.
    pub fn shape(&self) -> Vec<usize> {
        self.tape.with_node(self.index, |node| node.shape.clone())
    }

    /// Reads it back; waits for the tape's stream to reach the read. A
    /// failed launch of the tape is returned instead of the values.
    pub fn to_host(&self) -> Result<Tensor<f32>, AutodiffError> {
        let shape = self.shape();
        let len = shape.iter().product();
        let data = self.tape.read(self.buffer, len)?;
        Ok(Tensor::new(shape, data)?)
    }
}
