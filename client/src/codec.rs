//! The JSON-lines and bincode encodings of reports and errors.
//!
//! The only module that names `bincode`: its version is pinned (`=2.0.1`)
//! and its types never leave this file, so it can be swapped in one place.

use std::io::{ErrorKind, Read, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest bincode value (and frame) a decoder accepts, in bytes.
///
/// Lengths read from the input are checked against it before anything is
/// allocated, so corrupt bytes cannot ask for a huge buffer.
pub const BINCODE_LIMIT: usize = 1 << 20;

/// Why a value could not be encoded or decoded.
///
/// Decoding never panics on malformed input: it returns one of these. A
/// decode error means the record is corrupt, truncated, or written by a
/// layout this build does not know: skip the record (JSON lines) or stop
/// reading the stream (frames, whose position is then unknown).
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The value could not be encoded (a map with non-string keys in JSON,
    /// say): a bug in the type; report it.
    #[error("encoding failed: {message}")]
    Encode {
        /// The encoder's message.
        message: String,
    },
    /// The line is not one JSON encoding of the expected type: skip it.
    #[error("not a valid JSON line: {message}")]
    Json {
        /// The decoder's message.
        message: String,
    },
    /// The bytes are not a bincode encoding of the expected type (or ask
    /// for more than [`BINCODE_LIMIT`]): skip the record or stop reading.
    #[error("not a valid bincode encoding: {message}")]
    Bincode {
        /// The decoder's message.
        message: String,
    },
    /// Bytes follow a complete value: the record is corrupt; skip it.
    #[error("{extra} bytes follow the encoded value")]
    TrailingBytes {
        /// Bytes left over after the value.
        extra: usize,
    },
    /// A frame claims more than [`BINCODE_LIMIT`] bytes: the stream is
    /// corrupt; stop reading it.
    #[error("a frame of {len} bytes exceeds the {limit}-byte limit")]
    FrameTooLarge {
        /// The length the frame claims.
        len: u64,
        /// The most a frame may claim ([`BINCODE_LIMIT`]).
        limit: usize,
    },
    /// The stream ended inside a frame (a writer was interrupted): the
    /// records before it are whole; stop reading.
    #[error("the stream ended inside a frame")]
    TruncatedFrame,
    /// Reading or writing the stream failed: handle it as that I/O error.
    #[error("stream I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

/// `value` as one line of JSON, without the line terminator; a newline
/// inside a string is escaped, so the line never contains one.
pub fn to_json_line<T: Serialize>(value: &T) -> Result<String, CodecError> {
    let line = serde_json::to_string(value).map_err(|error| CodecError::Encode {
        message: error.to_string(),
    })?;
    debug_assert!(!line.contains('\n'));
    Ok(line)
}

/// Decodes one JSON line; a trailing `\n` or `\r\n` is accepted, any other
/// newline is an error (it would be two records).
pub fn from_json_line<T: DeserializeOwned>(line: &str) -> Result<T, CodecError> {
    let line = line
        .strip_suffix('\n')
        .map_or(line, |rest| rest.strip_suffix('\r').unwrap_or(rest));
    if line.contains('\n') {
        return Err(CodecError::Json {
            message: "more than one line".into(),
        });
    }
    serde_json::from_str(line).map_err(|error| CodecError::Json {
        message: error.to_string(),
    })
}

/// Writes `value` as one JSON line, terminated by `\n`.
pub fn write_json_line<T: Serialize>(writer: &mut impl Write, value: &T) -> Result<(), CodecError> {
    let mut line = to_json_line(value)?;
    line.push('\n');
    writer.write_all(line.as_bytes())?;
    Ok(())
}

/// `value` in bincode's standard configuration (variable-length integers,
/// variants by declaration index).
pub fn to_bincode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard()).map_err(|error| {
        CodecError::Encode {
            message: error.to_string(),
        }
    })
}

/// Decodes exactly one value from all of `bytes`, within [`BINCODE_LIMIT`].
pub fn from_bincode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let config = bincode::config::standard().with_limit::<BINCODE_LIMIT>();
    let (value, read) =
        bincode::serde::decode_from_slice(bytes, config).map_err(|error| CodecError::Bincode {
            message: error.to_string(),
        })?;
    match bytes.len() - read {
        0 => Ok(value),
        extra => Err(CodecError::TrailingBytes { extra }),
    }
}

/// Writes `value` as one frame: its bincode length as a little-endian
/// `u32`, then the bytes. A value over [`BINCODE_LIMIT`] is refused, so
/// every frame written can be read back.
pub fn write_bincode_frame<T: Serialize>(
    writer: &mut impl Write,
    value: &T,
) -> Result<(), CodecError> {
    let bytes = to_bincode(value)?;
    let len = bytes.len();
    if len > BINCODE_LIMIT {
        return Err(CodecError::FrameTooLarge {
            len: len as u64,
            limit: BINCODE_LIMIT,
        });
    }
    // `len <= BINCODE_LIMIT`, which fits a u32.
    let prefix = (len as u32).to_le_bytes();
    writer.write_all(&prefix)?;
    writer.write_all(&bytes)?;
    Ok(())
}

/// Reads the next frame written by [`write_bincode_frame`]: `None` at a
/// clean end of stream (between frames), `Some(Err(_))` for a broken one.
pub fn read_bincode_frame<T: DeserializeOwned>(
    reader: &mut impl Read,
) -> Option<Result<T, CodecError>> {
    let mut prefix = [0u8; 4];
    match read_full(reader, &mut prefix) {
        Ok(0) => return None,
        Ok(4) => {}
        Ok(_) => return Some(Err(CodecError::TruncatedFrame)),
        Err(error) => return Some(Err(error.into())),
    }
    let len = u32::from_le_bytes(prefix);
    if len as usize > BINCODE_LIMIT {
        return Some(Err(CodecError::FrameTooLarge {
            len: u64::from(len),
            limit: BINCODE_LIMIT,
        }));
    }
    let mut bytes = vec![0u8; len as usize];
    Some(match read_full(reader, &mut bytes) {
        Ok(read) if read == bytes.len() => from_bincode(&bytes),
        Ok(_) => Err(CodecError::TruncatedFrame),
        Err(error) => Err(error.into()),
    })
}

/// Fills `buffer` as far as the stream allows; returns how much was read.
fn read_full(reader: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}
