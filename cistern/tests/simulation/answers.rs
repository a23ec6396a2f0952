//! The answers that arrive later — reads, syncs, launch tokens and
//! invalidates — checked against the model, each exactly once.

use cistern::runtime::sync::TryRecvError;
use cistern::runtime::{ContextState, ErrorCode, ServerError};

use super::super::model::{Pending, bytes_match};
use super::{Failure, World};

impl World {
    /// Takes the answers that arrived for `index` and checks each.
    pub(super) fn collect_answers(&mut self, index: usize) -> Result<(), Failure> {
        let pending = std::mem::take(&mut self.clients[index].pending);
        let mut waiting = Vec::with_capacity(pending.len());
        for item in pending {
            if let Some(item) = self.check_answer(index, item)? {
                waiting.push(item);
            }
        }
        self.clients[index].pending = waiting;
        Ok(())
    }

    /// `Some` when still unanswered; an error when answered wrongly or lost.
    fn check_answer(&mut self, index: usize, item: Pending) -> Result<Option<Pending>, Failure> {
        let step = item.step();
        let late = |what: &str, error: &ServerError| {
            format!("client {index}: the {what} of step {step} failed with {error}")
        };
        match item {
            Pending::Read {
                answer,
                expected,
                generation,
                step,
            } => match once(&answer, "read", step)? {
                None => Ok(Some(Pending::Read {
                    answer,
                    expected,
                    generation,
                    step,
                })),
                Some(Ok(bytes)) if bytes_match(&expected, &bytes) => {
                    self.hash(&bytes);
                    self.seen.reads_verified += 1;
                    Ok(None)
                }
                Some(Ok(bytes)) => {
                    let at = expected
                        .iter()
                        .zip(&bytes)
                        .position(|(want, got)| want.is_some_and(|want| want != *got))
                        .unwrap_or(0);
                    let end = (at + 8).min(bytes.len());
                    Err(format!(
                        "client {index}: the read of step {step} returned bytes the model did not write: {} bytes, from byte {at} expected {:?}, got {:?}",
                        bytes.len(),
                        expected.get(at..end.min(expected.len())),
                        bytes.get(at..end)
                    ))
                }
                Some(Err(error)) => {
                    self.async_refusal(index, generation, &error, late("read", &error))
                }
            },
            Pending::Sync {
                answer,
                generation,
                step,
            } => match once(&answer, "sync", step)? {
                None => Ok(Some(Pending::Sync {
                    answer,
                    generation,
                    step,
                })),
                Some(Ok(())) => {
                    self.hash(b"ok");
                    Ok(None)
                }
                Some(Err(error)) => {
                    self.async_refusal(index, generation, &error, late("sync", &error))
                }
            },
            Pending::Launch {
                token,
                generation,
                step,
            } => match token.check() {
                None => Ok(Some(Pending::Launch {
                    token,
                    generation,
                    step,
                })),
                Some(Ok(())) => {
                    self.hash(b"ok");
                    Ok(None)
                }
                Some(Err(error)) => {
                    self.async_refusal(index, generation, &error, late("launch", &error))
                }
            },
            Pending::Invalidate {
                answer,
                generation,
                step,
            } => match once(&answer, "invalidate", step)? {
                None => Ok(Some(Pending::Invalidate {
                    answer,
                    generation,
                    step,
                })),
                Some(Ok(ContextState::Active { generation: now })) if now == generation + 1 => {
                    self.recovered_to.insert(now);
                    Ok(None)
                }
                Some(Err(error))
                    if error.code() == ErrorCode::DeviceLost
                        && self.faults.unrecoverable_possible() =>
                {
                    Ok(None)
                }
                Some(other) => Err(format!(
                    "client {index}: the invalidate of step {step} (generation {generation}) answered {other:?}"
                )),
            },
        }
    }

    /// Work that ran on the device may fail only with the fault of a trap.
    fn async_refusal(
        &mut self,
        index: usize,
        generation: u64,
        error: &ServerError,
        message: String,
    ) -> Result<Option<Pending>, Failure> {
        self.hash_answer(error);
        if let ServerError::ContextPoisoned(poison) = error
            && poison.generation != generation
        {
            return Err(format!(
                "{message}: the fault of generation {} failed work of generation {generation}",
                poison.generation
            ));
        }
        if error.code() == ErrorCode::DevicePoisoned && self.faults.trap_possible(generation) {
            self.seen.device_failures += 1;
            self.clients[index].saw_poison = Some(generation);
            Ok(None)
        } else {
            Err(message)
        }
    }
}

/// Takes an answer if one came; a reply dropped unanswered, or answered
/// twice, is a lost or duplicated reply.
fn once<T>(
    answer: &cistern::runtime::sync::Answer<T>,
    what: &str,
    step: usize,
) -> Result<Option<Result<T, ServerError>>, Failure> {
    match answer.try_recv() {
        Err(TryRecvError::Empty) => Ok(None),
        Err(TryRecvError::Disconnected) => Err(format!("the {what} of step {step} lost its reply")),
        Ok(result) => match answer.try_recv() {
            Ok(_) => Err(format!("the {what} of step {step} was answered twice")),
            Err(_) => Ok(Some(result)),
        },
    }
}
