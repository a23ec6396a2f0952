//! The capture operation: record a short graph on the client's stream,
//! replay it a few times, and read back what the replays wrote.
//!
//! Every failure ends the capture the way the error asks: the guard is
//! dropped first (so the device is `Active` again for everyone), then the
//! error is handled. A graph lives only for this operation, so a recovery
//! that drops the old generation's handles drops it too; a replay is never
//! sent once the client has seen a newer generation or a failed replay.

use std::collections::BTreeMap;

use cistern_client::{CaptureToken, Graph};
use cistern_runtime::{KernelLaunch, ServerError};

use super::{Held, Next, PendingLaunch, Stopped, Worker};
use crate::stress::capture_plan::{CapturePlan, CaptureStep};
use crate::stress::counters::Counters;
use crate::stress::pattern::{Expected, Pattern};
use crate::stress::recording::{Effect, Recording};
use crate::stress::workload::{Span, place};

impl Worker<'_> {
    /// Runs `plan`; `false` when it had nothing to record (no buffer held
    /// and no reservation to make).
    pub(super) fn capture(&mut self, plan: CapturePlan) -> Result<bool, Stopped> {
        let reserves = plan
            .steps()
            .any(|step| matches!(step, CaptureStep::Reserve { .. }));
        if self.held.is_empty() && !reserves {
            return Ok(false);
        }
        let stream = self.stream;
        let mut attempt = 0;
        let (token, guard) = loop {
            match self.call(|client| client.begin_capture(stream)) {
                Ok(pair) => break pair,
                // Another client is capturing: retry shortly, then skip.
                Err(error) => match self.handle(&error, attempt, None)? {
                    Next::Retry => attempt += 1,
                    Next::Done => return Ok(true),
                },
            }
        };
        let mut recording = Recording::new();
        let mut reserved = Vec::new();
        let recorded = self.record_steps(&token, plan, &mut recording, &mut reserved);
        drop(token);
        let ended = match recorded {
            Ok(()) => self.call(|client| client.end_capture(guard)),
            Err(error) => {
                // Dropping the guard aborts the capture before the error is
                // handled: a recovery must not wait on it.
                drop(guard);
                Err(error)
            }
        };
        let graph = match ended {
            Ok(graph) => graph,
            Err(error) => {
                // The capture's reservations went with its recording.
                self.held.retain(|held| !reserved.contains(&held.uid));
                self.handle(&error, 0, None)?;
                return Ok(true);
            }
        };
        Counters::bump(&self.shared.counters.captures);
        self.replay_and_verify(graph, &recording, plan.replays)?;
        Ok(true)
    }

    /// Records `plan`'s steps through `token`, resolving picks against the
    /// buffers held now (a reservation joins them at once).
    fn record_steps(
        &mut self,
        token: &CaptureToken,
        plan: CapturePlan,
        recording: &mut Recording,
        reserved: &mut Vec<u64>,
    ) -> Result<(), ServerError> {
        for step in plan.steps() {
            match step {
                CaptureStep::Reserve { size } => {
                    let buffer = self.call(|_| token.reserve(size))?;
                    Counters::bump(&self.shared.counters.reservations);
                    let uid = self.next_uid;
                    self.next_uid += 1;
                    reserved.push(uid);
                    self.held.push(Held {
                        uid,
                        expected: Expected::unknown(buffer.size()),
                        buffer,
                    });
                }
                CaptureStep::Fill { target, span } => {
                    let Some(index) = target.index(self.held.len()) else {
                        continue;
                    };
                    let held = &self.held[index];
                    let (offset, len) = span.resolve(held.buffer.size(), 4);
                    self.serial += 1;
                    let (pattern, value) = Pattern::filled(held.uid, self.serial);
                    let launch = KernelLaunch::fill(held.buffer.range(offset, len), value);
                    let target = held.uid;
                    self.call(|_| token.launch(launch))?;
                    recording.push(Effect::Fill {
                        target,
                        offset,
                        len,
                        pattern,
                    });
                }
                CaptureStep::Copy {
                    source,
                    target,
                    len,
                    source_start,
                    target_start,
                    identity,
                } => {
                    let held = self.held.len();
                    let (Some(from), Some(to)) = (source.index(held), target.index(held)) else {
                        continue;
                    };
                    if from == to {
                        continue;
                    }
                    let (source, target) = (&self.held[from], &self.held[to]);
                    let align = if identity { 4 } else { 1 };
                    let smaller = source.buffer.size().min(target.buffer.size());
                    let (_, len) = Span { start: 0, len }.resolve(smaller, align);
                    let source_offset = place(source.buffer.size(), len, source_start, align);
                    let target_offset = place(target.buffer.size(), len, target_start, align);
                    let bindings = (
                        source.buffer.range(source_offset, len),
                        target.buffer.range(target_offset, len),
                    );
                    let launch = if identity {
                        KernelLaunch::identity(bindings.0, bindings.1)
                    } else {
                        KernelLaunch::copy(bindings.0, bindings.1)
                    };
                    let effect = Effect::Copy {
                        source: source.uid,
                        target: target.uid,
                        source_offset,
                        target_offset,
                        len,
                    };
                    self.call(|_| token.launch(launch))?;
                    recording.push(effect);
                }
            }
        }
        Ok(())
    }

    /// Replays `graph` up to `replays` times on the client's stream, then
    /// reads back every range it wrote.
    fn replay_and_verify(
        &mut self,
        graph: Graph,
        recording: &Recording,
        replays: u32,
    ) -> Result<(), Stopped> {
        let stream = self.stream;
        let mut tokens = Vec::new();
        for _ in 0..replays {
            // Known stale, or a replay failed (a poison, a refusal): what
            // follows would only be refused.
            let stale = graph.reference().generation < self.generation;
            if stale
                || tokens
                    .iter()
                    .any(|t: &cistern_runtime::FailureToken| t.is_failed())
            {
                break;
            }
            match self.call(|client| client.replay_tracked(stream, &graph)) {
                Ok(token) => {
                    Counters::bump(&self.shared.counters.replays);
                    self.apply_replay(recording, token.clone());
                    tokens.push(token);
                }
                Err(error) => {
                    self.handle(&error, 0, None)?;
                    break;
                }
            }
        }
        drop(graph);
        if tokens.is_empty() || recording.effects().is_empty() {
            return Ok(());
        }
        let mut ranges: Vec<(u64, u64, u64)> =
            recording.effects().iter().map(Effect::written).collect();
        ranges.sort_unstable();
        ranges.dedup();
        let mut checked = 0;
        let mut complete = true;
        for (uid, offset, len) in ranges {
            match self.read_range(uid, offset, len)? {
                Some(bytes) => checked += bytes,
                None => complete = false,
            }
        }
        // The reads ran after the replays on this stream, so their tokens
        // are settled: only replays that ran and read back clean count.
        let ran = tokens.iter().all(|t| matches!(t.check(), Some(Ok(()))));
        if complete && ran && checked > 0 {
            Counters::add(&self.shared.counters.replays_verified, tokens.len() as u64);
        }
        Ok(())
    }

    /// The model after one more replay of `recording`, tracked by `token`.
    fn apply_replay(&mut self, recording: &Recording, token: cistern_runtime::FailureToken) {
        // What this replay copies may come from launches not settled yet.
        for effect in recording.effects() {
            if let Effect::Copy {
                source,
                target,
                source_offset,
                target_offset,
                len,
            } = *effect
            {
                self.carry_pending(source, (source_offset, len), target, target_offset);
            }
        }
        let mut touched: BTreeMap<u64, Expected> = self
            .held
            .iter()
            .filter(|held| {
                recording.effects().iter().any(|effect| match *effect {
                    Effect::Fill { target, .. } => target == held.uid,
                    Effect::Copy { source, target, .. } => source == held.uid || target == held.uid,
                })
            })
            .map(|held| (held.uid, held.expected.clone()))
            .collect();
        recording.replay_onto(&mut touched);
        let mut bytes = 0;
        for (uid, expected) in touched {
            if let Some(held) = self.find(uid) {
                held.expected = expected;
            }
        }
        let writes: Vec<(u64, u64, u64)> =
            recording.effects().iter().map(Effect::written).collect();
        for &(_, _, len) in &writes {
            bytes += len;
        }
        Counters::add(&self.shared.counters.bytes_on_device, bytes);
        self.pending.push(PendingLaunch { token, writes });
    }
}
