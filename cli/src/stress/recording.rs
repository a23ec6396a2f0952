//! What a captured graph does to the expected content of the buffers it
//! touches: its fills and copies, in recording order, applied once per
//! replay to the [`Expected`] model of each buffer.

use std::collections::BTreeMap;

use super::pattern::{Expected, Pattern};

/// One recorded launch, naming buffers by the client's ids for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// `[offset, offset + len)` of `target` now holds `pattern`.
    Fill {
        target: u64,
        offset: u64,
        len: u64,
        /// What the fill writes (the same value on every replay).
        pattern: Pattern,
    },
    /// `len` bytes copied from `source` at `source_offset` to `target` at
    /// `target_offset` (distinct buffers).
    Copy {
        source: u64,
        target: u64,
        source_offset: u64,
        target_offset: u64,
        len: u64,
    },
}

impl Effect {
    /// The buffer and byte range this launch writes.
    pub fn written(&self) -> (u64, u64, u64) {
        match *self {
            Effect::Fill {
                target,
                offset,
                len,
                ..
            } => (target, offset, len),
            Effect::Copy {
                target,
                target_offset,
                len,
                ..
            } => (target, target_offset, len),
        }
    }
}

/// The launches of one graph, in the order a replay runs them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recording {
    effects: Vec<Effect>,
}

impl Recording {
    /// An empty recording.
    pub fn new() -> Self {
        Recording::default()
    }

    /// Appends a recorded launch.
    pub fn push(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    /// The recorded launches.
    pub fn effects(&self) -> &[Effect] {
        &self.effects
    }

    /// Applies one replay to `buffers`. A launch on a buffer missing from
    /// the map changes nothing there; a copy from a missing buffer makes
    /// its target range unknown (the graph kept the source alive, but what
    /// it holds is no longer modelled).
    pub fn replay_onto(&self, buffers: &mut BTreeMap<u64, Expected>) {
        for effect in &self.effects {
            match *effect {
                Effect::Fill {
                    target,
                    offset,
                    len,
                    pattern,
                } => {
                    if let Some(expected) = buffers.get_mut(&target) {
                        expected.overlay(offset, len, pattern);
                    }
                }
                Effect::Copy {
                    source,
                    target,
                    source_offset,
                    target_offset,
                    len,
                } => {
                    let source = buffers.get(&source).cloned();
                    if let Some(expected) = buffers.get_mut(&target) {
                        match source {
                            Some(source) => {
                                expected.copy_from(&source, source_offset, target_offset, len)
                            }
                            None => expected.forget(target_offset, len),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes a replay leaves, by running the effects on plain memory.
    fn run(recording: &Recording, memory: &mut BTreeMap<u64, Vec<u8>>) {
        for effect in recording.effects() {
            match *effect {
                Effect::Fill {
                    target,
                    offset,
                    len,
                    pattern,
                } => {
                    if let Some(bytes) = memory.get_mut(&target) {
                        let (o, l) = (offset as usize, len as usize);
                        pattern.render_into(offset, &mut bytes[o..o + l]);
                    }
                }
                Effect::Copy {
                    source,
                    target,
                    source_offset,
                    target_offset,
                    len,
                } => {
                    let (s, t, l) = (source_offset as usize, target_offset as usize, len as usize);
                    let from = memory.get(&source).map(|b| b[s..s + l].to_vec());
                    if let (Some(from), Some(bytes)) = (from, memory.get_mut(&target)) {
                        bytes[t..t + l].copy_from_slice(&from);
                    }
                }
            }
        }
    }

    #[test]
    fn each_replay_applies_the_launches_in_order_and_matches_real_bytes() {
        let written = Pattern::written(1, 1);
        let (filled, _) = Pattern::filled(2, 1);
        let mut model = BTreeMap::new();
        let mut memory = BTreeMap::new();
        for (id, size) in [(1u64, 64u64), (2, 64)] {
            let mut expected = Expected::unknown(size);
            expected.overlay(0, size, Pattern::written(id, 0));
            model.insert(id, expected);
            memory.insert(id, Pattern::written(id, 0).render(0, size as usize));
        }
        let mut recording = Recording::new();
        // A ping-pong, so that a second replay differs from the first.
        recording.push(Effect::Fill {
            target: 1,
            offset: 0,
            len: 8,
            pattern: written,
        });
        recording.push(Effect::Copy {
            source: 1,
            target: 2,
            source_offset: 0,
            target_offset: 4,
            len: 40,
        });
        recording.push(Effect::Fill {
            target: 2,
            offset: 0,
            len: 4,
            pattern: filled,
        });
        recording.push(Effect::Copy {
            source: 2,
            target: 1,
            source_offset: 0,
            target_offset: 8,
            len: 32,
        });
        let mut after_two = model.clone();
        for replay in 0..3 {
            recording.replay_onto(&mut model);
            run(&recording, &mut memory);
            for (id, expected) in &model {
                assert_eq!(expected.verify(0, &memory[id]), Ok(64), "buffer {id}");
            }
            if replay == 1 {
                after_two = model.clone();
            }
        }
        // A model that missed a replay is caught.
        let caught = after_two
            .iter()
            .any(|(id, expected)| expected.verify(0, &memory[id]).is_err());
        assert!(caught);
    }

    #[test]
    fn a_copy_from_a_buffer_no_longer_held_makes_its_target_unknown() {
        let mut model = BTreeMap::new();
        let mut target = Expected::unknown(16);
        target.overlay(0, 16, Pattern::written(5, 1));
        model.insert(5, target);
        let mut recording = Recording::new();
        recording.push(Effect::Copy {
            source: 9,
            target: 5,
            source_offset: 0,
            target_offset: 4,
            len: 8,
        });
        recording.replay_onto(&mut model);
        // Only the 8 bytes outside the copy are still checked.
        assert!(model[&5].verify(0, &[0u8; 16]).is_err());
        let bytes = Pattern::written(5, 1).render(0, 16);
        let mut garbage = bytes.clone();
        garbage[4..12].fill(0xAB);
        assert_eq!(model[&5].verify(0, &garbage), Ok(8));
    }
}
