//! `ServerError`: its codes, its helpers, its mapping from `IoError`, and
//! its JSON encoding.

use std::error::Error;

use cistern_memory::{BackTrace, DevicePoison, ErrorCode, IoError, Reason};
use cistern_runtime::ServerError;
use proptest::prelude::*;

fn poison() -> DevicePoison {
    DevicePoison {
        ordinal: 2,
        generation: 5,
        operation: "sync".into(),
        status: "illegal instruction".into(),
        backtrace: BackTrace::from_text("0: sync\n"),
    }
}

/// One sample per variant, in declaration order, with the code each must have.
fn samples() -> Vec<(ServerError, ErrorCode)> {
    vec![
        (
            ServerError::Io(IoError::OutOfMemory {
                size: 8,
                backtrace: BackTrace::none(),
            }),
            ErrorCode::DeviceOutOfMemory,
        ),
        (
            ServerError::KernelCompileFailed {
                kernel: "adam".into(),
                message: "syntax".into(),
            },
            ErrorCode::KernelCompileFailed,
        ),
        (
            ServerError::KernelLaunchFailed {
                kernel: "fill".into(),
                message: "queue full".into(),
            },
            ErrorCode::DispatchFailed,
        ),
        (
            ServerError::TransferFailed {
                message: "dma".into(),
            },
            ErrorCode::TransferFailed,
        ),
        (
            ServerError::InvalidArgument {
                message: "len".into(),
            },
            ErrorCode::InvalidArgument,
        ),
        (
            ServerError::InvalidProgram {
                message: "binding 0 too small".into(),
            },
            ErrorCode::InvalidProgram,
        ),
        (
            ServerError::UnsupportedOperation {
                operation: "f16 gemm".into(),
            },
            ErrorCode::UnsupportedFeature,
        ),
        (
            ServerError::DeviceUnavailable {
                device: "cuda:3".into(),
                reason: "absent".into(),
            },
            ErrorCode::UnsupportedFeature,
        ),
        (
            ServerError::DeviceMismatch {
                expected: "cpu:0".into(),
                found: "cpu:1".into(),
            },
            ErrorCode::DeviceMismatch,
        ),
        (
            ServerError::StaleGeneration {
                ordinal: 0,
                resource_generation: 1,
                current_generation: 2,
            },
            ErrorCode::StaleHandle,
        ),
        (
            ServerError::ContextPoisoned(poison()),
            ErrorCode::DevicePoisoned,
        ),
        (
            ServerError::ContextRetiring { ordinal: 0 },
            ErrorCode::ContextBusy,
        ),
        (
            ServerError::ContextUnrecoverable {
                ordinal: 0,
                probe_error: "mismatch".into(),
            },
            ErrorCode::DeviceLost,
        ),
        (
            ServerError::CaptureInProgress { ordinal: 0 },
            ErrorCode::ContextBusy,
        ),
        (
            ServerError::ServerPanicked {
                ordinal: 0,
                message: "boom".into(),
            },
            ErrorCode::PoisonedLock,
        ),
        (
            ServerError::ServerGone { ordinal: 0 },
            ErrorCode::ServerGone,
        ),
        (
            ServerError::CudaUnavailable {
                reason: "libcuda.so.1 not found".into(),
            },
            ErrorCode::UnsupportedFeature,
        ),
    ]
}

fn variant_name(error: &ServerError) -> String {
    match serde_json::to_value(error) {
        Ok(serde_json::Value::Object(map)) => map.keys().next().cloned().unwrap_or_default(),
        other => panic!("not a tagged enum: {other:?}"),
    }
}

fn declared_variants() -> Vec<String> {
    let message = match serde_json::from_str::<ServerError>("\"__none__\"") {
        Ok(value) => panic!("decoded {value:?}"),
        Err(error) => error.to_string(),
    };
    let listed = message
        .split_once("expected one of ")
        .map_or("", |(_, l)| l);
    let listed = listed.split(" at line").next().unwrap_or(listed);
    listed
        .split(", ")
        .map(|name| name.trim_matches('`').to_string())
        .collect()
}

#[test]
fn the_samples_cover_every_variant_in_declaration_order() {
    let sampled: Vec<String> = samples().iter().map(|(e, _)| variant_name(e)).collect();
    assert_eq!(sampled, declared_variants());
}

#[test]
fn each_variant_has_the_code_of_the_catalogue() {
    for (error, code) in samples() {
        assert_eq!(error.code(), code, "{error:?}");
    }
}

#[test]
fn only_retiring_and_capturing_are_transient() {
    for (error, _) in samples() {
        let expected = matches!(
            error,
            ServerError::ContextRetiring { .. } | ServerError::CaptureInProgress { .. }
        );
        assert_eq!(error.is_transient(), expected, "{error:?}");
        assert!(!(error.is_transient() && error.is_device_poisoned()));
    }
}

#[test]
fn only_poison_is_device_poisoned_including_poison_inside_io() {
    for (error, _) in samples() {
        let expected = matches!(error, ServerError::ContextPoisoned(_));
        assert_eq!(error.is_device_poisoned(), expected, "{error:?}");
    }
    assert!(ServerError::Io(IoError::DevicePoisoned(poison())).is_device_poisoned());
    let mapping = IoError::storage_mapping_failed(64, IoError::from(poison()));
    assert!(ServerError::from(mapping).is_device_poisoned());
}

