//! `Sinks`: buffers a parameter store asks the backward walk to write some
//! leaves' gradients into (views of its staging buffer), so a gradient
//! lands where the store's step reads it with no copy.

use std::collections::HashMap;

use cistern_runtime::FailureToken;

use super::node::VarIndex;
use crate::compute::Buffer;

/// Where leaves' gradients should go, and which went there.
#[derive(Debug, Default)]
pub(crate) struct Sinks {
    /// Per leaf: the buffer its gradient goes into.
    targets: HashMap<VarIndex, Buffer>,
    /// The leaves whose gradient a launch wrote into their target, each
    /// with that launch's token.
    written: Vec<(VarIndex, FailureToken)>,
}

impl Sinks {
    /// Sinks for each `(leaf, buffer)`.
    pub(crate) fn new(targets: impl IntoIterator<Item = (VarIndex, Buffer)>) -> Self {
        Sinks {
            targets: targets.into_iter().collect(),
            written: Vec::new(),
        }
    }

    /// Keeps only the leaves `keep` says yes to (the walk keeps those with
    /// one contribution to come: a sum of several needs a buffer of its own).
    pub(super) fn retain(&mut self, keep: impl Fn(VarIndex) -> bool) {
        self.targets.retain(|&leaf, _| keep(leaf));
    }

    /// `leaf`'s target, if it has one of `len` elements; taken, so it is
    /// written once.
    pub(super) fn take(&mut self, leaf: VarIndex, len: usize) -> Option<Buffer> {
        let fits = self
            .targets
            .get(&leaf)
            .is_some_and(|buffer| buffer.size() == (len as u64) * 4);
        if fits {
            self.targets.remove(&leaf)
        } else {
            None
        }
    }

    /// Records that the launch of `token` wrote `leaf`'s gradient into its target.
    pub(super) fn wrote(&mut self, leaf: VarIndex, token: FailureToken) {
        self.written.push((leaf, token));
    }

    /// The token of the launch that wrote `leaf`'s gradient into its
    /// target, if one did.
    pub(crate) fn written(&self, leaf: VarIndex) -> Option<&FailureToken> {
        self.written
            .iter()
            .find(|(written, _)| *written == leaf)
            .map(|(_, token)| token)
    }
}
