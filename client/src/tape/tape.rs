//! `Tape`: one training step's record of values on the device, and its leaves.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use cistern_runtime::{AllocationPolicy, FailureToken, KernelLaunch, ServerError, StreamId};
use serde::{Deserialize, Serialize};

use super::node::{Node, Op, ResidentMark, VarIndex};
use super::tensor::Tensor;
use super::var::Var;
use super::work::WorkLog;
use crate::compute::{Buffer, ComputeClient, f32_bytes};
use crate::error::AutodiffError;
use crate::shape::ShapeError;

/// Names one tape in this process; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TapeId(u64);

impl TapeId {
    /// Its number (unique in this process).
    pub fn get(self) -> u64 {
        self.0
    }

    fn next() -> TapeId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        TapeId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A training step's record: values on the device and the operations that
/// made them, for [`backward`](Tape::backward).
///
/// Bound to one [`ComputeClient`] and one stream: every upload, launch and
/// read of the tape runs in order on that stream, and nothing waits for the
/// device until a value is read ([`Var::to_host`], [`Var::item`]). The tape
/// owns its values' buffers (taken from the device's pools); dropping it
/// returns them. Make one per step. A launch that failed is reported by the
/// next call that waits (as that launch's error) and by every waiting call
/// after it: a tape that saw a failure is done; drop it.
#[derive(Debug)]
pub struct Tape {
    id: TapeId,
    client: ComputeClient,
    stream: StreamId,
    nodes: RefCell<Vec<Node>>,
    /// Every buffer the tape reserved (values, gradients, scratch), held
    /// until it drops, so the launches it sent stay valid to replay.
    held: RefCell<Vec<Buffer>>,
    /// The buffers of the recording before the last [`reset`](Tape::reset),
    /// by size in bytes, for reservations to take instead of the device's.
    spare: RefCell<HashMap<u64, Vec<Buffer>>>,
    work: RefCell<WorkLog>,
    /// Whether a graph replays its launches: its buffers are then the
    /// graph's, and a reset gives them up instead of reusing them.
    captured: std::cell::Cell<bool>,
}

impl Tape {
    /// A tape on `client`'s default stream.
    pub fn new(client: &ComputeClient) -> Tape {
        Tape::on_stream(client, client.default_stream())
    }

    /// A tape on `stream` of `client` (a stream the caller made, or the default).
    pub fn on_stream(client: &ComputeClient, stream: StreamId) -> Tape {
        Tape {
            id: TapeId::next(),
            client: client.clone(),
            stream,
            nodes: RefCell::new(Vec::new()),
            held: RefCell::new(Vec::new()),
            spare: RefCell::new(HashMap::new()),
            work: RefCell::new(WorkLog::default()),
            captured: std::cell::Cell::new(false),
        }
    }

    /// Clears the record for the next step and keeps its buffers: the next
    /// recording's reservations of the same sizes take them without a call
    /// to the device (the round trip that dominated recording a small
    /// model's step); buffers it does not take are returned at the next
    /// reset or drop. Launches still running are ordered before their
    /// buffers' next use (the server orders work per allocation), and a
    /// failure among them is still the answer of the next call that waits.
    /// A tape that saw a failure is refused with it: make a new tape (also
    /// after a device recovery, whose generation retires these buffers).
    pub fn reset(&mut self) -> Result<(), AutodiffError> {
        if let Some(failure) = self.work.get_mut().failure() {
            return Err(failure.clone());
        }
        self.id = TapeId::next();
        self.nodes.get_mut().clear();
        self.work.get_mut().forget_launches();
        let spare = self.spare.get_mut();
        spare.clear();
        if self.captured.replace(false) {
            // A graph replays into these buffers: the next step takes new ones.
            self.held.get_mut().clear();
        }
        for buffer in self.held.get_mut().drain(..) {
            spare.entry(buffer.size()).or_default().push(buffer);
        }
        Ok(())
    }

    /// Its process-unique id.
    pub fn id(&self) -> TapeId {
        self.id
    }

    /// The stream all its work runs on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The client it sends work through.
    pub fn client(&self) -> &ComputeClient {
        &self.client
    }

    /// A tracked leaf holding `tensor`: [`backward`](Tape::backward)
    /// computes its gradient.
    pub fn var(&self, tensor: &Tensor<f32>) -> Result<Var<'_>, AutodiffError> {
        self.leaf(tensor, true)
    }

