//! Capture and replay: a client begins a capture on its stream, records
//! kernels over a few of its turns (every other entry point is refused
//! meanwhile), ends or aborts it, and later replays the graph on any of its
//! streams; the model applies a replay's effects in order, as a launch's.

use cistern::runtime::{Command, ErrorCode, FailureToken, GraphRef, ServerError};

use super::super::model::{Graph, Recording};
use super::{Failure, World};

impl World {
    pub(super) fn begin_capture(&mut self, index: usize) -> Result<(), Failure> {
        let stream = self.clients[index].stream;
        let (result, before, after) = self.call(|reply| Command::BeginCapture { stream, reply })?;
        self.judge(index, "begin capture", &result, (&before, &after), &[])?;
        if let Ok(capture) = result {
            if !after.is_capturing() {
                return Err(format!("begin capture answered in state {}", after.name()));
            }
            self.capture_in_progress = Some(capture);
            self.clients[index].recording = Some(Recording {
                capture,
                effects: Vec::new(),
                launches: 0,
            });
        }
        Ok(())
    }

    /// A turn of a client that is capturing: record, end or abort.
    pub(super) fn capture_acts(&mut self, index: usize) -> Result<(), Failure> {
        let roll = self.rng.below(100);
        let action = match roll {
            0..50 => "capture launch",
            50..92 => "end capture",
            _ => "abort capture",
        };
        self.note(format!(
            "step {} client {index}: {action} (state {})",
            self.step,
            self.core.context().name()
        ));
        match action {
            "capture launch" => self.capture_launch(index),
            "end capture" => self.end_capture(index),
            _ => self.abort_capture(index),
        }
    }

    fn capture_launch(&mut self, index: usize) -> Result<(), Failure> {
        let Some(capture) = self.clients[index].recording.as_ref().map(|r| r.capture) else {
            return Ok(());
        };
        let mut launches = Vec::new();
        let mut effects = Vec::new();
        for _ in 0..1 + self.rng.below(3) {
            if let Some((launch, effect)) = self.random_launch(index) {
                launches.push(launch);
                effects.push(effect);
            }
        }
        let mut bad = false;
        if self.rng.chance_percent(10)
            && let Some(launch) = self.bad_launch(index)
        {
            launches.push(launch);
            bad = true;
        }
        let count = launches.len() as u64;
        let (result, before, after) = self.call(|reply| Command::CaptureLaunch {
            capture,
            launches,
            reply,
        })?;
        let capturing = self.is_ours(capture, (&before, &after));
        match &result {
            Ok(()) if bad => return Err("a capture recorded a bad launch".into()),
            Ok(()) if !capturing => {
                return Err(format!("capture launch recorded in state {}", after.name()));
            }
            Ok(()) => {
                if let Some(recording) = &mut self.clients[index].recording {
                    recording.effects.extend(effects);
                    recording.launches += count;
                }
            }
            Err(error)
                if capturing
                    && !(bad
                        && matches!(
                            error.code(),
                            ErrorCode::InvalidProgram | ErrorCode::InvalidArgument
                        )) =>
            {
                return Err(format!("capture launch refused while capturing: {error}"));
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// Ends the capture: a graph while the context still captures, else
    /// the reason the capture ended (a fault, a recovery).
    fn end_capture(&mut self, index: usize) -> Result<(), Failure> {
        let Some(recording) = self.clients[index].recording.take() else {
            return Ok(());
        };
        let capture = recording.capture;
        let (result, before, after) = self.call(|reply| Command::EndCapture { capture, reply })?;
        match result {
            Ok(info) => {
                if !before.is_capturing() || after.is_capturing() {
                    return Err(format!(
                        "end capture succeeded from {} to {}",
                        before.name(),
                        after.name()
                    ));
                }
                if info.launches != recording.launches
                    || info.graph.generation != after.generation()
                {
                    return Err(format!(
                        "a graph of {} launches in generation {} answered {info:?}",
                        recording.launches,
                        after.generation()
                    ));
                }
                self.seen.graphs += 1;
                self.clients[index].graphs.push(Graph {
                    graph: info.graph,
                    effects: recording.effects,
                });
                Ok(())
            }
            Err(error) if self.is_ours(capture, (&before, &after)) => {
                Err(format!("end capture refused while capturing: {error}"))
            }
            Err(error) => {
                // A fault ended the capture; a recovery since makes it stale.
                let extra = [ErrorCode::StaleHandle, ErrorCode::InvalidArgument];
                let result: Result<(), ServerError> = Err(error);
                self.judge(index, "end capture", &result, (&before, &after), &extra)
            }
        }
    }

    /// Whether `capture` is the one in progress through the whole command.
    fn is_ours(
        &self,
        capture: cistern::runtime::CaptureId,
        (before, after): (
            &cistern::runtime::ContextState,
            &cistern::runtime::ContextState,
        ),
    ) -> bool {
        before.is_capturing() && after.is_capturing() && self.capture_in_progress == Some(capture)
    }

    fn abort_capture(&mut self, index: usize) -> Result<(), Failure> {
        let Some(recording) = self.clients[index].recording.take() else {
            return Ok(());
        };
        let (before, after) = self.handle(Command::AbortCapture {
            capture: recording.capture,
        });
        if self.is_ours(recording.capture, (&before, &after)) {
            return Err("the context still captures after its capture was aborted".into());
        }
        Ok(())
    }

    /// Replays one of the client's graphs; the model applies its effects.
    pub(super) fn replay(&mut self, index: usize) -> Result<(), Failure> {
        let graphs = &self.clients[index].graphs;
        if graphs.is_empty() {
            return self.begin_capture(index);
        }
        let pick = self.rng.below(graphs.len() as u64) as usize;
        let graph = graphs[pick].graph;
        let token = FailureToken::new();
        let stream = self.stream_for(index);
        let (before, after) = self.handle(Command::Replay {
            stream,
            graph,
            token: Some(token.clone()),
        });
        let empty = self.clients[index].graphs[pick].effects.is_empty();
        if self.settle_launch(index, "replay", token, (&before, &after), false, empty)? {
            self.seen.replays += 1;
            let effects = self.clients[index].graphs[pick].effects.clone();
            for effect in &effects {
                self.clients[index].apply(effect);
            }
        }
        Ok(())
    }

    /// A graph of an older generation is refused as stale whenever the
    /// context admits work.
    pub(super) fn replay_stale(&mut self, index: usize, graph: GraphRef) -> Result<(), Failure> {
        let token = FailureToken::new();
        let stream = self.clients[index].stream;
        let (before, after) = self.handle(Command::Replay {
            stream,
            graph,
            token: Some(token.clone()),
        });
        match token.check() {
            Some(Err(ServerError::StaleGeneration { .. })) if after.is_active() => {
                self.seen.stale_graph_refusals += 1;
                Ok(())
            }
            Some(Err(error)) if !after.is_active() || !before.is_active() => {
                let result: Result<(), ServerError> = Err(error);
                self.judge(index, "a stale replay", &result, (&before, &after), &[])
            }
            other => Err(format!("a stale graph's replay answered {other:?}")),
        }
    }

    /// Drops the client's handle on one graph: deferred frees happen now.
    pub(super) fn release_graph(&mut self, index: usize) -> Result<(), Failure> {
        let graphs = &mut self.clients[index].graphs;
        if graphs.is_empty() {
            return self.replay(index);
        }
        let graph = graphs.swap_remove(0).graph;
        self.handle(Command::ReleaseGraph { graph });
        Ok(())
    }
}