#[test]
fn only_the_out_of_memory_family_may_succeed_after_reclaim() {
    for (error, _) in samples() {
        let expected = matches!(
            &error,
            ServerError::Io(IoError::OutOfMemory { .. } | IoError::PageSizesExhausted { .. })
        );
        assert_eq!(error.may_succeed_after_reclaim(), expected, "{error:?}");
    }
    let mapping = IoError::storage_mapping_failed(64, IoError::out_of_memory(64));
    assert!(ServerError::from(mapping).may_succeed_after_reclaim());
    assert!(!ServerError::from(IoError::buffer_too_big(64)).may_succeed_after_reclaim());
}

#[test]
fn a_poisoned_io_error_becomes_context_poisoned() {
    assert_eq!(
        ServerError::from(IoError::from(poison())),
        ServerError::ContextPoisoned(poison())
    );
}

#[test]
fn any_other_io_error_is_wrapped_unchanged_and_keeps_its_code() {
    let errors = [
        IoError::buffer_too_big(1 << 40),
        IoError::out_of_memory(4096),
        IoError::page_update_forbidden(8),
        IoError::page_sizes_exhausted(8),
        IoError::unsupported_strides(),
        IoError::not_found(Reason::UnknownId),
        IoError::storage_handle_not_found(Reason::StorageReleased),
        IoError::storage_mapping_failed(8, IoError::out_of_memory(8)),
        IoError::unknown("?"),
        IoError::unsupported_io_operation(),
    ];
    for io in errors {
        let server = ServerError::from(io.clone());
        assert_eq!(server.code(), io.code());
        assert_eq!(server, ServerError::Io(io));
    }
    assert_eq!(
        ServerError::from(IoError::buffer_too_big(1))
            .code()
            .stable_id(),
        1010
    );
}

#[test]
fn an_io_error_is_displayed_and_sourced_transparently() {
    let inner = IoError::out_of_memory(32);
    let io = IoError::storage_mapping_failed(32, inner.clone());
    let server = ServerError::from(io.clone());
    assert_eq!(server.to_string(), io.to_string());
    let source = server.source().and_then(|s| s.downcast_ref::<IoError>());
    assert_eq!(source, Some(&inner));
}

#[test]
fn messages_name_the_fields_a_reader_needs() {
    let stale = ServerError::StaleGeneration {
        ordinal: 3,
        resource_generation: 4,
        current_generation: 9,
    }
    .to_string();
    assert!(
        stale.contains("device 3") && stale.contains('4') && stale.contains('9'),
        "{stale}"
    );
    let poisoned = ServerError::ContextPoisoned(poison()).to_string();
    assert!(poisoned.contains("illegal instruction"), "{poisoned}");
}

fn arb_text() -> impl Strategy<Value = String> {
    ".{0,12}"
}

fn arb_server_error() -> impl Strategy<Value = ServerError> {
    let io = prop_oneof![
        any::<u64>().prop_map(|size| IoError::OutOfMemory {
            size,
            backtrace: BackTrace::none()
        }),
        (any::<u64>(), arb_text()).prop_map(|(size, text)| IoError::StorageMappingFailed {
            size,
            source: Box::new(IoError::BufferTooBig {
                size,
                backtrace: BackTrace::from_text(text.clone())
            }),
            backtrace: BackTrace::from_text(text),
        }),
    ];
    let poison = (
        any::<usize>(),
        any::<u64>(),
        arb_text(),
        arb_text(),
        arb_text(),
    )
        .prop_map(
            |(ordinal, generation, operation, status, trace)| DevicePoison {
                ordinal,
                generation,
                operation,
                status,
                backtrace: BackTrace::from_text(trace),
            },
        );
    prop_oneof![
        io.prop_map(ServerError::Io),
        (arb_text(), arb_text())
            .prop_map(|(kernel, message)| ServerError::KernelCompileFailed { kernel, message }),
        (arb_text(), arb_text())
            .prop_map(|(kernel, message)| ServerError::KernelLaunchFailed { kernel, message }),
        arb_text().prop_map(|message| ServerError::TransferFailed { message }),
        arb_text().prop_map(|message| ServerError::InvalidArgument { message }),
        arb_text().prop_map(|message| ServerError::InvalidProgram { message }),
        arb_text().prop_map(|operation| ServerError::UnsupportedOperation { operation }),
        (arb_text(), arb_text())
            .prop_map(|(device, reason)| ServerError::DeviceUnavailable { device, reason }),
        (arb_text(), arb_text())
            .prop_map(|(expected, found)| ServerError::DeviceMismatch { expected, found }),
        (any::<usize>(), any::<u64>(), any::<u64>()).prop_map(|(ordinal, r, c)| {
            ServerError::StaleGeneration {
                ordinal,
                resource_generation: r,
                current_generation: c,
            }
        }),
        poison.prop_map(ServerError::ContextPoisoned),
        any::<usize>().prop_map(|ordinal| ServerError::ContextRetiring { ordinal }),
        (any::<usize>(), arb_text()).prop_map(|(ordinal, probe_error)| {
            ServerError::ContextUnrecoverable {
                ordinal,
                probe_error,
            }
        }),
        any::<usize>().prop_map(|ordinal| ServerError::CaptureInProgress { ordinal }),
        (any::<usize>(), arb_text())
            .prop_map(|(ordinal, message)| ServerError::ServerPanicked { ordinal, message }),
        any::<usize>().prop_map(|ordinal| ServerError::ServerGone { ordinal }),
        arb_text().prop_map(|reason| ServerError::CudaUnavailable { reason }),
    ]
}

proptest! {
    #[test]
    fn any_server_error_round_trips_through_json(error in arb_server_error()) {
        let text = serde_json::to_string(&error).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let decoded: ServerError =
            serde_json::from_str(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(decoded, error);
    }
}