    /// An untracked leaf holding `tensor` (a constant): asking its gradient
    /// is `GradientTrackingDisabled`.
    pub fn var_no_grad(&self, tensor: &Tensor<f32>) -> Result<Var<'_>, AutodiffError> {
        self.leaf(tensor, false)
    }

    /// A step's input (data, targets): an untracked leaf holding `tensor`,
    /// as [`var_no_grad`](Tape::var_no_grad).
    pub fn upload(&self, tensor: &Tensor<f32>) -> Result<Var<'_>, AutodiffError> {
        self.leaf(tensor, false)
    }

    /// A tracked leaf over `buffer`, which already holds the value on this
    /// tape's device (a parameter kept there): nothing is copied, and the
    /// tape holds the buffer until it drops. The buffer holds exactly the
    /// `f32`s of `shape` (`ElementCountMismatch` otherwise); a buffer of
    /// another device is `DeviceMismatch`. Work written to it on another
    /// stream must be ordered before (a sync, or an event the tape's stream
    /// waits for); an upload on the default stream needs nothing.
    pub fn var_resident(&self, buffer: &Buffer, shape: &[usize]) -> Result<Var<'_>, AutodiffError> {
        self.client.check_owner(buffer)?;
        if buffer.size() % 4 != 0 {
            return Err(AutodiffError::InvalidArgument(format!(
                "a buffer of {} bytes does not hold f32s",
                buffer.size()
            )));
        }
        let elements = checked_len(shape)?;
        let held = usize::try_from(buffer.size() / 4).unwrap_or(usize::MAX);
        ShapeError::check_element_count(elements, held)?;
        Ok(self.push(buffer.clone(), shape.to_vec(), true, Op::Leaf))
    }

    /// A leaf over a store's slot (`buffer` a view holding exactly
    /// `shape`'s elements, checked by the store): tracked for a registered
    /// forward, untracked for a snapshot. Its gradient is the store's to
    /// take, and its value is not readable through the tape.
    pub(crate) fn var_store_slot(
        &self,
        buffer: Buffer,
        shape: Vec<usize>,
        tracked: bool,
        mark: ResidentMark,
    ) -> Var<'_> {
        let var = self.push(buffer, shape, tracked, Op::Leaf);
        if let Some(node) = self.nodes.borrow_mut().last_mut() {
            node.resident = Some(mark);
        }
        var
    }

    /// The store slot value `index` is, if it is one.
    pub(crate) fn resident_mark(&self, index: VarIndex) -> Option<ResidentMark> {
        self.with_node(index, |node| node.resident)
    }

    /// The kernel launches this tape has sent, in order: what one step ran,
    /// to inspect, or to replay while the tape lives (it holds every buffer
    /// they bind).
    pub fn launches(&self) -> Vec<KernelLaunch> {
        self.work.borrow().launches().to_vec()
    }

    /// Hands the buffers of the launches sent so far to a graph that
    /// replays them: the next [`reset`](Self::reset) gives them up instead
    /// of reusing them for the next step.
    pub(crate) fn give_buffers_to_graph(&self) {
        self.captured.set(true);
    }

    fn leaf(&self, tensor: &Tensor<f32>, tracked: bool) -> Result<Var<'_>, AutodiffError> {
        let value = self.reserve(tensor.len())?;
        let written = self
            .client
            .write_on(self.stream, &value, 0, &f32_bytes(tensor.data()));
        self.answer(written)?;
        Ok(self.push(value, tensor.shape().to_vec(), tracked, Op::Leaf))
    }

    /// The index of `var` on this tape; `TapeMismatch` for another tape's.
    /// A new buffer holding `bytes` (`elements` 4-byte words), written on
    /// the tape's stream.
    pub(super) fn upload_words(
        &self,
        bytes: &[u8],
        elements: usize,
    ) -> Result<Buffer, AutodiffError> {
        let value = self.reserve(elements)?;
        let written = self.client.write_on(self.stream, &value, 0, bytes);
        self.answer(written)?;
        Ok(value)
    }

    /// A new buffer holding `values`, written on the tape's stream.
    pub(super) fn upload_f32s(&self, values: &[f32]) -> Result<Buffer, AutodiffError> {
        self.upload_words(&f32_bytes(values), values.len())
    }

    pub(crate) fn index_of(&self, var: &Var<'_>) -> Result<VarIndex, AutodiffError> {
        if var.tape().id == self.id {
            Ok(var.index())
        } else {
            Err(AutodiffError::TapeMismatch)
        }
    }

    /// Records a value made by `op`; tracked when any of its inputs is.
    pub(super) fn record(&self, value: Buffer, shape: Vec<usize>, op: Op) -> Var<'_> {
        let tracked = {
            let nodes = self.nodes.borrow();
            op.inputs()
                .iter()
                .any(|&input| nodes.get(input).is_some_and(|node| node.tracked))
        };
        self.push(value, shape, tracked, op)
    }

    /// Records a view of value `input` (its buffer or a range of it) made
    /// by `op`: a store parameter's view stays readable through its store
    /// only, as the parameter.
    pub(super) fn record_view(
        &self,
        value: Buffer,
        shape: Vec<usize>,
        op: Op,
        input: VarIndex,
    ) -> Var<'_> {
        let mark = self.resident_mark(input);
        let var = self.record(value, shape, op);
        if let Some(node) = self.nodes.borrow_mut().last_mut() {
            node.resident = mark;
        }
        var
    }

    /// Records a detached copy of value `index`: the same buffer, untracked.
    pub(super) fn detached(&self, index: VarIndex) -> Var<'_> {
        let (value, shape, mark) = self.with_node(index, |node| {
            (node.value.clone(), node.shape.clone(), node.resident)
        });
        let var = self.push(value, shape, false, Op::Leaf);
        if let Some(node) = self.nodes.borrow_mut().last_mut() {
            node.resident = mark;
        }
        var
    }

    fn push(&self, value: Buffer, shape: Vec<usize>, tracked: bool, op: Op) -> Var<'_> {
        let mut nodes = self.nodes.borrow_mut();
        nodes.push(Node {
            value,
            shape,
            tracked,
            op,
            resident: None,
        });
        Var::new(self, nodes.len() - 1)
    }

    /// Runs `f` on value `index` (an index this tape handed out).
    pub(super) fn with_node<R>(&self, index: VarIndex, f: impl FnOnce(&Node) -> R) -> R {
        let nodes = self.nodes.borrow();
        debug_assert!(index < nodes.len(), "a Var names a value of its tape");
        f(&nodes[index])
    }

    /// Runs `f` on every value recorded so far.
    pub(super) fn with_nodes<R>(&self, f: impl FnOnce(&[Node]) -> R) -> R {
        f(&self.nodes.borrow())
    }

    /// A buffer of `elements` `f32`s on the tape's stream (its contents are
    /// whatever the pool held: the next launch writes them).
    pub(super) fn reserve(&self, elements: usize) -> Result<Buffer, AutodiffError> {
        if elements == 0 {
            return Err(AutodiffError::InvalidArgument(
                "a tape holds no empty tensors".into(),
            ));
        }
        let bytes = (elements as u64).checked_mul(4).ok_or_else(|| {
            AutodiffError::InvalidArgument(format!("{elements} elements overflow a buffer"))
        })?;
        let spare = self.spare.borrow_mut().get_mut(&bytes).and_then(Vec::pop);
        let buffer = match spare {
            Some(buffer) => buffer,
            None => {
                let reserved =
                    self.client
                        .reserve_with(bytes, AllocationPolicy::Allow, self.stream);
                self.answer(reserved)?
            }
        };
        self.held.borrow_mut().push(buffer.clone());
        Ok(buffer)
    }

    /// Sends `launch` on the tape's stream; its failure reaches the log
    /// and the returned token.
    pub(crate) fn launch(&self, launch: KernelLaunch) -> Result<FailureToken, AutodiffError> {
        let sent = self.client.launch_tracked(self.stream, launch.clone());
        let token: FailureToken = self.answer(sent)?;
        self.work.borrow_mut().record(launch, token.clone());
        Ok(token)
    }

    /// A call's result; a failed one answers the earliest failed launch of
    /// the tape if one has settled (the device refusing a reservation after
    /// a trap reports the trapped launch), else its own error.
    fn answer<T>(&self, result: Result<T, ServerError>) -> Result<T, AutodiffError> {
        match result {
            Ok(value) => Ok(value),
            Err(error) => self.work.borrow_mut().settle(Err(error)),
        }
    }

    /// The tokens of this tape's launches not yet seen to succeed: work
    /// that consumes the tape's results requires them (a launch the device
    /// refused leaves its output stale, and the launches after it still
    /// run). A failure already settled is the answer instead.
    pub(crate) fn unsettled_launches(&self) -> Result<Vec<FailureToken>, AutodiffError> {
        self.work.borrow_mut().unsettled()
    }

    /// The failure a waiting call of this tape has already seen, if any.
    pub(super) fn failure(&self) -> Option<AutodiffError> {
        self.work.borrow().failure().cloned()
    }

    /// Reads `elements` `f32`s of `buffer` on the tape's stream: the one
    /// place the tape waits for the device. A launch of the tape that
    /// failed is the answer, before the read's own.
    pub(super) fn read(&self, buffer: &Buffer, elements: usize) -> Result<Vec<f32>, AutodiffError> {
        let words = self.read_words(buffer, elements)?;
        Ok(words.into_iter().map(f32::from_bits).collect())
    }

    /// `elements` 4-byte words of `buffer`, read on the tape's stream
    /// after its work (whose failure is the answer, if any).
    pub(super) fn read_words(
        &self,
        buffer: &Buffer,
        elements: usize,
    ) -> Result<Vec<u32>, AutodiffError> {
        if let Some(failure) = self.failure() {
            return Err(failure);
        }
        let bytes = self
            .client
            .read_on(self.stream, buffer, 0, elements as u64 * 4);
        let bytes = self.work.borrow_mut().settle(bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

/// The element count of `shape`, refusing an empty one.
pub(super) fn checked_len(shape: &[usize]) -> Result<usize, AutodiffError> {
    let elements = ShapeError::element_count(shape)?;
    if elements == 0 {
        return Err(AutodiffError::InvalidArgument(
            "a tape holds no empty tensors".into(),
        ));
    }
    Ok(elements)
}
