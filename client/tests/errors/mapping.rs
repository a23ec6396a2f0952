//! `ServerError` and `IoError` become the `BackendError` a caller acts on,
//! keeping every field it can hold; codes and helpers agree across layers.

use cistern_client::{AutodiffError, BackendError, ErrorCode, ShapeError};
use cistern_memory::{IoError, Reason};
use cistern_runtime::ServerError;
use proptest::prelude::*;

use super::samples::{
    autodiff_samples, backend_samples, io_samples, poison, server_samples, variant_name,
    variant_names,
};
use super::strategies::{arb_backend_error, arb_io_error, arb_server_error};

#[test]
fn the_samples_cover_every_variant_in_declaration_order() {
    fn names<T: serde::Serialize>(samples: &[T]) -> Vec<String> {
        samples.iter().map(variant_name).collect()
    }
    assert_eq!(names(&io_samples()), variant_names::<IoError>());
    assert_eq!(names(&server_samples()), variant_names::<ServerError>());
    assert_eq!(names(&backend_samples()), variant_names::<BackendError>());
    assert_eq!(
        names(&super::samples::shape_samples()),
        variant_names::<ShapeError>()
    );
    assert_eq!(names(&autodiff_samples()), variant_names::<AutodiffError>());
    assert_eq!(
        names(&super::samples::reported_samples()),
        variant_names::<cistern_client::ReportedError>()
    );
}

#[test]
fn the_card_variants_come_first_in_the_card_order() {
    let card = [
        "CudaUnavailable",
        "ShapeMismatch",
        "DeviceMismatch",
        "DeviceAllocationFailed",
        "KernelLaunchFailed",
        "DeviceUnavailable",
        "TransferFailed",
        "Unsupported",
        "StorePoisoned",
        "TapeMismatch",
        "PendingForwardUnconsumed",
        "MissingGradient",
        "InvalidArgument",
        "DeviceContextPoisoned",
        "StaleDeviceGeneration",
        "DeviceContextRetiring",
        "DeviceContextUnrecoverable",
        "DeviceContextCaptureInProgress",
    ];
    assert_eq!(variant_names::<BackendError>()[..card.len()], card);
}

#[test]
fn every_server_error_maps_to_the_variant_a_caller_acts_on() {
    let expected = vec![
        BackendError::OutOfMemory { size: 4096 },
        BackendError::KernelCompileFailed {
            kernel: "adam".into(),
            message: "expected ;".into(),
        },
        BackendError::KernelLaunchFailed("fill: queue full".into()),
        BackendError::TransferFailed("dma timeout".into()),
        BackendError::InvalidArgument("len 3, expected 4".into()),
        BackendError::InvalidProgram("binding 0 too small".into()),
        BackendError::Unsupported("f16 gemm".into()),
        BackendError::DeviceUnavailable("cuda:3: no such device".into()),
        BackendError::DeviceMismatch,
        BackendError::StaleDeviceGeneration {
            ordinal: 1,
            resource_generation: 3,
            current_generation: 4,
        },
        BackendError::DeviceContextPoisoned(poison().to_string()),
        BackendError::DeviceContextRetiring { ordinal: 1 },
        BackendError::DeviceContextUnrecoverable {
            ordinal: 1,
            probe_error: "probe mismatch".into(),
        },
        BackendError::DeviceContextCaptureInProgress { ordinal: 1 },
        BackendError::ServerPanicked {
            ordinal: 1,
            message: "index out of bounds".into(),
        },
        BackendError::ServerGone { ordinal: 1 },
        BackendError::CudaUnavailable("libcuda.so.1 not found".into()),
    ];
    let mapped: Vec<BackendError> = server_samples()
        .into_iter()
        .map(BackendError::from)
        .collect();
    assert_eq!(mapped, expected);
}

#[test]
fn every_io_error_maps_to_the_variant_a_caller_acts_on() {
    let expected = vec![
        BackendError::BufferTooBig { size: 1 << 40 },
        BackendError::OutOfMemory { size: 4096 },
        BackendError::AllocationForbidden { size: 512 },
        BackendError::OutOfMemory { size: 3 << 20 },
        BackendError::Unsupported("the backend does not support this stride pattern".into()),
        BackendError::HandleNotFound("allocation not found: already freed".into()),
        BackendError::HandleNotFound("storage handle not found: storage released".into()),
        BackendError::OutOfMemory { size: 65536 },
        BackendError::DeviceContextPoisoned(poison().to_string()),
        BackendError::Unknown("driver said no".into()),
        BackendError::Unsupported("the storage does not support this I/O operation".into()),
        BackendError::DeviceAllocationFailed(
            "the device refused 8192 bytes: mapping: CUDA_ERROR_INVALID_VALUE".into(),
        ),
    ];
    let direct: Vec<BackendError> = io_samples().into_iter().map(BackendError::from).collect();
    assert_eq!(direct, expected);
    let wrapped: Vec<BackendError> = io_samples()
        .into_iter()
        .map(|io| BackendError::from(ServerError::Io(io)))
        .collect();
    assert_eq!(wrapped, expected);
}

