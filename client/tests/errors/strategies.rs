//! Proptest strategies that reach every variant of every error type.

use cistern_client::{AutodiffError, BackendError, ErrorReport, ReportedError, ShapeError};
use cistern_memory::{BackTrace, DevicePoison, IoError, Reason};
use cistern_runtime::ServerError;
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    ".{0,16}"
}

pub fn arb_backtrace() -> impl Strategy<Value = BackTrace> {
    prop_oneof![
        Just(BackTrace::none()),
        text().prop_map(BackTrace::from_text),
        "([a-z_:]{1,12}\n){1,4}".prop_map(BackTrace::from_text),
    ]
}

fn arb_reason() -> impl Strategy<Value = Reason> {
    prop_oneof![
        Just(Reason::UnknownId),
        Just(Reason::AlreadyFreed),
        Just(Reason::OtherDevice),
        Just(Reason::StorageReleased),
    ]
}

fn arb_poison() -> impl Strategy<Value = DevicePoison> {
    (
        any::<usize>(),
        any::<u64>(),
        text(),
        text(),
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
    let size = || any::<u64>();
    let leaf = prop_oneof![
        (size(), arb_backtrace())
            .prop_map(|(size, backtrace)| IoError::BufferTooBig { size, backtrace }),
        (size(), arb_backtrace())
            .prop_map(|(size, backtrace)| IoError::OutOfMemory { size, backtrace }),
        (size(), arb_backtrace())
            .prop_map(|(size, backtrace)| IoError::PageUpdateForbidden { size, backtrace }),
        (size(), arb_backtrace())
            .prop_map(|(size, backtrace)| IoError::PageSizesExhausted { size, backtrace }),
        arb_backtrace().prop_map(|backtrace| IoError::UnsupportedStrides { backtrace }),
        (arb_backtrace(), arb_reason())
            .prop_map(|(backtrace, reason)| IoError::NotFound { backtrace, reason }),
        (arb_reason(), arb_backtrace())
            .prop_map(|(reason, backtrace)| IoError::StorageHandleNotFound { reason, backtrace }),
        arb_poison().prop_map(IoError::DevicePoisoned),
        (text(), arb_backtrace()).prop_map(|(description, backtrace)| IoError::Unknown {
            description,
            backtrace
        }),
        arb_backtrace().prop_map(|backtrace| IoError::UnsupportedIoOperation { backtrace }),
        (any::<u64>(), text(), arb_backtrace()).prop_map(|(size, reason, backtrace)| {
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

pub fn arb_server_error() -> impl Strategy<Value = ServerError> {
    let ordinal = || any::<usize>();
    prop_oneof![
        arb_io_error().prop_map(ServerError::Io),
        (text(), text())
            .prop_map(|(kernel, message)| ServerError::KernelCompileFailed { kernel, message }),
        (text(), text())
            .prop_map(|(kernel, message)| ServerError::KernelLaunchFailed { kernel, message }),
        text().prop_map(|message| ServerError::TransferFailed { message }),
        text().prop_map(|message| ServerError::InvalidArgument { message }),
        text().prop_map(|message| ServerError::InvalidProgram { message }),
        text().prop_map(|operation| ServerError::UnsupportedOperation { operation }),
        (text(), text())
            .prop_map(|(device, reason)| ServerError::DeviceUnavailable { device, reason }),
        (text(), text())
            .prop_map(|(expected, found)| ServerError::DeviceMismatch { expected, found }),
        (ordinal(), any::<u64>(), any::<u64>()).prop_map(|(ordinal, made, now)| {
            ServerError::StaleGeneration {
                ordinal,
                resource_generation: made,
                current_generation: now,
            }
        }),
        arb_poison().prop_map(ServerError::ContextPoisoned),
        ordinal().prop_map(|ordinal| ServerError::ContextRetiring { ordinal }),
        (ordinal(), text()).prop_map(|(ordinal, probe_error)| {
            ServerError::ContextUnrecoverable {
                ordinal,
                probe_error,
            }
        }),
        ordinal().prop_map(|ordinal| ServerError::CaptureInProgress { ordinal }),
        (ordinal(), text())
            .prop_map(|(ordinal, message)| ServerError::ServerPanicked { ordinal, message }),
        ordinal().prop_map(|ordinal| ServerError::ServerGone { ordinal }),
        text().prop_map(|reason| ServerError::CudaUnavailable { reason }),
    ]
}

pub fn arb_shape_error() -> impl Strategy<Value = ShapeError> {
    let n = || any::<usize>();
    prop_oneof![
        (n(), n())
            .prop_map(|(expected, actual)| ShapeError::ElementCountMismatch { expected, actual }),
        (n(), n()).prop_map(|(expected, actual)| ShapeError::RankMismatch { expected, actual }),
        proptest::collection::vec(n(), 0..6)
            .prop_map(|dims| ShapeError::ElementCountOverflow { dims }),
        (n(), n(), n()).prop_map(|(axis, expected, actual)| ShapeError::DimensionMismatch {
            axis,
            expected,
            actual
        }),
        (n(), n()).prop_map(|(axis, rank)| ShapeError::AxisOutOfRange { axis, rank }),
    ]
}

pub fn arb_backend_error() -> impl Strategy<Value = BackendError> {
    let ordinal = || any::<usize>();
    let size = || any::<u64>();
    prop_oneof![
        text().prop_map(BackendError::CudaUnavailable),
        arb_shape_error().prop_map(BackendError::ShapeMismatch),
        Just(BackendError::DeviceMismatch),
        text().prop_map(BackendError::DeviceAllocationFailed),
        text().prop_map(BackendError::KernelLaunchFailed),
        text().prop_map(BackendError::DeviceUnavailable),
        text().prop_map(BackendError::TransferFailed),
        text().prop_map(BackendError::Unsupported),
        text().prop_map(|message| {
            BackendError::store_poisoned(BackendError::KernelLaunchFailed(message))
        }),
        Just(BackendError::TapeMismatch),
        Just(BackendError::PendingForwardUnconsumed),
        text().prop_map(BackendError::MissingGradient),
        text().prop_map(BackendError::InvalidArgument),
        text().prop_map(BackendError::DeviceContextPoisoned),
        (ordinal(), any::<u64>(), any::<u64>()).prop_map(|(ordinal, made, now)| {
            BackendError::StaleDeviceGeneration {
                ordinal,
                resource_generation: made,
                current_generation: now,
            }
        }),
        ordinal().prop_map(|ordinal| BackendError::DeviceContextRetiring { ordinal }),
        (ordinal(), text()).prop_map(|(ordinal, probe_error)| {
            BackendError::DeviceContextUnrecoverable {
                ordinal,
                probe_error,
            }
        }),
        ordinal().prop_map(|ordinal| BackendError::DeviceContextCaptureInProgress { ordinal }),
        size().prop_map(|size| BackendError::OutOfMemory { size }),
        size().prop_map(|size| BackendError::BufferTooBig { size }),
        size().prop_map(|size| BackendError::AllocationForbidden { size }),
        text().prop_map(BackendError::HandleNotFound),
        (text(), text())
            .prop_map(|(kernel, message)| BackendError::KernelCompileFailed { kernel, message }),
        text().prop_map(BackendError::InvalidProgram),
        (ordinal(), text())
            .prop_map(|(ordinal, message)| BackendError::ServerPanicked { ordinal, message }),
        ordinal().prop_map(|ordinal| BackendError::ServerGone { ordinal }),
        text().prop_map(BackendError::Unknown),
    ]
}

pub fn arb_autodiff_error() -> impl Strategy<Value = AutodiffError> {
    prop_oneof![
        arb_backend_error().prop_map(AutodiffError::Backend),
        any::<u64>().prop_map(|var| AutodiffError::UnknownVar { var }),
        arb_shape_error().prop_map(AutodiffError::ShapeMismatch),
        Just(AutodiffError::TapeMismatch),
        Just(AutodiffError::GradientTrackingDisabled),
        text().prop_map(AutodiffError::InvalidArgument),
    ]
}

pub fn arb_reported_error() -> impl Strategy<Value = ReportedError> {
    prop_oneof![
        arb_io_error().prop_map(ReportedError::Io),
        arb_server_error().prop_map(ReportedError::Server),
        arb_backend_error().prop_map(ReportedError::Backend),
        arb_autodiff_error().prop_map(ReportedError::Autodiff),
    ]
}

pub fn arb_report() -> impl Strategy<Value = ErrorReport> {
    (
        arb_reported_error(),
        proptest::option::of(any::<usize>()),
        proptest::option::of(any::<u64>()),
        arb_backtrace(),
        any::<u64>(),
    )
        .prop_map(|(error, ordinal, generation, backtrace, time)| {
            ErrorReport::with_parts(error, ordinal, generation, backtrace, time)
        })
}
