//! What a client does: each operation it sends, and the check of the
//! answer the server gives at once.

use cistern::runtime::sync::{TryRecvError, reply_channel};
use cistern::runtime::{
    AllocationPolicy, Binding, BufferRef, Command, ContextState, ErrorCode, FailureToken,
    KernelLaunch, Region, ServerError,
};

use super::super::model::{Buffer, Pending, gate_code};
use super::{Failure, World};

impl World {
    pub(super) fn client_acts(&mut self, index: usize) -> Result<(), Failure> {
        if let Some(seen) = self.clients[index].saw_poison
            && self.rng.chance_percent(60)
        {
            self.clients[index].saw_poison = None;
            self.note(format!(
                "step {} client {index}: invalidate({seen})",
                self.step
            ));
            return self.invalidate(index, seen);
        }
        if self.clients[index].recording.is_some() {
            return self.capture_acts(index);
        }
        let has_live = !self.clients[index].live.is_empty();
        let roll = self.rng.below(100);
        let action = match roll {
            _ if !has_live || roll < 12 => "reserve",
            12..25 => "write",
            25..34 => "fill",
            34..40 => "copy kernel",
            40..44 => "copy",
            44..58 => "read",
            58..64 => "free",
            64..68 => "sync",
            68..71 => "maintain",
            71..74 => "use stale",
            74..76 => "query",
            76..78 => "invalidate",
            78..83 => "launch batch",
            83..85 => "optimizer step",
            85..90 => "streams and events",
            90..92 => "begin capture",
            92..96 => "replay",
            96..97 => "release graph",
            _ => "trap or out of range",
        };
        self.note(format!(
            "step {} client {index}: {action} (state {}, live {:?})",
            self.step,
            self.core.context().name(),
            self.clients[index]
                .live
                .iter()
                .map(|b| b.handle.id.0)
                .collect::<Vec<_>>()
        ));
        match action {
            "reserve" => self.reserve(index),
            "write" => self.write(index),
            "fill" => self.fill(index),
            "copy kernel" => self.copy(index, true),
            "copy" => self.copy(index, false),
            "read" => self.read(index),
            "free" => self.free(index),
            "sync" => self.sync(index),
            "maintain" => self.maintain(index),
            "use stale" => self.use_stale(index),
            "query" => self.query(),
            "invalidate" => self.invalidate(index, self.watch.generation().saturating_sub(1)),
            "launch batch" => self.launch_batch(index),
            "optimizer step" => self.optimizer_step(index),
            "streams and events" => self.streams_and_events(index),
            "begin capture" => self.begin_capture(index),
            "replay" => self.replay(index),
            "release graph" => self.release_graph(index),
            _ if self.rng.below(100) < self.trap_percent * 50 => self.trap(index),
            _ => self.out_of_range(index),
        }
    }

    pub(super) fn pick(&mut self, index: usize) -> usize {
        self.rng.below(self.clients[index].live.len() as u64) as usize
    }

    /// A 4-aligned span of a buffer of `size` bytes: (offset, len).
    pub(super) fn span(&mut self, size: u64) -> (u64, u64) {
        let words = size / 4;
        let start = self.rng.below(words);
        let len = 1 + self.rng.below(words - start);
        (start * 4, len * 4)
    }

    pub(super) fn reserve(&mut self, index: usize) -> Result<(), Failure> {
        let size = match self.rng.below(20) {
            0 => 4 * (65_536 + self.rng.below(65_536)),
            1..5 => 4 * (1024 + self.rng.below(8192)),
            _ => 4 * (1 + self.rng.below(1024)),
        };
        let stream = self.clients[index].stream;
        let (result, before, after) = self.call(|reply| Command::Reserve {
            size,
            policy: AllocationPolicy::Allow,
            stream,
            reply,
        })?;
        let mut extra = Vec::new();
        if matches!(&result, Err(error) if error.code() == ErrorCode::DeviceOutOfMemory) {
            self.faults.injected_reservations += 1;
            if self.faults.plan.fail_reservation.is_some() && self.faults.injected_reservations == 1
            {
                extra.push(ErrorCode::DeviceOutOfMemory);
            }
        }
        self.judge(index, "reserve", &result, (&before, &after), &extra)?;
        if let Ok(reservation) = result {
            if reservation.buffer.generation != after.generation() {
                return Err(format!(
                    "a reservation of generation {} in generation {}",
                    reservation.buffer.generation,
                    after.generation()
                ));
            }
            self.clients[index].live.push(Buffer {
                handle: reservation.buffer,
                size,
                bytes: vec![None; size as usize],
            });
            if self.rng.chance_percent(70) {
                // Most programs initialize what they reserve; known bytes
                // are what make a read catch memory handed out too early.
                let slot = self.clients[index].live.len() - 1;
                self.write_span(index, slot, 0, size)?;
            }
        }
        Ok(())
    }

