//! The workload's operations: reserve, write, fill, copy, read-and-verify,
//! and the final settling of a client's launches.

use cistern_runtime::{AllocationPolicy, KernelLaunch};

use super::{Held, MAX_SPLIT_DEPTH, Next, PendingLaunch, Stopped, Worker};
use crate::stress::counters::Counters;
use crate::stress::handling::{Handling, handling};
use crate::stress::pattern::{Expected, Pattern};
use crate::stress::workload::{CopyVia, Span, place};

impl Worker<'_> {
    pub(super) fn reserve(&mut self, size: u64, depth: u32) -> Result<(), Stopped> {
        let counters = &self.shared.counters;
        if let Some(budget) = self.shared.config.workload.client_budget {
            let mut held: u64 = self.held.iter().map(|h| h.buffer.size()).sum();
            while held + size > budget && !self.held.is_empty() {
                let index = self.rng.below(self.held.len() as u64) as usize;
                held -= self.held.swap_remove(index).buffer.size();
            }
        }
        let mut attempt = 0;
        loop {
            let stream = self.stream;
            let result =
                self.call(|client| client.reserve_with(size, AllocationPolicy::Allow, stream));
            match result {
                Ok(buffer) => {
                    Counters::bump(&counters.reservations);
                    let uid = self.next_uid;
                    self.next_uid += 1;
                    self.held.push(Held {
                        uid,
                        expected: Expected::unknown(buffer.size()),
                        buffer,
                    });
                    return Ok(());
                }
                Err(error) if handling(&error) == Handling::Split => {
                    self.record(&error);
                    // It can never fit as is: two halves, as the error asks.
                    let half = (size / 2).next_multiple_of(4);
                    if depth >= MAX_SPLIT_DEPTH || half == 0 || half >= size {
                        return Ok(());
                    }
                    Counters::bump(&counters.splits);
                    self.reserve(half, depth + 1)?;
                    return self.reserve(half, depth + 1);
                }
                Err(error) => match self.handle(&error, attempt, None)? {
                    Next::Retry => attempt += 1,
                    Next::Done => return Ok(()),
                },
            }
        }
    }

    pub(super) fn write(&mut self, index: usize, span: Span) -> Result<(), Stopped> {
        let (uid, buffer) = (self.held[index].uid, self.held[index].buffer.clone());
        let (offset, len) = span.resolve(buffer.size(), 1);
        self.serial += 1;
        let pattern = Pattern::written(uid, self.serial);
        let data = pattern.render(offset, len as usize);
        let mut attempt = 0;
        loop {
            let stream = self.stream;
            match self.call(|client| client.write_on(stream, &buffer, offset, &data)) {
                Ok(()) => {
                    if let Some(held) = self.find(uid) {
                        held.expected.overlay(offset, len, pattern);
                    }
                    Counters::add(&self.shared.counters.bytes_written, len);
                    return Ok(());
                }
                Err(error) => {
                    // A failed transfer may have written part of the range.
                    if let Some(held) = self.find(uid) {
                        held.expected.forget(offset, len);
                    }
                    match self.handle(&error, attempt, Some(uid))? {
                        Next::Retry => attempt += 1,
                        Next::Done => return Ok(()),
                    }
                }
            }
        }
    }

    pub(super) fn fill(&mut self, index: usize, span: Span) -> Result<(), Stopped> {
        let (uid, buffer) = (self.held[index].uid, self.held[index].buffer.clone());
        let (offset, len) = span.resolve(buffer.size(), 4);
        self.serial += 1;
        let (pattern, value) = Pattern::filled(uid, self.serial);
        let launch = KernelLaunch::fill(buffer.range(offset, len), value);
        self.launch(uid, launch, (offset, len), |expected| {
            expected.overlay(offset, len, pattern);
        })
    }

    pub(super) fn copy(
        &mut self,
        from: usize,
        to: usize,
        (len, source_start, target_start): (u32, u32, u32),
        via: CopyVia,
    ) -> Result<(), Stopped> {
        let (source, target) = (&self.held[from], &self.held[to]);
        let align = if via == CopyVia::IdentityKernel { 4 } else { 1 };
        let smaller = source.buffer.size().min(target.buffer.size());
        let (_, len) = Span { start: 0, len }.resolve(smaller, align);
        let source_offset = place(source.buffer.size(), len, source_start, align);
        let target_offset = place(target.buffer.size(), len, target_start, align);
        let (source_buffer, target_buffer) = (source.buffer.clone(), target.buffer.clone());
        let source_expected = source.expected.clone();
        let (source_uid, target_uid) = (source.uid, target.uid);
        let update = |expected: &mut Expected| {
            expected.copy_from(&source_expected, source_offset, target_offset, len);
        };
        let range = (target_offset, len);
        // The source may hold launches not settled yet: if one fails, what
        // this copy carried is not known either.
        self.carry_pending(source_uid, (source_offset, len), target_uid, target_offset);
        match via {
            CopyVia::CopyKernel | CopyVia::IdentityKernel => {
                let bindings = (
                    source_buffer.range(source_offset, len),
                    target_buffer.range(target_offset, len),
                );
                let launch = match via {
                    CopyVia::CopyKernel => KernelLaunch::copy(bindings.0, bindings.1),
                    _ => KernelLaunch::identity(bindings.0, bindings.1),
                };
                self.launch(target_uid, launch, range, update)
            }
            CopyVia::Command => {
                let mut attempt = 0;
                loop {
                    let stream = self.stream;
                    let result = self.call(|client| {
                        client.copy(
                            stream,
                            (&source_buffer, source_offset),
                            (&target_buffer, target_offset),
                            len,
                        )
                    });
                    match result {
                        Ok(()) => {
                            if let Some(held) = self.find(target_uid) {
                                update(&mut held.expected);
                            }
                            Counters::add(&self.shared.counters.bytes_on_device, len);
                            return Ok(());
                        }
                        Err(error) => match self.handle(&error, attempt, Some(target_uid))? {
                            Next::Retry => attempt += 1,
                            Next::Done => return Ok(()),
                        },
                    }
                }
            }
        }
    }

    /// Launches `launch` (which writes `range` of buffer `target`); the
    /// expected content changes at once, and the launch's token is checked
    /// once the stream is known to be past it.
    fn launch(
        &mut self,
        target: u64,
        launch: KernelLaunch,
        (offset, len): (u64, u64),
        update: impl FnOnce(&mut Expected),
    ) -> Result<(), Stopped> {
        let stream = self.stream;
        match self.call(|client| client.launch_tracked(stream, launch)) {
            Ok(token) => {
                if let Some(held) = self.find(target) {
                    update(&mut held.expected);
                }
                Counters::add(&self.shared.counters.bytes_on_device, len);
                self.pending.push(PendingLaunch {
                    token,
                    writes: vec![(target, offset, len)],
                });
                Ok(())
            }
            Err(error) => {
                self.handle(&error, 0, Some(target))?;
                Ok(())
            }
        }
    }

    pub(super) fn read(&mut self, index: usize, span: Span) -> Result<(), Stopped> {
        let (uid, size) = (self.held[index].uid, self.held[index].buffer.size());
        let (offset, len) = span.resolve(size, 1);
        self.read_range(uid, offset, len).map(|_| ())
    }

    /// Reads `[offset, offset + len)` of buffer `uid` and verifies it:
    /// `Some(bytes checked)` when the read came back and matched.
    pub(super) fn read_range(
        &mut self,
        uid: u64,
        offset: u64,
        len: u64,
    ) -> Result<Option<u64>, Stopped> {
        let Some(buffer) = self.find(uid).map(|held| held.buffer.clone()) else {
            return Ok(None);
        };
        let mut attempt = 0;
        let bytes = loop {
            let stream = self.stream;
            match self.call(|client| client.read_on(stream, &buffer, offset, len)) {
                Ok(bytes) => break bytes,
                Err(error) => match self.handle(&error, attempt, Some(uid))? {
                    Next::Retry => attempt += 1,
                    Next::Done => return Ok(None),
                },
            }
        };
        drop(buffer);
        Counters::add(&self.shared.counters.bytes_read, len);
        // The read ran after every earlier launch on this stream: their
        // tokens are settled, and a failed one changes what to expect.
        self.settle_launches()?;
        let Some(held) = self.held.iter().find(|held| held.uid == uid) else {
            return Ok(None);
        };
        match held.expected.verify(offset, &bytes) {
            Ok(checked) => {
                Counters::add(&self.shared.counters.verified_bytes, checked);
                Ok(Some(checked))
            }
            Err(mismatch) => {
                Counters::bump(&self.shared.counters.corrupted_reads);
                self.shared.corruption(format!(
                    "client {} read {} bytes at {} of allocation {:?} (generation {}): byte {} \
                     is {:#04x}, expected {:#04x}",
                    self.index,
                    len,
                    offset,
                    held.buffer.reference().id,
                    held.generation(),
                    mismatch.offset,
                    mismatch.found,
                    mismatch.expected
                ));
                Ok(None)
            }
        }
    }

    /// Every unsettled launch that wrote into `source`'s range now also
    /// answers for `len` bytes of `target` at `target_offset`.
    pub(super) fn carry_pending(
        &mut self,
        source: u64,
        (source_offset, len): (u64, u64),
        target: u64,
        target_offset: u64,
    ) {
        let end = source_offset + len;
        for launch in &mut self.pending {
            let overlaps = launch.writes.iter().any(|&(uid, offset, n)| {
                uid == source && offset < end && offset + n > source_offset
            });
            if overlaps && launch.token.check().is_none_or(|outcome| outcome.is_err()) {
                launch.writes.push((target, target_offset, len));
            }
        }
    }

    /// Looks at every settled launch token: a failure is handled, and the
    /// range that launch would have written is no longer known.
    pub(super) fn settle_launches(&mut self) -> Result<(), Stopped> {
        let mut failed = Vec::new();
        self.pending
            .retain_mut(|launch| match launch.token.check() {
                None => true,
                Some(Ok(())) => false,
                Some(Err(error)) => {
                    failed.push((std::mem::take(&mut launch.writes), error));
                    false
                }
            });
        for (writes, error) in failed {
            for (target, offset, len) in writes {
                if let Some(held) = self.find(target) {
                    held.expected.forget(offset, len);
                }
            }
            self.handle(&error, 0, None)?;
        }
        Ok(())
    }

    /// Waits for the stream, checks that every launch was answered, and
    /// drops every buffer.
    pub(super) fn finish(&mut self) -> Result<(), Stopped> {
        let stream = self.stream;
        let mut attempt = 0;
        loop {
            match self.call(|client| client.sync(stream)) {
                Ok(()) => break,
                Err(error) => match self.handle(&error, attempt, None)? {
                    Next::Retry => attempt += 1,
                    Next::Done => break,
                },
            }
        }
        self.settle_launches()?;
        // After a sync every launch before it has settled its token, unless
        // a poison dropped them: whatever is still pending was never answered.
        let unanswered = self
            .pending
            .iter()
            .filter(|launch| launch.token.check().is_none())
            .count() as u64;
        if unanswered > 0 {
            Counters::add(&self.shared.counters.lost_replies, unanswered);
            self.shared.lost(format!(
                "client {}: {unanswered} launch tokens never settled after a sync",
                self.index
            ));
        }
        self.pending.clear();
        self.held.clear();
        Ok(())
    }
}
