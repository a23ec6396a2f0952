//! Malformed bytes decode to an error: never a panic, a huge allocation or
//! a stack overflow.

use cistern_memory::{BackTrace, IoError, MAX_SOURCE_DEPTH};
use proptest::prelude::*;

use super::samples::{arb_io_error, from_bincode, io_samples, to_bincode};

fn nested(depth: usize) -> IoError {
    let mut error = IoError::OutOfMemory {
        size: 1,
        backtrace: BackTrace::none(),
    };
    for _ in 0..depth {
        error = IoError::StorageMappingFailed {
            size: 1,
            source: Box::new(error),
            backtrace: BackTrace::none(),
        };
    }
    error
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = from_bincode::<IoError>(&bytes);
        let _ = serde_json::from_slice::<IoError>(&bytes);
    }

    #[test]
    fn every_truncation_of_a_valid_encoding_is_an_error(error in arb_io_error()) {
        let bytes = to_bincode(&error);
        for end in 0..bytes.len() {
            prop_assert!(from_bincode::<IoError>(&bytes[..end]).is_err(), "prefix of {}", end);
        }
    }
}

#[test]
fn every_truncation_of_every_sample_is_an_error() {
    for error in io_samples() {
        let bytes = to_bincode(&error);
        for end in 0..bytes.len() {
            assert!(
                from_bincode::<IoError>(&bytes[..end]).is_err(),
                "{error:?} cut at {end}"
            );
        }
    }
}

#[test]
fn a_string_length_beyond_the_limit_is_refused_before_allocating() {
    // Variant 9 (Unknown), then a description claiming u64::MAX bytes.
    let mut bytes = vec![9u8, 0xfd];
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(from_bincode::<IoError>(&bytes).is_err());
}

#[test]
fn a_source_chain_up_to_the_bound_decodes() {
    let error = nested(MAX_SOURCE_DEPTH);
    assert_eq!(from_bincode::<IoError>(&to_bincode(&error)), Ok(error));
}

#[test]
fn a_source_chain_beyond_the_bound_is_refused_in_both_encodings() {
    let error = nested(MAX_SOURCE_DEPTH + 1);
    assert!(from_bincode::<IoError>(&to_bincode(&error)).is_err());
    let text = serde_json::to_string(&error).unwrap_or_default();
    assert!(serde_json::from_str::<IoError>(&text).is_err());
    // The failed decode left the depth count balanced.
    let ok = nested(2);
    assert_eq!(from_bincode::<IoError>(&to_bincode(&ok)), Ok(ok));
}

#[test]
fn a_crafted_deep_chain_fails_without_overflowing_the_stack() {
    // Variant 7 (StorageMappingFailed) with size 0, repeated: each level is
    // two bytes, so a small input could otherwise nest a hundred thousand deep.
    let bytes: Vec<u8> = std::iter::repeat_n([7u8, 0u8], 100_000).flatten().collect();
    assert!(from_bincode::<IoError>(&bytes).is_err());
}