    /// The transfer codes an answer may carry beyond the state's.
    fn transfer_extra<T>(&mut self, result: &Result<T, ServerError>) -> Vec<ErrorCode> {
        if matches!(result, Err(error) if error.code() == ErrorCode::TransferFailed) {
            self.faults.injected_transfers += 1;
            if self.faults.plan.fail_transfer.is_some() && self.faults.injected_transfers == 1 {
                return vec![ErrorCode::TransferFailed];
            }
        }
        Vec::new()
    }

    fn write(&mut self, index: usize) -> Result<(), Failure> {
        let slot = self.pick(index);
        let size = self.clients[index].live[slot].size;
        let (offset, len) = self.span(size);
        self.write_span(index, slot, offset, len)
    }

    fn write_span(
        &mut self,
        index: usize,
        slot: usize,
        offset: u64,
        len: u64,
    ) -> Result<(), Failure> {
        let handle = self.clients[index].live[slot].handle;
        let seed = self.rng.next_u64();
        let data: Vec<u8> = (0..len)
            .map(|i| (seed.wrapping_add(i * 31) >> 3) as u8)
            .collect();
        let stream = self.stream_for(index);
        let target = Region {
            buffer: handle,
            offset,
            size: len,
        };
        let sent = data.clone();
        let (result, before, after) = self.call(|reply| Command::Write {
            stream,
            target,
            data: sent.into(),
            reply,
        })?;
        let extra = self.transfer_extra(&result);
        self.judge(index, "write", &result, (&before, &after), &extra)?;
        if result.is_ok() {
            let bytes = &mut self.clients[index].live[slot].bytes;
            for (at, byte) in data.into_iter().enumerate() {
                bytes[offset as usize + at] = Some(byte);
            }
        }
        Ok(())
    }

    /// Launches one kernel with a token; the model changes only if queued.
    pub(super) fn launch(
        &mut self,
        index: usize,
        what: &str,
        launch: KernelLaunch,
    ) -> Result<bool, Failure> {
        let token = FailureToken::new();
        let stream = self.stream_for(index);
        let (before, after) = self.handle(Command::Launch {
            stream,
            launch,
            token: Some(token.clone()),
        });
        match token.check() {
            None => {
                self.clients[index].pending.push(Pending::Launch {
                    token,
                    generation: after.generation(),
                    step: self.step,
                });
                if gate_code(&before).is_some() && gate_code(&after).is_some() {
                    return Err(format!("{what} was queued in state {}", after.name()));
                }
                Ok(true)
            }
            Some(result) => {
                self.judge(index, what, &result, (&before, &after), &[])?;
                if result.is_ok() {
                    return Err(format!("{what} succeeded before the device ran it"));
                }
                Ok(false)
            }
        }
    }

    fn fill(&mut self, index: usize) -> Result<(), Failure> {
        let slot = self.pick(index);
        let (handle, size) = {
            let buffer = &self.clients[index].live[slot];
            (buffer.handle, buffer.size)
        };
        let (offset, len) = self.span(size);
        let value = self.rng.below(1 << 20) as f32 * 0.25;
        let binding = Binding {
            buffer: handle,
            offset,
            size: len,
        };
        if self.launch(index, "fill", KernelLaunch::fill(binding, value))? {
            let bytes = &mut self.clients[index].live[slot].bytes;
            for (at, byte) in bytes[offset as usize..(offset + len) as usize]
                .iter_mut()
                .enumerate()
            {
                *byte = Some(value.to_ne_bytes()[at % 4]);
            }
        }
        Ok(())
    }

