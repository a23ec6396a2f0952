//! What each `IoError` tells a caller: poison, reclaim, source, code.

use std::error::Error;

use cistern_memory::{BackTrace, ErrorCode, IoError, Reason};

use super::samples::{io_samples, poison, variant_name, variant_names};

fn mapping_failed(source: IoError) -> IoError {
    IoError::storage_mapping_failed(4096, source)
}

#[test]
fn the_samples_cover_every_variant_in_declaration_order() {
    let sampled: Vec<String> = io_samples().iter().map(variant_name).collect();
    assert_eq!(sampled, variant_names::<IoError>());
}

#[test]
fn only_poison_directly_or_as_a_mapping_source_is_device_poisoned() {
    for error in io_samples() {
        let expected = matches!(error, IoError::DevicePoisoned(_));
        assert_eq!(error.is_device_poisoned(), expected, "{error:?}");
        assert_eq!(
            mapping_failed(error.clone()).is_device_poisoned(),
            expected,
            "mapping failed over {error:?}"
        );
    }
    let twice = mapping_failed(mapping_failed(IoError::from(poison())));
    assert!(twice.is_device_poisoned());
}

#[test]
fn only_exhaustion_and_device_refusals_may_succeed_after_reclaim() {
    let table = [
        ("BufferTooBig", false),
        ("OutOfMemory", true),
        ("PageUpdateForbidden", false),
        ("PageSizesExhausted", true),
        ("UnsupportedStrides", false),
        ("NotFound", false),
        ("StorageHandleNotFound", false),
        // The sample wraps an out-of-memory.
        ("StorageMappingFailed", true),
        ("DevicePoisoned", false),
        ("Unknown", false),
        ("UnsupportedIoOperation", false),
        ("AllocationFailed", true),
    ];
    let samples = io_samples();
    assert_eq!(samples.len(), table.len());
    for (error, (name, expected)) in samples.iter().zip(table) {
        assert_eq!(variant_name(error), name);
        assert_eq!(error.may_succeed_after_reclaim(), expected, "{name}");
    }
    assert!(!mapping_failed(IoError::buffer_too_big(1)).may_succeed_after_reclaim());
    assert!(!mapping_failed(IoError::from(poison())).may_succeed_after_reclaim());
    assert!(mapping_failed(IoError::page_sizes_exhausted(1)).may_succeed_after_reclaim());
}

#[test]
fn each_variant_has_the_code_of_the_catalogue() {
    let expected = [
        ErrorCode::BufferTooBig,
        ErrorCode::DeviceOutOfMemory,
        ErrorCode::AllocationForbidden,
        ErrorCode::DeviceOutOfMemory,
        ErrorCode::UnsupportedFeature,
        ErrorCode::HandleNotFound,
        ErrorCode::HandleNotFound,
        ErrorCode::DeviceOutOfMemory,
        ErrorCode::DevicePoisoned,
        ErrorCode::Unknown,
        ErrorCode::UnsupportedFeature,
        ErrorCode::DeviceOutOfMemory,
    ];
    let codes: Vec<ErrorCode> = io_samples().iter().map(IoError::code).collect();
    assert_eq!(codes, expected);
    assert_eq!(IoError::buffer_too_big(1).code().stable_id(), 1010);
}

#[test]
fn a_failed_mapping_takes_the_code_of_its_source() {
    for source in io_samples() {
        assert_eq!(mapping_failed(source.clone()).code(), source.code());
    }
}

#[test]
fn the_source_of_a_failed_mapping_is_the_storage_failure() {
    let inner = IoError::out_of_memory(4096);
    let error = mapping_failed(inner.clone());
    let source = error.source().and_then(|s| s.downcast_ref::<IoError>());
    assert_eq!(source, Some(&inner));
    assert!(inner.source().is_none());
}

#[test]
fn no_other_variant_has_a_source() {
    for error in io_samples() {
        let has_source = error.source().is_some();
        assert_eq!(
            has_source,
            matches!(error, IoError::StorageMappingFailed { .. }),
            "{error:?}"
        );
    }
}

#[test]
fn the_constructors_build_the_named_variant() {
    let made = [
        IoError::buffer_too_big(1),
        IoError::out_of_memory(1),
        IoError::page_update_forbidden(1),
        IoError::page_sizes_exhausted(1),
        IoError::unsupported_strides(),
        IoError::not_found(Reason::UnknownId),
        IoError::storage_handle_not_found(Reason::OtherDevice),
        IoError::storage_mapping_failed(1, IoError::out_of_memory(1)),
        IoError::from(poison()),
        IoError::unknown("x"),
        IoError::unsupported_io_operation(),
        IoError::allocation_failed(1, "x"),
    ];
    let names: Vec<String> = made.iter().map(variant_name).collect();
    assert_eq!(names, variant_names::<IoError>());
}

#[test]
fn the_message_names_the_size_and_the_reason() {
    assert!(IoError::buffer_too_big(12345).to_string().contains("12345"));
    let missing = IoError::not_found(Reason::AlreadyFreed).to_string();
    assert!(missing.contains("already freed"), "{missing}");
    let poisoned = IoError::from(poison()).to_string();
    assert!(
        poisoned.contains("device 1") && poisoned.contains("generation 7"),
        "{poisoned}"
    );
}

#[test]
fn the_backtrace_accessor_returns_the_variants_own_trace() {
    let error = IoError::Unknown {
        description: "d".into(),
        backtrace: BackTrace::from_text("frame\n"),
    };
    assert_eq!(error.backtrace().text(), "frame\n");
    assert_eq!(IoError::from(poison()).backtrace(), &poison().backtrace);
}
