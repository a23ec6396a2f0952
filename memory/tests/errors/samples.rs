//! One deterministic sample of every variant, proptest strategies covering
//! every variant, and the bincode configuration under test.

use cistern_memory::{BackTrace, DevicePoison, IoError, Reason};
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The decode limit the client codec uses; the memory crate's encodings must fit it.
pub const LIMIT: usize = 1 << 20;

pub fn to_bincode<T: Serialize>(value: &T) -> Vec<u8> {
    match bincode::serde::encode_to_vec(value, bincode::config::standard()) {
        Ok(bytes) => bytes,
        Err(error) => panic!("encoding failed: {error}"),
    }
}

/// Decodes all of `bytes` (trailing bytes are an error) under [`LIMIT`].
pub fn from_bincode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let config = bincode::config::standard().with_limit::<LIMIT>();
    let (value, read) =
        bincode::serde::decode_from_slice(bytes, config).map_err(|e| e.to_string())?;
    if read == bytes.len() {
        Ok(value)
    } else {
        Err(format!("{} trailing bytes", bytes.len() - read))
    }
}

/// The variant names of `T` in declaration order, as serde's
/// unknown-variant message lists them. A test comparing samples against
/// this list fails when a variant is added without a sample.
pub fn variant_names<T: DeserializeOwned + std::fmt::Debug>() -> Vec<String> {
    let error = match serde_json::from_str::<T>("\"__no_such_variant__\"") {
        Ok(value) => panic!("decoded a variant that does not exist: {value:?}"),
        Err(error) => error.to_string(),
    };
    let Some((_, listed)) = error.split_once("expected one of ") else {
        panic!("unexpected serde message: {error}");
    };
    let listed = listed.split(" at line").next().unwrap_or(listed);
    listed
        .split(", ")
        .map(|name| name.trim_matches('`').to_string())
        .collect()
}

/// The variant name of one value, read from its JSON encoding.
pub fn variant_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        Ok(serde_json::Value::Object(map)) if map.len() == 1 => {
            map.keys().next().cloned().unwrap_or_default()
        }
        other => panic!("not an externally tagged enum: {other:?}"),
    }
}

pub fn trace(text: &str) -> BackTrace {
    BackTrace::from_text(text)
}

pub fn poison() -> DevicePoison {
    DevicePoison {
        ordinal: 1,
        generation: 7,
        operation: "launch fill".into(),
        status: "illegal address".into(),
        backtrace: trace("0: fill\n1: launch\n"),
    }
}

/// One sample per `IoError` variant, in declaration order, with fixed texts.
pub fn io_samples() -> Vec<IoError> {
    let bt = || trace("0: reserve\n");
    vec![
        IoError::BufferTooBig {
            size: 1 << 40,
            backtrace: bt(),
        },
        IoError::OutOfMemory {
            size: 4096,
            backtrace: bt(),
        },
        IoError::PageUpdateForbidden {
            size: 512,
            backtrace: bt(),
        },
        IoError::PageSizesExhausted {
            size: 3 << 20,
            backtrace: bt(),
        },
        IoError::UnsupportedStrides { backtrace: bt() },
        IoError::NotFound {
            backtrace: bt(),
            reason: Reason::AlreadyFreed,
        },
        IoError::StorageHandleNotFound {
            reason: Reason::StorageReleased,
            backtrace: bt(),
        },
        IoError::StorageMappingFailed {
            size: 65536,
            source: Box::new(IoError::OutOfMemory {
                size: 65536,
                backtrace: BackTrace::none(),
            }),
            backtrace: bt(),
        },
        IoError::DevicePoisoned(poison()),
        IoError::Unknown {
            description: "driver said no".into(),
            backtrace: bt(),
        },
        IoError::UnsupportedIoOperation { backtrace: bt() },
        IoError::AllocationFailed {
            size: 8192,
            reason: "mapping: CUDA_ERROR_INVALID_VALUE".into(),
            backtrace: bt(),
        },
    ]
}

pub fn arb_backtrace() -> impl Strategy<Value = BackTrace> {
    prop_oneof![
        Just(BackTrace::none()),
        ".{0,40}".prop_map(BackTrace::from_text),
        "([a-z_:]{1,12}\n){1,4}".prop_map(BackTrace::from_text),
    ]
}

pub fn arb_reason() -> impl Strategy<Value = Reason> {
    prop_oneof![
        Just(Reason::UnknownId),
        Just(Reason::AlreadyFreed),
        Just(Reason::OtherDevice),
        Just(Reason::StorageReleased),
    ]
}

pub fn arb_poison() -> impl Strategy<Value = DevicePoison> {
    (
        any::<usize>(),
        any::<u64>(),
        ".{0,16}",
        ".{0,16}",
        arb_backtrace(),
    )
        .prop_map(
            |(ordinal, generation, operation, status, backtrace)| DevicePoison {
                ordinal,
                generation,
                operation,
                status,
                backtrace,
            },
        )
}

/// Every `IoError` variant, `StorageMappingFailed` nested up to three deep.
pub fn arb_io_error() -> impl Strategy<Value = IoError> {
    let leaf = prop_oneof![
        (any::<u64>(), arb_backtrace())
            .prop_map(|(size, backtrace)| IoError::BufferTooBig { size, backtrace }),
        (any::<u64>(), arb_backtrace())
            .prop_map(|(size, backtrace)| IoError::OutOfMemory { size, backtrace }),
        (any::<u64>(), arb_backtrace())
            .prop_map(|(size, backtrace)| IoError::PageUpdateForbidden { size, backtrace }),
        (any::<u64>(), arb_backtrace())
            .prop_map(|(size, backtrace)| IoError::PageSizesExhausted { size, backtrace }),
        arb_backtrace().prop_map(|backtrace| IoError::UnsupportedStrides { backtrace }),
        (arb_backtrace(), arb_reason())
            .prop_map(|(backtrace, reason)| IoError::NotFound { backtrace, reason }),
        (arb_reason(), arb_backtrace())
            .prop_map(|(reason, backtrace)| IoError::StorageHandleNotFound { reason, backtrace }),
        arb_poison().prop_map(IoError::DevicePoisoned),
        (".{0,24}", arb_backtrace()).prop_map(|(description, backtrace)| IoError::Unknown {
            description,
            backtrace
        }),
        arb_backtrace().prop_map(|backtrace| IoError::UnsupportedIoOperation { backtrace }),
        (any::<u64>(), ".{0,24}", arb_backtrace()).prop_map(|(size, reason, backtrace)| {
            IoError::AllocationFailed {
                size,
                reason,
                backtrace,
            }
        }),
    ];
    leaf.prop_recursive(3, 8, 1, |inner| {
        (any::<u64>(), inner, arb_backtrace()).prop_map(|(size, source, backtrace)| {
            IoError::StorageMappingFailed {
                size,
                source: Box::new(source),
                backtrace,
            }
        })
    })
}
