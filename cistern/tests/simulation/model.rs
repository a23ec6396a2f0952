//! What the simulation expects: each client's buffers and their bytes as
//! last written, filled or copied, the replies it still waits for, and the
//! error codes each context state may answer with.

use cistern::runtime::sync::Answer;
use cistern::runtime::{
    AllocationId, BufferRef, CaptureId, ContextState, ErrorCode, EventId, FailureToken, GraphRef,
    StreamId,
};

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

/// What one recorded or batched kernel does to the model's bytes, naming
/// buffers by id (slots move as buffers are freed).
#[derive(Clone, Debug)]
pub enum Effect {
    Fill {
        buffer: AllocationId,
        offset: u64,
        len: u64,
        value: f32,
    },
    Copy {
        source: AllocationId,
        source_offset: u64,
        target: AllocationId,
        target_offset: u64,
        len: u64,
    },
    /// Bytes the test device does not compute (an optimizer step's outputs).
    Unknown {
        buffer: AllocationId,
        offset: u64,
        len: u64,
    },
}

/// A capture this client began and has not ended.
pub struct Recording {
    pub capture: CaptureId,
    pub effects: Vec<Effect>,
    pub launches: u64,
}

/// A graph this client holds: what each replay does.
pub struct Graph {
    pub graph: GraphRef,
    pub effects: Vec<Effect>,
}

/// One simulated client: its streams, buffers, events, graphs and
/// outstanding replies.
pub struct Client {
    pub stream: StreamId,
    /// Streams it created besides its own, used for cross-stream work.
    pub extra_streams: Vec<StreamId>,
    /// Streams it destroyed: every later use is refused.
    pub destroyed_streams: Vec<StreamId>,
    /// Events it recorded and has not released.
    pub events: Vec<EventId>,
    pub recording: Option<Recording>,
    pub graphs: Vec<Graph>,
    /// Graphs of older generations, kept to check they stay refused.
    pub stale_graphs: Vec<GraphRef>,
    pub live: Vec<Buffer>,
    /// Handles of older generations, kept to check they stay refused.
    pub stale: Vec<BufferRef>,
    /// The generation in which this client last saw a poisoned refusal.
    pub saw_poison: Option<u64>,
    pub pending: Vec<Pending>,
}

impl Client {
    /// A client on `stream` with nothing yet.
    pub fn new(stream: StreamId) -> Self {
        Client {
            stream,
            extra_streams: Vec::new(),
            destroyed_streams: Vec::new(),
            events: Vec::new(),
            recording: None,
            graphs: Vec::new(),
            stale_graphs: Vec::new(),
            live: Vec::new(),
            stale: Vec::new(),
            saw_poison: None,
            pending: Vec::new(),
        }
    }

    /// Applies `effect` to the model's bytes, as the device will in order.
    pub fn apply(&mut self, effect: &Effect) {
        let find = |live: &[Buffer], id: AllocationId| live.iter().position(|b| b.handle.id == id);
        match *effect {
            Effect::Fill {
                buffer,
                offset,
                len,
                value,
            } => {
                if let Some(slot) = find(&self.live, buffer) {
                    let bytes =
                        &mut self.live[slot].bytes[offset as usize..(offset + len) as usize];
                    for (at, byte) in bytes.iter_mut().enumerate() {
                        *byte = Some(value.to_ne_bytes()[at % 4]);
                    }
                }
            }
            Effect::Copy {
                source,
                source_offset,
                target,
                target_offset,
                len,
            } => {
                let Some(to) = find(&self.live, target) else {
                    return;
                };
                // A freed source a graph still pins holds bytes the model
                // no longer tracks.
                let moved: Vec<Option<u8>> = match find(&self.live, source) {
                    Some(from) => self.live[from].bytes
                        [source_offset as usize..(source_offset + len) as usize]
                        .to_vec(),
                    None => vec![None; len as usize],
                };
                self.live[to].bytes[target_offset as usize..(target_offset + len) as usize]
                    .copy_from_slice(&moved);
            }
            Effect::Unknown {
                buffer,
                offset,
                len,
            } => {
                if let Some(slot) = find(&self.live, buffer) {
                    self.live[slot].bytes[offset as usize..(offset + len) as usize].fill(None);
                }
            }
        }
    }
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
