//! What the simulation expects: each client's buffers and their bytes as
//! last written, filled or copied, the replies it still waits for, and the
//! error codes each context state may answer with.

use cistern::runtime::sync::Answer;
use cistern::runtime::{BufferRef, ContextState, ErrorCode, FailureToken, StreamId};

/// A live buffer and the bytes the model says it holds (`None`: never set).
pub struct Buffer {
    pub handle: BufferRef,
    pub size: u64,
    pub bytes: Vec<Option<u8>>,
}

/// A reply or token a client still waits for.
pub enum Pending {
    Read {
        answer: Answer<Vec<u8>>,
        expected: Vec<Option<u8>>,
        generation: u64,
        step: usize,
    },
    Sync {
        answer: Answer<()>,
        generation: u64,
        step: usize,
    },
    Invalidate {
        answer: Answer<ContextState>,
        generation: u64,
        step: usize,
    },
    Launch {
        token: FailureToken,
        generation: u64,
        step: usize,
    },
}

impl Pending {
    /// The step that sent it.
    pub fn step(&self) -> usize {
        match self {
            Pending::Read { step, .. }
            | Pending::Sync { step, .. }
            | Pending::Invalidate { step, .. }
            | Pending::Launch { step, .. } => *step,
        }
    }
}

/// One simulated client: its stream, buffers and outstanding replies.
pub struct Client {
    pub stream: StreamId,
    pub live: Vec<Buffer>,
    /// Handles of older generations, kept to check they stay refused.
    pub stale: Vec<BufferRef>,
    /// The generation in which this client last saw a poisoned refusal.
    pub saw_poison: Option<u64>,
    pub pending: Vec<Pending>,
}

/// The code a state's entry gate refuses with, `None` when it admits.
pub fn gate_code(state: &ContextState) -> Option<ErrorCode> {
    match state {
        ContextState::Active { .. } => None,
        ContextState::Poisoned { .. } => Some(ErrorCode::DevicePoisoned),
        ContextState::Retiring { .. } | ContextState::Capturing { .. } => {
            Some(ErrorCode::ContextBusy)
        }
        ContextState::Unrecoverable { .. } => Some(ErrorCode::DeviceLost),
    }
}

/// Whether `expected` (the model) matches `actual` (the device's answer).
pub fn bytes_match(expected: &[Option<u8>], actual: &[u8]) -> bool {
    expected.len() == actual.len()
        && expected
            .iter()
            .zip(actual)
            .all(|(want, got)| want.is_none_or(|want| want == *got))
}
