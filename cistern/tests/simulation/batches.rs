//! Launch batches and optimizer steps: several kernels checked as one
//! command (a bad one refuses the whole batch, and nothing of it runs),
//! and the fused optimizer step's command.

use cistern::optim::{OptimizerConfig, Segment, SgdConfig};
use cistern::runtime::{Binding, Command, ErrorCode, FailureToken, KernelLaunch, OptimizerStep};

use super::super::model::{Effect, Pending, gate_code};
use super::{Failure, World};

impl World {
    /// A fill or a copy over the client's live buffers, and what it does.
    pub(super) fn random_launch(&mut self, index: usize) -> Option<(KernelLaunch, Effect)> {
        if self.clients[index].live.is_empty() {
            return None;
        }
        let (from, to) = (self.pick(index), self.pick(index));
        let source = &self.clients[index].live[from];
        let (source_id, source_size) = (source.handle, source.size);
        if from == to || self.rng.chance_percent(50) {
            let (offset, len) = self.span(source_size);
            let value = self.rng.below(1 << 20) as f32 * 0.5;
            let launch = KernelLaunch::fill(
                Binding {
                    buffer: source_id,
                    offset,
                    size: len,
                },
                value,
            );
            let effect = Effect::Fill {
                buffer: source_id.id,
                offset,
                len,
                value,
            };
            return Some((launch, effect));
        }
        let target = &self.clients[index].live[to];
        let (target_id, target_size) = (target.handle, target.size);
        let (_, len) = self.span(source_size.min(target_size));
        let source_offset = 4 * self.rng.below((source_size - len) / 4 + 1);
        let target_offset = 4 * self.rng.below((target_size - len) / 4 + 1);
        let launch = KernelLaunch::copy(
            Binding {
                buffer: source_id,
                offset: source_offset,
                size: len,
            },
            Binding {
                buffer: target_id,
                offset: target_offset,
                size: len,
            },
        );
        let effect = Effect::Copy {
            source: source_id.id,
            source_offset,
            target: target_id.id,
            target_offset,
            len,
        };
        Some((launch, effect))
    }

    /// A launch no contract accepts: a fill past its buffer's end.
    pub(super) fn bad_launch(&mut self, index: usize) -> Option<KernelLaunch> {
        let buffer = self.clients[index].live.first()?;
        Some(KernelLaunch::fill(
            Binding {
                buffer: buffer.handle,
                offset: buffer.size,
                size: 4,
            },
            1.0,
        ))
    }

    /// Two to five kernels as one batch; one in ten holds a bad launch, and
    /// then none of them may run.
    pub(super) fn launch_batch(&mut self, index: usize) -> Result<(), Failure> {
        let count = 2 + self.rng.below(4) as usize;
        let mut launches = Vec::with_capacity(count);
        let mut effects = Vec::with_capacity(count);
        for _ in 0..count {
            if let Some((launch, effect)) = self.random_launch(index) {
                launches.push(launch);
                effects.push(effect);
            }
        }
        let mut poisoned_batch = false;
        if self.rng.chance_percent(10)
            && let Some(bad) = self.bad_launch(index)
        {
            let at = self.rng.below(launches.len() as u64 + 1) as usize;
            launches.insert(at, bad);
            poisoned_batch = true;
        }
        let token = FailureToken::new();
        let stream = self.stream_for(index);
        let (before, after) = self.handle(Command::LaunchBatch {
            stream,
            launches,
            token: Some(token.clone()),
            requires: Vec::new(),
        });
        self.settle_launch(
            index,
            "launch batch",
            token,
            (&before, &after),
            poisoned_batch,
            false,
        )
        .map(|queued| {
            if queued {
                self.seen.batches += 1;
                for effect in &effects {
                    self.clients[index].apply(effect);
                }
            }
        })
    }

    /// Judges a launch-like command by its token: pending means queued
    /// (only in an admitting state), settled means refused. `bad`: it holds
    /// a launch no contract accepts, so it must be refused. `empty`: it
    /// holds no kernel, so an admitting state may settle it at once.
    pub(super) fn settle_launch(
        &mut self,
        index: usize,
        what: &str,
        token: FailureToken,
        states: (
            &cistern::runtime::ContextState,
            &cistern::runtime::ContextState,
        ),
        bad: bool,
        empty: bool,
    ) -> Result<bool, Failure> {
        let (before, after) = states;
        match token.check() {
            None if bad => Err(format!("{what} with a bad launch was queued")),
            None => {
                if gate_code(before).is_some() && gate_code(after).is_some() {
                    return Err(format!("{what} was queued in state {}", after.name()));
                }
                self.clients[index].pending.push(Pending::Launch {
                    token,
                    generation: after.generation(),
                    step: self.step,
                });
                Ok(true)
            }
            Some(result) => {
                self.hash_answer(&result);
                if result.is_ok() && empty && (before.is_active() || after.is_active()) {
                    return Ok(false);
                }
                if result.is_ok() {
                    return Err(format!("{what} succeeded before the device ran it"));
                }
                let extra: &[ErrorCode] = if bad {
                    self.seen.batches_refused += 1;
                    &[ErrorCode::InvalidProgram, ErrorCode::InvalidArgument]
                } else {
                    &[]
                };
                self.judge(index, what, &result, (before, after), extra)?;
                Ok(false)
            }
        }
    }

    /// One SGD step over two of the client's buffers as parameters and
    /// gradients; the test device does not compute it, so the parameters'
    /// bytes become unknown to the model.
    pub(super) fn optimizer_step(&mut self, index: usize) -> Result<(), Failure> {
        if self.clients[index].live.len() < 2 {
            return self.reserve(index);
        }
        let (a, b) = (self.pick(index), self.pick(index));
        if a == b {
            return self.launch_batch(index);
        }
        let (params, grads) = (&self.clients[index].live[a], &self.clients[index].live[b]);
        let len = params.size.min(grads.size);
        let (params, grads) = (params.handle, grads.handle);
        let elements = (len / 4) as usize;
        let step = OptimizerStep::new(
            OptimizerConfig::Sgd(SgdConfig {
                lr: 0.01,
                ..Default::default()
            }),
            1 + self.rng.below(100),
            vec![Segment::new(0, elements)],
            Binding {
                buffer: params,
                offset: 0,
                size: len,
            },
            Binding {
                buffer: grads,
                offset: 0,
                size: len,
            },
            Vec::new(),
        );
        let token = FailureToken::new();
        let stream = self.stream_for(index);
        let (before, after) = self.handle(Command::OptimizerStep {
            stream,
            step: Box::new(step),
            token: Some(token.clone()),
        });
        if self.settle_launch(
            index,
            "optimizer step",
            token,
            (&before, &after),
            false,
            false,
        )? {
            self.seen.batches += 1;
            self.clients[index].apply(&Effect::Unknown {
                buffer: params.id,
                offset: 0,
                len,
            });
        }
        Ok(())
    }
}
