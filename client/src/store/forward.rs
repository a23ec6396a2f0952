//! The forward side: registering the store's parameters as a tape's
//! leaves (the pending forward), snapshots, and the resident linear.

use cistern_runtime::Activation;

use super::convert::backend;
use super::store::DeviceParamStore;
use crate::error::BackendError;
use crate::tape::{ResidentMark, Tape, TapeId, Var, WeightLayout};

/// One of a store's parameters as a leaf of one tape: which store and slot,
/// its shape, and the tape. Opaque: its value is read through the store
/// ([`DeviceParamStore::sync_to_host`]), never through the tape.
#[derive(Clone, Debug)]
pub struct ResidentLeaf<'t> {
    pub(super) store: u64,
    pub(super) slot: usize,
    pub(super) shape: Vec<usize>,
    var: Var<'t>,
    tracked: bool,
}

impl<'t> ResidentLeaf<'t> {
    /// Its slot in the store, in registration order.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The id of the tape it is a leaf of.
    pub fn tape_id(&self) -> TapeId {
        self.var.tape_id()
    }

    /// Whether gradients flow to it (registered, not a snapshot).
    pub fn is_tracked(&self) -> bool {
        self.tracked
    }

    /// The leaf as a `Var` of its tape: to name it in `Gradients::get` or
    /// `Gradients::from_host`, or to use it in other operations. Reading it
    /// through the tape is `InvalidArgument`.
    pub fn var(&self) -> Var<'t> {
        self.var
    }
}

impl DeviceParamStore {
    /// The parameters as tracked leaves of `tape`, one per slot in order,
    /// and a pending forward recorded for `tape`: the next
    /// [`backward`](Self::backward) and [`step`](Self::step) are of it.
    /// Nothing is copied or sent.
    ///
    /// A forward already pending (a step has not consumed it) is
    /// `PendingForwardUnconsumed`; a tape of another device `DeviceMismatch`.
    pub fn register_resident_params<'t>(
        &mut self,
        tape: &'t Tape,
    ) -> Result<Vec<ResidentLeaf<'t>>, BackendError> {
        self.enter_mut()?;
        self.check_tape_device(tape)?;
        // Checked before the leaves are made: a refusal adds nothing to the tape.
        self.state.check_no_pending_forward()?;
        // A counted dropout of this forward reads the steps applied so far.
        self.write_counter()?;
        let leaves = self.leaves(tape, true)?;
        let indices = leaves.iter().map(|leaf| leaf.var.index()).collect();
        self.state.register_forward(tape.id(), indices)?;
        Ok(leaves)
    }

    /// The parameters as untracked leaves of `tape` (an evaluation
    /// forward): no gradient flows to them, and the pending forward is
    /// untouched. They read the parameters as they are when the tape's
    /// kernels run (after every step queued before).
    pub fn snapshot_resident_params<'t>(
        &self,
        tape: &'t Tape,
    ) -> Result<Vec<ResidentLeaf<'t>>, BackendError> {
        self.enter()?;
        self.check_tape_device(tape)?;
        self.leaves(tape, false)
    }

    /// Forgets the pending forward (and the gradients its backward staged);
    /// returns whether one was pending. Idempotent.
    pub fn abandon_pending_forward(&mut self) -> Result<bool, BackendError> {
        self.enter_mut()?;
        Ok(self.state.abandon_forward())
    }

    /// `input·weight + bias` over resident leaves, the weight stored
    /// `[in, out]` (the original API's layout; PyTorch's `nn.Linear` is
    /// `[out, in]`, the tape's [`Tape::linear`]):
    /// [`linear_forward_with_activation`] with the identity.
    ///
    /// [`linear_forward_with_activation`]: Self::linear_forward_with_activation
    pub fn linear_forward<'t>(
        &self,
        tape: &'t Tape,
        input: &Var<'t>,
        weight: &ResidentLeaf<'t>,
        bias: Option<&ResidentLeaf<'t>>,
    ) -> Result<Var<'t>, BackendError> {
        self.linear_forward_with_activation(tape, input, weight, bias, Activation::Identity)
    }

    /// `act(input·weight + bias)` on `tape`, the weight (`[in, out]`,
    /// `k×n`) and bias (`n`) being this store's leaves; the kernels read
    /// the resident parameters in place.
    ///
    /// A tape of another device is `DeviceMismatch`; a leaf or input of
    /// another tape, or a registered leaf used on a tape other than the
    /// pending forward's, `TapeMismatch`; a leaf of another store, or of a
    /// forward already consumed or abandoned, `InvalidArgument`; shapes
    /// that do not fit `ShapeMismatch`.
    pub fn linear_forward_with_activation<'t>(
        &self,
        tape: &'t Tape,
        input: &Var<'t>,
        weight: &ResidentLeaf<'t>,
        bias: Option<&ResidentLeaf<'t>>,
        activation: Activation,
    ) -> Result<Var<'t>, BackendError> {
        self.enter()?;
        self.check_tape_device(tape)?;
        for leaf in std::iter::once(weight).chain(bias) {
            self.check_leaf(tape, leaf)?;
        }
        let bias = bias.map(|bias| bias.var);
        tape.linear_with_layout(
            input,
            &weight.var,
            bias.as_ref(),
            activation,
            WeightLayout::InOut,
        )
        .map_err(|error| self.state.fail(backend(error)))
    }

    /// `DeviceMismatch` unless `tape` sends work to the store's device.
    pub(super) fn check_tape_device(&self, tape: &Tape) -> Result<(), BackendError> {
        if tape.client().same_server(&self.client) {
            Ok(())
        } else {
            Err(BackendError::DeviceMismatch)
        }
    }

    /// The tape, store and slot checks of one leaf used on `tape`.
    fn check_leaf(&self, tape: &Tape, leaf: &ResidentLeaf<'_>) -> Result<(), BackendError> {
        if leaf.tape_id() != tape.id() {
            return Err(BackendError::TapeMismatch);
        }
        let pending = self.state.pending_forward();
        if leaf.tracked && pending.is_some_and(|pending| pending.tape() != tape.id()) {
            return Err(BackendError::TapeMismatch);
        }
        if leaf.store != self.id {
            return Err(BackendError::InvalidArgument(format!(
                "slot {} is a leaf of another parameter store",
                leaf.slot
            )));
        }
        if leaf.tracked {
            let current = pending
                .and_then(|pending| pending.leaves().get(leaf.slot))
                .is_some_and(|&index| index == leaf.var.index());
            if !current {
                return Err(BackendError::InvalidArgument(format!(
                    "slot {} is a leaf of a forward already stepped or abandoned",
                    leaf.slot
                )));
            }
        }
        Ok(())
    }

    /// One leaf per slot on `tape`, each over its range of the buffer.
    fn leaves<'t>(
        &self,
        tape: &'t Tape,
        tracked: bool,
    ) -> Result<Vec<ResidentLeaf<'t>>, BackendError> {
        let mut leaves = Vec::with_capacity(self.layout.slots().len());
        for (slot, layout) in self.layout.slots().iter().enumerate() {
            let (offset, size) = layout.bytes();
            let view = self.params.view(offset, size).ok_or_else(|| {
                BackendError::InvalidArgument(format!("slot {slot} lies outside the buffer"))
            })?;
            let mark = ResidentMark {
                store: self.id,
                slot,
            };
            let var = tape.var_store_slot(view, layout.shape.clone(), tracked, mark);
            leaves.push(ResidentLeaf {
                store: self.id,
                slot,
                shape: layout.shape.clone(),
                var,
                tracked,
            });
        }
        Ok(leaves)
    }
}
