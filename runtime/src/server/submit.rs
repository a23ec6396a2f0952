//! Queuing work on a stream: the one path from the server to the backend.
//! Each item gets the stream's next sequence, waits for conflicting work
//! of other streams (`ordering.rs`), and records its uses of memory, so
//! frees and later conflicts see it.

use cistern_memory::StreamId;

use super::core::{ServerCore, trace_refusal};
use super::ordering::{self, Use};
use crate::backend::{Backend, Refused, StreamWork};
use crate::error::ServerError;
use crate::kernel::Access;

impl<B: Backend> ServerCore<B> {
    /// Queues `work` as the stream's next item and records its uses of memory.
    pub(super) fn submit(
        &mut self,
        stream: StreamId,
        work: StreamWork,
        uses: &[Use],
    ) -> Result<(), ServerError> {
        self.submit_using(stream, work, uses.iter().copied())
    }

    /// [`submit`](Self::submit), the uses given as an iterator. Work that
    /// conflicts with another stream's work still in flight (see
    /// [`ordering`](super::ordering)) is queued behind a wait for it.
    pub(super) fn submit_using(
        &mut self,
        stream: StreamId,
        work: StreamWork,
        uses: impl Iterator<Item = Use> + Clone,
    ) -> Result<(), ServerError> {
        if !self.streams.contains(stream) {
            let error = ServerError::InvalidArgument {
                message: format!("unknown stream {}", stream.0),
            };
            work.refuse(error.clone());
            return Err(error);
        }
        if self.streams.several() {
            let waits = ordering::waits(&self.memory, stream, uses.clone());
            for (other, sequence) in waits {
                self.stats.ordering_waits += 1;
                let wait = StreamWork::WaitStream {
                    stream: other,
                    sequence,
                };
                if let Err(error) = self.queue(stream, wait) {
                    // Unordered, the work could race the other stream: refuse it.
                    work.refuse(error.clone());
                    return Err(error);
                }
            }
        }
        match self.queue(stream, work) {
            Ok(sequence) => {
                for (id, access) in uses {
                    // Checked to exist by the caller in this same command.
                    let recorded = match access {
                        Access::Read => self.memory.record_use(id, stream, sequence),
                        Access::Write => self.memory.record_write(id, stream, sequence),
                    };
                    debug_assert!(recorded.is_ok(), "a checked allocation records its use");
                }
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Hands `work` to the backend as `stream`'s next item (a known
    /// stream); answers its sequence, or refuses it.
    pub(super) fn queue(&mut self, stream: StreamId, work: StreamWork) -> Result<u64, ServerError> {
        let Some(sequence) = self.streams.next_sequence(stream) else {
            let error = ServerError::InvalidArgument {
                message: format!("unknown stream {}", stream.0),
            };
            work.refuse(error.clone());
            return Err(error);
        };
        match self
            .backend
            .submit(self.memory.storage(), stream, sequence, work)
        {
            Ok(()) => Ok(sequence),
            Err(refused) => {
                let Refused { error, work } = *refused;
                trace_refusal("submit", &error);
                work.refuse(error.clone());
                Err(error)
            }
        }
    }
}
