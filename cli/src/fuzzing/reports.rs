//! Reports and errors from JSON lines, bincode and bincode frames: whatever
//! decodes re-encodes, and decodes back to the same value.

use std::fmt::Debug;

use cistern_client::codec::{self, CodecError};
use cistern_client::{CompactReport, ErrorReport};
use cistern_memory::IoError;
use cistern_runtime::ServerError;

/// One type's decoders and encoders, as a user's bytes reach them.
struct Codec<T> {
    from_json: fn(&str) -> Result<T, CodecError>,
    to_json: fn(&T) -> Result<String, CodecError>,
    from_bincode: fn(&[u8]) -> Result<T, CodecError>,
    to_bincode: fn(&T) -> Result<Vec<u8>, CodecError>,
    read_frame: fn(&mut &[u8]) -> Option<Result<T, CodecError>>,
}

/// `ErrorReport` from a JSON line, bincode and a stream of frames.
pub fn error_report(data: &[u8]) {
    check(
        data,
        &Codec {
            from_json: ErrorReport::from_json_line,
            to_json: ErrorReport::to_json_line,
            from_bincode: ErrorReport::from_bincode,
            to_bincode: ErrorReport::to_bincode,
            read_frame: |reader| ErrorReport::read_bincode_frame(reader),
        },
    );
}

/// `CompactReport` (layout-checked) from a JSON line, bincode and frames.
pub fn compact_report(data: &[u8]) {
    check(
        data,
        &Codec {
            from_json: CompactReport::from_json_line,
            to_json: CompactReport::to_json_line,
            from_bincode: CompactReport::from_bincode,
            to_bincode: CompactReport::to_bincode,
            read_frame: |reader| CompactReport::read_bincode_frame(reader),
        },
    );
}

/// `ServerError` from a JSON line, bincode and frames.
pub fn server_error(data: &[u8]) {
    check::<ServerError>(data, &generic());
}

/// `IoError` (its nested sources bounded) from a JSON line, bincode and frames.
pub fn io_error(data: &[u8]) {
    check::<IoError>(data, &generic());
}

fn generic<T: serde::Serialize + serde::de::DeserializeOwned>() -> Codec<T> {
    Codec {
        from_json: codec::from_json_line,
        to_json: codec::to_json_line,
        from_bincode: codec::from_bincode,
        to_bincode: codec::to_bincode,
        read_frame: |reader| codec::read_bincode_frame(reader),
    }
}

fn check<T: PartialEq + Debug>(data: &[u8], codec: &Codec<T>) {
    if let Ok(Ok(value)) = std::str::from_utf8(data).map(codec.from_json) {
        json_round_trip(codec, &value);
    }
    if let Ok(value) = (codec.from_bincode)(data) {
        bincode_round_trip(codec, &value);
    }
    let mut stream = data;
    while let Some(Ok(value)) = (codec.read_frame)(&mut stream) {
        bincode_round_trip(codec, &value);
    }
}

fn json_round_trip<T: PartialEq + Debug>(codec: &Codec<T>, value: &T) {
    let line = match (codec.to_json)(value) {
        Ok(line) => line,
        Err(error) => panic!("a decoded value does not re-encode as JSON: {error}: {value:?}"),
    };
    match (codec.from_json)(&line) {
        Ok(again) => assert_eq!(&again, value, "JSON round trip of {line}"),
        Err(error) => panic!("a re-encoded JSON line does not decode: {error}: {line}"),
    }
}

fn bincode_round_trip<T: PartialEq + Debug>(codec: &Codec<T>, value: &T) {
    let bytes = match (codec.to_bincode)(value) {
        Ok(bytes) => bytes,
        Err(error) => panic!("a decoded value does not re-encode as bincode: {error}: {value:?}"),
    };
    match (codec.from_bincode)(&bytes) {
        Ok(again) => assert_eq!(&again, value, "bincode round trip"),
        Err(error) => panic!("re-encoded bincode does not decode: {error}: {value:?}"),
    }
}
