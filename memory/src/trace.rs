//! `BackTrace`: a cheap, serializable backtrace carried by errors.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where an error was made.
///
/// Captured unresolved (a stack walk, no symbol lookup) when the error is
/// made, resolved to text the first time it is displayed, compared or
/// serialized, and deserialized as that text. Two backtraces are equal when
/// their text is.
///
/// Capture is on by default. Setting the environment variable
/// `CISTERN_BACKTRACE=0` turns it off: the variable is read once per process,
/// at the first capture, and every backtrace made after that is empty. Any
/// other value, or no variable, leaves capture on.
#[derive(Clone)]
pub struct BackTrace {
    raw: Option<Arc<backtrace::Backtrace>>,
    text: Arc<OnceLock<String>>,
}

impl BackTrace {
    /// Captures the current stack, unless capture is turned off.
    pub fn capture() -> Self {
        if capture_enabled() {
            BackTrace {
                raw: Some(Arc::new(backtrace::Backtrace::new_unresolved())),
                text: Arc::new(OnceLock::new()),
            }
        } else {
            BackTrace::none()
        }
    }

    /// An empty backtrace: for errors made on paths where capture would cost too much.
    pub fn none() -> Self {
        BackTrace::from_text(String::new())
    }

    /// A backtrace that is already text (a decoded report, a test fixture).
    pub fn from_text(text: impl Into<String>) -> Self {
        let cell = OnceLock::new();
        let _ = cell.set(text.into());
        BackTrace {
            raw: None,
            text: Arc::new(cell),
        }
    }

    /// The frames as text, one per line; resolves symbols on first use.
    pub fn text(&self) -> &str {
        self.text.get_or_init(|| match &self.raw {
            Some(raw) => resolve(raw),
            None => String::new(),
        })
    }

    /// Whether there are no frames (capture off, or made by [`BackTrace::none`]).
    pub fn is_empty(&self) -> bool {
        self.raw.as_ref().is_none_or(|raw| raw.frames().is_empty()) && self.text().is_empty()
    }
}

fn capture_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("CISTERN_BACKTRACE").map_or(true, |v| v != "0"))
}

fn resolve(raw: &backtrace::Backtrace) -> String {
    let mut resolved = raw.clone();
    resolved.resolve();
    let mut text = String::new();
    for (index, frame) in resolved.frames().iter().enumerate() {
        for symbol in frame.symbols() {
            let name = symbol
                .name()
                .map_or_else(|| "<unknown>".to_string(), |n| n.to_string());
            text.push_str(&format!("{index:4}: {name}"));
            if let (Some(file), Some(line)) = (symbol.filename(), symbol.lineno()) {
                text.push_str(&format!(" at {}:{line}", file.display()));
            }
            text.push('\n');
        }
    }
    text
}

impl PartialEq for BackTrace {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl Eq for BackTrace {}

impl std::fmt::Debug for BackTrace {
    // Never resolves: `{:?}` of an error must stay cheap. Text already known
    // (decoded, fixtures, or displayed before) is shown so a failed
    // comparison says what differed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.text.get(), &self.raw) {
            (Some(text), _) => f.debug_tuple("BackTrace").field(text).finish(),
            (None, Some(raw)) => write!(
                f,
                "BackTrace {{ unresolved_frames: {} }}",
                raw.frames().len()
            ),
            (None, None) => f.write_str("BackTrace(\"\")"),
        }
    }
}

impl std::fmt::Display for BackTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

impl Default for BackTrace {
    fn default() -> Self {
        BackTrace::none()
    }
}

impl Serialize for BackTrace {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.text())
    }
}

impl<'de> Deserialize<'de> for BackTrace {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(BackTrace::from_text)
    }
}