    /// A copy between two of the client's buffers, by kernel or by command.
    fn copy(&mut self, index: usize, kernel: bool) -> Result<(), Failure> {
        let (from, to) = (self.pick(index), self.pick(index));
        if from == to {
            return self.read(index);
        }
        let (source, source_size) = {
            let buffer = &self.clients[index].live[from];
            (buffer.handle, buffer.size)
        };
        let (target, target_size) = {
            let buffer = &self.clients[index].live[to];
            (buffer.handle, buffer.size)
        };
        let (_, len) = self.span(source_size.min(target_size));
        let source_offset = 4 * self.rng.below((source_size - len) / 4 + 1);
        let target_offset = 4 * self.rng.below((target_size - len) / 4 + 1);
        let queued = if kernel {
            let launch = KernelLaunch::copy(
                Binding {
                    buffer: source,
                    offset: source_offset,
                    size: len,
                },
                Binding {
                    buffer: target,
                    offset: target_offset,
                    size: len,
                },
            );
            self.launch(index, "copy kernel", launch)?
        } else {
            let stream = self.stream_for(index);
            let (result, before, after) = self.call(|reply| Command::Copy {
                stream,
                source: Box::new(Region {
                    buffer: source,
                    offset: source_offset,
                    size: len,
                }),
                target: Box::new(Region {
                    buffer: target,
                    offset: target_offset,
                    size: len,
                }),
                reply,
            })?;
            self.judge(index, "copy", &result, (&before, &after), &[])?;
            result.is_ok()
        };
        if queued {
            let live = &mut self.clients[index].live;
            let moved: Vec<Option<u8>> =
                live[from].bytes[source_offset as usize..(source_offset + len) as usize].to_vec();
            live[to].bytes[target_offset as usize..(target_offset + len) as usize]
                .copy_from_slice(&moved);
        }
        Ok(())
    }

    fn read(&mut self, index: usize) -> Result<(), Failure> {
        let slot = self.pick(index);
        let size = self.clients[index].live[slot].size;
        let (offset, len) = self.span(size);
        self.read_span(index, slot, offset, len)
    }

    pub(super) fn read_span(
        &mut self,
        index: usize,
        slot: usize,
        offset: u64,
        len: u64,
    ) -> Result<(), Failure> {
        let handle = self.clients[index].live[slot].handle;
        let expected =
            self.clients[index].live[slot].bytes[offset as usize..(offset + len) as usize].to_vec();
        let stream = self.stream_for(index);
        let (reply, answer) = reply_channel();
        let (before, after) = self.handle(Command::Read {
            stream,
            source: Region {
                buffer: handle,
                offset,
                size: len,
            },
            reply,
        });
        match answer.try_recv() {
            Err(TryRecvError::Empty) => {
                if gate_code(&before).is_some() && gate_code(&after).is_some() {
                    return Err(format!("a read was queued in state {}", after.name()));
                }
                self.clients[index].pending.push(Pending::Read {
                    answer,
                    expected,
                    generation: after.generation(),
                    step: self.step,
                });
                Ok(())
            }
            Ok(result) => {
                let extra = self.transfer_extra(&result);
                if result.is_ok() {
                    return Err("a read answered before the device ran it".into());
                }
                self.judge(index, "read", &result, (&before, &after), &extra)
            }
            Err(TryRecvError::Disconnected) => Err("a read's reply was dropped".into()),
        }
    }

    fn free(&mut self, index: usize) -> Result<(), Failure> {
        let slot = self.pick(index);
        let buffer = self.clients[index].live.swap_remove(slot);
        self.handle(Command::Free {
            buffer: buffer.handle,
        });
        Ok(())
    }

    fn sync(&mut self, index: usize) -> Result<(), Failure> {
        let stream = self.stream_for(index);
        let (reply, answer) = reply_channel();
        let (before, after) = self.handle(Command::Sync { stream, reply });
        match answer.try_recv() {
            Err(TryRecvError::Empty) => {
                self.clients[index].pending.push(Pending::Sync {
                    answer,
                    generation: after.generation(),
                    step: self.step,
                });
                Ok(())
            }
            Ok(result) => self.judge(index, "sync", &result, (&before, &after), &[]),
            Err(TryRecvError::Disconnected) => Err("a sync's reply was dropped".into()),
        }
    }

    /// Compaction or reclaim: both refused unless the context admits work.
    fn maintain(&mut self, index: usize) -> Result<(), Failure> {
        if self.rng.chance_percent(75) {
            if self.rng.chance_percent(50) {
                // Completions reported make more slices movable.
                self.device.deliver(usize::MAX);
            }
            let (result, before, after) = self.call(|reply| Command::Compact { reply })?;
            if let Ok(report) = &result {
                self.seen.compacted += report.moved;
            }
            self.judge(index, "compact", &result, (&before, &after), &[])
        } else {
            let (result, before, after) = self.call(|reply| Command::Reclaim { reply })?;
            self.judge(index, "reclaim", &result, (&before, &after), &[])
        }
    }

