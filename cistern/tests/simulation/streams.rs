//! Streams and events: clients create and destroy streams of their own and
//! spread their work over them (so the server's cross-stream ordering is
//! what keeps each read equal to the model), and record, wait on and
//! release events.

use cistern::runtime::{Command, Region, ServerError, StreamId};

use super::{Failure, World};

/// Streams a client holds besides its own.
const EXTRA_STREAMS: usize = 2;

impl World {
    /// The stream a client's next command goes on: mostly its own, else
    /// one of the streams it created.
    pub(super) fn stream_for(&mut self, index: usize) -> StreamId {
        let client = &self.clients[index];
        if client.extra_streams.is_empty() || self.rng.chance_percent(60) {
            return client.stream;
        }
        let pick = self.rng.below(client.extra_streams.len() as u64) as usize;
        self.clients[index].extra_streams[pick]
    }

    pub(super) fn streams_and_events(&mut self, index: usize) -> Result<(), Failure> {
        match self.rng.below(100) {
            0..20 => self.create_stream(index),
            20..30 => self.destroy_stream(index),
            30..38 => self.use_destroyed_stream(index),
            38..65 => self.record_event(index),
            65..90 => self.wait_event(index),
            _ => self.release_event(index),
        }
    }

    fn create_stream(&mut self, index: usize) -> Result<(), Failure> {
        if self.clients[index].extra_streams.len() >= EXTRA_STREAMS {
            return self.destroy_stream(index);
        }
        let (result, before, after) = self.call(|reply| Command::CreateStream { reply })?;
        self.judge(index, "create stream", &result, (&before, &after), &[])?;
        if let Ok(stream) = result {
            let known = self.clients.iter().any(|client| {
                client.stream == stream
                    || client.extra_streams.contains(&stream)
                    || client.destroyed_streams.contains(&stream)
            });
            if known || stream.0 == 0 {
                return Err(format!("create stream reused id {}", stream.0));
            }
            self.seen.streams += 1;
            self.clients[index].extra_streams.push(stream);
        }
        Ok(())
    }

    /// Destroys one of the client's streams; work queued on it still runs.
    fn destroy_stream(&mut self, index: usize) -> Result<(), Failure> {
        if self.clients[index].extra_streams.is_empty() {
            return self.create_stream(index);
        }
        let stream = self.clients[index].extra_streams.remove(0);
        let (result, before, after) =
            self.call(|reply| Command::DestroyStream { stream, reply })?;
        // A handle's drop: answered in every state, as a free is.
        if result.is_err() {
            self.judge(index, "destroy stream", &result, (&before, &after), &[])?;
        }
        if result.is_ok() {
            self.seen.streams += 1;
            self.clients[index].destroyed_streams.push(stream);
        } else {
            self.clients[index].extra_streams.push(stream);
        }
        Ok(())
    }

    /// A write on a destroyed stream is refused as an unknown stream
    /// whenever the context admits work, and nothing is written.
    fn use_destroyed_stream(&mut self, index: usize) -> Result<(), Failure> {
        let client = &self.clients[index];
        let (Some(&stream), Some(buffer)) = (client.destroyed_streams.last(), client.live.first())
        else {
            return self.create_stream(index);
        };
        let target = Region {
            buffer: buffer.handle,
            offset: 0,
            size: 4,
        };
        let (result, before, after) = self.call(|reply| Command::Write {
            stream,
            target,
            data: vec![9, 9, 9, 9].into(),
            reply,
        })?;
        match &result {
            Ok(()) => Err(format!(
                "a write on destroyed stream {} succeeded",
                stream.0
            )),
            Err(ServerError::InvalidArgument { message }) if message.contains("stream") => Ok(()),
            Err(_) => self.judge(
                index,
                "a write on a destroyed stream",
                &result,
                (&before, &after),
                &[],
            ),
        }
    }

    fn record_event(&mut self, index: usize) -> Result<(), Failure> {
        let stream = self.stream_for(index);
        let (result, before, after) = self.call(|reply| Command::RecordEvent { stream, reply })?;
        self.judge(index, "record event", &result, (&before, &after), &[])?;
        if let Ok(event) = result {
            if self
                .clients
                .iter()
                .any(|client| client.events.contains(&event))
            {
                return Err(format!("event id {event:?} was handed out twice"));
            }
            self.seen.events += 1;
            self.clients[index].events.push(event);
        }
        Ok(())
    }

    /// Waits on an event any client recorded: accepted whenever the
    /// context admits work (the test device does not model the wait itself;
    /// the server's cross-stream ordering needs none).
    fn wait_event(&mut self, index: usize) -> Result<(), Failure> {
        let events: Vec<_> = self
            .clients
            .iter()
            .flat_map(|client| client.events.iter().copied())
            .collect();
        if events.is_empty() {
            return self.record_event(index);
        }
        let event = events[self.rng.below(events.len() as u64) as usize];
        let stream = self.stream_for(index);
        let (result, before, after) = self.call(|reply| Command::WaitEvent {
            stream,
            event,
            reply,
        })?;
        self.judge(index, "wait event", &result, (&before, &after), &[])?;
        if result.is_ok() {
            self.seen.events += 1;
        }
        Ok(())
    }

    fn release_event(&mut self, index: usize) -> Result<(), Failure> {
        let events = &mut self.clients[index].events;
        if events.is_empty() {
            return self.record_event(index);
        }
        let event = events.swap_remove(0);
        self.handle(Command::ReleaseEvent { event });
        Ok(())
    }
}
