//! `Tape::backward`: the reverse walk. Every gradient is computed on the
//! device, on the tape's stream, with no wait.
//!
//! The walk visits the values the loss reaches through tracked inputs, last
//! recorded first (a value's users were recorded after it, so its gradient
//! is complete when it is visited), and queues each operation's gradient
//! kernels (`rules.rs`) for its reached inputs only. A value used twice gets
//! its contributions summed. Gradients of scalars known on the host (the
//! loss's own, 1, and what add and scale make of it) stay host constants
//! until a kernel needs them in memory.

use cistern_runtime::KernelLaunch;

use super::gradients::{Gradients, Slot};
use super::node::{Node, VarIndex};
use super::sinks::Sinks;
use super::tape::Tape;
use super::var::Var;
use crate::compute::Buffer;
use crate::error::AutodiffError;

/// A gradient during the walk.
#[derive(Clone, Debug)]
pub(super) enum Grad {
    /// Every element is this value (only for one-element values).
    Constant(f32),
    /// On the device, never written again once its launch is queued (a
    /// store's staging view: not before the store's next backward).
    Device(Buffer),
}

impl Tape {
    /// The gradients of the scalar `loss` with respect to every tracked
    /// value it reaches, computed on the device without waiting.
    ///
    /// A loss of more than one element is `InvalidArgument`; an untracked
    /// loss is `GradientTrackingDisabled`; another tape's is `TapeMismatch`;
    /// a failure a waiting call of this tape already saw is returned again.
    /// Each call computes afresh. A linear whose input is untracked skips
    /// that input's gradient. A loss that reaches a parameter store's
    /// registered parameters is `InvalidArgument`: their gradients go
    /// through `DeviceParamStore::backward`.
    pub fn backward(&self, loss: &Var<'_>) -> Result<Gradients<'_>, AutodiffError> {
        self.backward_walk(loss, false, &mut Sinks::default())
    }

    /// The backward walk; `through_store` allows store parameters among
    /// the reached values (the store's backward takes their gradients).
    /// A leaf of `sinks` with one contribution to come gets it written
    /// straight into its sink where a kernel computes it (a weight's or a
    /// bias's gradient), recorded there with the launch's token.
    pub(crate) fn backward_walk(
        &self,
        loss: &Var<'_>,
        through_store: bool,
        sinks: &mut Sinks,
    ) -> Result<Gradients<'_>, AutodiffError> {
        let root = self.index_of(loss)?;
        if let Some(failure) = self.failure() {
            return Err(failure);
        }
        let (len, tracked) = self.with_node(root, |node| (node.len(), node.tracked));
        if len != 1 {
            return Err(AutodiffError::InvalidArgument(format!(
                "backward needs a scalar loss; it has shape {:?}",
                loss.shape()
            )));
        }
        if !tracked {
            return Err(AutodiffError::GradientTrackingDisabled);
        }
        let (reached, mut slots) = self.with_nodes(|nodes| {
            let slots: Vec<Slot> = nodes
                .iter()
                .map(|node| match node.tracked {
                    true => Slot::Unreached,
                    false => Slot::Untracked,
                })
                .collect();
            (reached_from(nodes, root), slots)
        });
        let reaches_store = self.with_nodes(|nodes| {
            nodes
                .iter()
                .zip(&reached)
                .any(|(node, &reached)| reached && node.tracked && node.resident.is_some())
        });
        if reaches_store && !through_store {
            return Err(AutodiffError::InvalidArgument(
                "the loss reaches a parameter store's parameters: \
                 run DeviceParamStore::backward"
                    .into(),
            ));
        }
        let uses = self.with_nodes(|nodes| contributions_to_come(nodes, &reached));
        sinks.retain(|leaf| uses.get(leaf) == Some(&1));
        let mut grads: Vec<Option<Grad>> = vec![None; root + 1];
        grads[root] = Some(Grad::Constant(1.0));
        for index in (0..=root).rev() {
            let Some(grad) = grads[index].take() else {
                continue;
            };
            for (input, contribution) in self.input_gradients(index, &grad, &reached, sinks)? {
                let merged = match grads[input].take() {
                    None => contribution,
                    Some(earlier) => {
                        let len = self.with_node(input, Node::len);
                        self.accumulate(&earlier, &contribution, len)?
                    }
                };
                grads[input] = Some(merged);
            }
            let len = self.with_node(index, Node::len);
            slots[index] = Slot::Grad(self.materialize(&grad, len)?);
        }
        Ok(Gradients::new(self, slots))
    }

    /// `grad` in device memory (`len` elements).
    pub(super) fn materialize(&self, grad: &Grad, len: usize) -> Result<Buffer, AutodiffError> {
        match grad {
            Grad::Device(buffer) => Ok(buffer.clone()),
            Grad::Constant(value) => self.filled(len, *value),
        }
    }

    /// A new buffer of `len` elements, each `value`.
    pub(super) fn filled(&self, len: usize, value: f32) -> Result<Buffer, AutodiffError> {
        let out = self.reserve(len)?;
        self.launch(KernelLaunch::fill(out.whole(), value))?;
        Ok(out)
    }

    /// The sum of two contributions, in a new buffer: either may be shared
    /// (an add hands its gradient to both operands), so none is written.
    fn accumulate(&self, a: &Grad, b: &Grad, len: usize) -> Result<Grad, AutodiffError> {
        if let (Grad::Constant(a), Grad::Constant(b)) = (a, b) {
            return Ok(Grad::Constant(a + b));
        }
        let (a, b) = (self.materialize(a, len)?, self.materialize(b, len)?);
        let out = self.reserve(len)?;
        self.launch(KernelLaunch::add(a.whole(), b.whole(), out.whole()))?;
        Ok(Grad::Device(out))
    }
}

/// How many contributions each value's gradient gets in the walk: one per
/// use of it as an input of a reached, tracked value.
fn contributions_to_come(nodes: &[Node], reached: &[bool]) -> Vec<u32> {
    let mut uses = vec![0u32; reached.len()];
    for (index, &reached_here) in reached.iter().enumerate() {
        if !reached_here || !nodes[index].tracked {
            continue;
        }
        for input in nodes[index].op.inputs() {
            if reached.get(input).copied().unwrap_or(false) {
                uses[input] += 1;
            }
        }
    }
    uses
}

/// Which values the loss `root` reaches through tracked inputs.
fn reached_from(nodes: &[Node], root: VarIndex) -> Vec<bool> {
    let mut reached = vec![false; root + 1];
    reached[root] = true;
    for index in (0..=root).rev() {
        if !reached[index] || !nodes[index].tracked {
            continue;
        }
        for input in nodes[index].op.inputs() {
            if nodes[input].tracked {
                reached[input] = true;
            }
        }
    }
    reached
}