    /// Queries answer in every state.
    fn query(&mut self) -> Result<(), Failure> {
        let (stats, ..) = self.call(|reply| Command::MemoryStats { reply })?;
        let (snapshot, ..) = self.call(|reply| Command::MemorySnapshot { reply })?;
        let (state, _, after) = self.call(|reply| Command::ContextState { reply })?;
        match (stats, snapshot, state) {
            (Ok(_), Ok(_), Ok(state)) if state == after => Ok(()),
            (stats, snapshot, state) => Err(format!(
                "a query was refused or wrong in state {}: {:?} {:?} {state:?}",
                after.name(),
                stats.err(),
                snapshot.err()
            )),
        }
    }

    /// A handle of an older generation is refused with the stale error
    /// whenever the context admits work.
    fn use_stale(&mut self, index: usize) -> Result<(), Failure> {
        let graphs = &self.clients[index].stale_graphs;
        if !graphs.is_empty() && self.rng.chance_percent(40) {
            let graph = graphs[self.rng.below(graphs.len() as u64) as usize];
            return self.replay_stale(index, graph);
        }
        let stale = &self.clients[index].stale;
        if stale.is_empty() {
            return self.read(index);
        }
        let handle: BufferRef = stale[self.rng.below(stale.len() as u64) as usize];
        let stream = self.clients[index].stream;
        let (result, before, after) = self.call(|reply| Command::Write {
            stream,
            target: Region {
                buffer: handle,
                offset: 0,
                size: 4,
            },
            data: vec![1, 2, 3, 4].into(),
            reply,
        })?;
        match &result {
            Err(ServerError::StaleGeneration {
                resource_generation,
                current_generation,
                ..
            }) if *resource_generation == handle.generation
                && *current_generation == after.generation()
                && handle.generation < after.generation() =>
            {
                self.seen.stale_refusals += 1;
                Ok(())
            }
            Err(error) if error.code() != ErrorCode::StaleHandle => {
                if !before.is_active() || !after.is_active() {
                    self.judge(index, "a stale write", &result, (&before, &after), &[])
                } else {
                    Err(format!(
                        "a stale handle was refused with {error}, not as stale"
                    ))
                }
            }
            other => Err(format!("a stale handle was answered {other:?}")),
        }
    }

    /// An out-of-range read is refused at once without touching the device.
    fn out_of_range(&mut self, index: usize) -> Result<(), Failure> {
        let slot = self.pick(index);
        let (handle, size) = {
            let buffer = &self.clients[index].live[slot];
            (buffer.handle, buffer.size)
        };
        let stream = self.clients[index].stream;
        let (result, before, after) = self.call(|reply| Command::Read {
            stream,
            source: Region {
                buffer: handle,
                offset: size,
                size: 4,
            },
            reply,
        })?;
        if result.is_ok() {
            return Err("an out-of-range read succeeded".into());
        }
        self.judge(
            index,
            "out-of-range read",
            &result,
            (&before, &after),
            &[ErrorCode::InvalidArgument],
        )
    }

    fn trap(&mut self, index: usize) -> Result<(), Failure> {
        if self.launch(index, "trap", KernelLaunch::trap())? {
            // The generation it was queued in: a recovery may end inside
            // the command.
            let generation = self.core.context().generation();
            self.faults.trapped_generations.push(generation);
        }
        Ok(())
    }

    pub(super) fn invalidate(&mut self, index: usize, seen: u64) -> Result<(), Failure> {
        let (reply, answer) = reply_channel();
        let (before, after) = self.handle(Command::Invalidate {
            seen_generation: seen,
            reply,
        });
        let acts = matches!(&before, ContextState::Poisoned { generation, .. } if *generation == seen)
            || matches!(&after, ContextState::Poisoned { generation, .. } if *generation == seen);
        match answer.try_recv() {
            Err(TryRecvError::Empty) if acts || after.name() == "retiring" => {
                self.clients[index].pending.push(Pending::Invalidate {
                    answer,
                    generation: before.generation(),
                    step: self.step,
                });
                Ok(())
            }
            Err(TryRecvError::Empty) => Err(format!(
                "invalidate({seen}) in state {} left its caller waiting",
                before.name()
            )),
            Ok(Ok(state)) if !acts && (state == before || state == after) => Ok(()),
            Ok(result) if after.is_unrecoverable() => {
                self.judge(index, "invalidate", &result, (&before, &after), &[])
            }
            other => Err(format!(
                "invalidate({seen}) in state {} answered {other:?}",
                before.name()
            )),
        }
    }
}