#[test]
fn a_poisoned_context_text_keeps_the_ordinal_generation_and_status() {
    let BackendError::DeviceContextPoisoned(text) =
        BackendError::from(ServerError::ContextPoisoned(poison()))
    else {
        panic!("not DeviceContextPoisoned");
    };
    for part in ["device 1", "generation 7", "launch fill", "illegal address"] {
        assert!(text.contains(part), "{text} lacks {part}");
    }
}

#[test]
fn a_failed_mapping_maps_as_its_source() {
    let poisoned = IoError::storage_mapping_failed(8, IoError::from(poison()));
    assert!(BackendError::from(poisoned).is_device_poisoned());
    let too_big = IoError::storage_mapping_failed(8, IoError::buffer_too_big(1 << 50));
    assert_eq!(
        BackendError::from(too_big),
        BackendError::BufferTooBig { size: 1 << 50 }
    );
    let missing = IoError::storage_mapping_failed(8, IoError::not_found(Reason::UnknownId));
    assert_eq!(
        BackendError::from(missing).code(),
        ErrorCode::HandleNotFound
    );
}

proptest! {
    #[test]
    fn conversion_keeps_the_code_and_the_helpers(error in arb_server_error()) {
        let backend = BackendError::from(error.clone());
        prop_assert_eq!(backend.code(), error.code());
        prop_assert_eq!(backend.is_transient(), error.is_transient());
        prop_assert_eq!(backend.is_device_poisoned(), error.is_device_poisoned());
    }

    #[test]
    fn io_conversion_keeps_code_poison_and_reclaim(error in arb_io_error()) {
        let backend = BackendError::from(error.clone());
        prop_assert_eq!(backend.code(), error.code());
        prop_assert_eq!(backend.is_device_poisoned(), error.is_device_poisoned());
        prop_assert_eq!(backend.may_succeed_after_reclaim(), error.may_succeed_after_reclaim());
    }

    #[test]
    fn an_autodiff_error_from_a_backend_error_keeps_its_code(error in arb_backend_error()) {
        let autodiff = AutodiffError::from(error.clone());
        prop_assert_eq!(autodiff.code(), error.code());
        prop_assert_eq!(autodiff.to_string(), error.to_string());
        prop_assert_eq!(autodiff, AutodiffError::Backend(error));
    }
}

#[test]
fn each_backend_variant_has_its_code() {
    use ErrorCode as C;
    let expected = [
        C::UnsupportedFeature,
        C::InvalidArgument,
        C::DeviceMismatch,
        C::DeviceOutOfMemory,
        C::DispatchFailed,
        C::UnsupportedFeature,
        C::TransferFailed,
        C::UnsupportedFeature,
        C::StorePoisoned,
        C::InvalidArgument,
        C::InvalidArgument,
        C::InvalidArgument,
        C::InvalidArgument,
        C::DevicePoisoned,
        C::StaleHandle,
        C::ContextBusy,
        C::DeviceLost,
        C::ContextBusy,
        C::DeviceOutOfMemory,
        C::BufferTooBig,
        C::AllocationForbidden,
        C::HandleNotFound,
        C::KernelCompileFailed,
        C::InvalidProgram,
        C::PoisonedLock,
        C::ServerGone,
        C::Unknown,
    ];
    let codes: Vec<ErrorCode> = backend_samples().iter().map(BackendError::code).collect();
    assert_eq!(codes, expected);
    assert_eq!(
        BackendError::BufferTooBig { size: 1 }.code().stable_id(),
        1010
    );
}

#[test]
fn the_helpers_have_these_truth_tables() {
    for error in backend_samples() {
        let name = variant_name(&error);
        assert_eq!(
            error.is_transient(),
            ["DeviceContextRetiring", "DeviceContextCaptureInProgress"].contains(&name.as_str()),
            "{name}"
        );
        assert_eq!(
            error.is_device_poisoned(),
            name == "DeviceContextPoisoned",
            "{name}"
        );
        assert_eq!(
            error.may_succeed_after_reclaim(),
            ["OutOfMemory", "DeviceAllocationFailed"].contains(&name.as_str()),
            "{name}"
        );
    }
}

#[test]
fn autodiff_errors_have_their_codes() {
    let codes: Vec<ErrorCode> = autodiff_samples().iter().map(AutodiffError::code).collect();
    assert_eq!(
        codes,
        [
            ErrorCode::StorePoisoned,
            ErrorCode::HandleNotFound,
            ErrorCode::InvalidArgument,
            ErrorCode::InvalidArgument,
            ErrorCode::InvalidArgument,
            ErrorCode::InvalidArgument,
        ]
    );
    let shape = ShapeError::RankMismatch {
        expected: 1,
        actual: 2,
    };
    assert_eq!(
        AutodiffError::from(shape.clone()),
        AutodiffError::ShapeMismatch(shape.clone())
    );
    assert_eq!(
        BackendError::from(shape.clone()),
        BackendError::ShapeMismatch(shape)
    );
    let server = ServerError::ContextRetiring { ordinal: 2 };
    assert_eq!(
        AutodiffError::from(server.clone()),
        AutodiffError::Backend(BackendError::from(server))
    );
}
