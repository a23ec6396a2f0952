//! One deterministic sample of every variant of every error type, with
//! fixed backtraces so their bytes never change.

use cistern_client::{AutodiffError, BackendError, ErrorReport, ReportedError, ShapeError};
use cistern_memory::{BackTrace, DevicePoison, IoError, Reason};
use cistern_runtime::ServerError;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The variant names of `T` in declaration order, as serde's
/// unknown-variant message lists them; samples compared against this list
/// fail when a variant is added without one.
pub fn variant_names<T: DeserializeOwned + std::fmt::Debug>() -> Vec<String> {
    let message = match serde_json::from_str::<T>("\"__no_such_variant__\"") {
        Ok(value) => panic!("decoded a variant that does not exist: {value:?}"),
        Err(error) => error.to_string(),
    };
    let Some((_, listed)) = message.split_once("expected one of ") else {
        panic!("unexpected serde message: {message}");
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

pub fn trace() -> BackTrace {
    BackTrace::from_text("0: reserve\n1: main\n")
}

pub fn poison() -> DevicePoison {
    DevicePoison {
        ordinal: 1,
        generation: 7,
        operation: "launch fill".into(),
        status: "illegal address".into(),
        backtrace: BackTrace::from_text("0: fill\n"),
    }
}

pub fn io_samples() -> Vec<IoError> {
    vec![
        IoError::BufferTooBig {
            size: 1 << 40,
            backtrace: trace(),
        },
        IoError::OutOfMemory {
            size: 4096,
            backtrace: trace(),
        },
        IoError::PageUpdateForbidden {
            size: 512,
            backtrace: trace(),
        },
        IoError::PageSizesExhausted {
            size: 3 << 20,
            backtrace: trace(),
        },
        IoError::UnsupportedStrides { backtrace: trace() },
        IoError::NotFound {
            backtrace: trace(),
            reason: Reason::AlreadyFreed,
        },
        IoError::StorageHandleNotFound {
            reason: Reason::StorageReleased,
            backtrace: trace(),
        },
        IoError::StorageMappingFailed {
            size: 65536,
            source: Box::new(IoError::OutOfMemory {
                size: 65536,
                backtrace: BackTrace::none(),
            }),
            backtrace: trace(),
        },
        IoError::DevicePoisoned(poison()),
        IoError::Unknown {
            description: "driver said no".into(),
            backtrace: trace(),
        },
        IoError::UnsupportedIoOperation { backtrace: trace() },
        IoError::AllocationFailed {
            size: 8192,
            reason: "mapping: CUDA_ERROR_INVALID_VALUE".into(),
            backtrace: trace(),
        },
    ]
}

pub fn server_samples() -> Vec<ServerError> {
    vec![
        ServerError::Io(IoError::OutOfMemory {
            size: 4096,
            backtrace: trace(),
        }),
        ServerError::KernelCompileFailed {
            kernel: "adam".into(),
            message: "expected ;".into(),
        },
        ServerError::KernelLaunchFailed {
            kernel: "fill".into(),
            message: "queue full".into(),
        },
        ServerError::TransferFailed {
            message: "dma timeout".into(),
        },
        ServerError::InvalidArgument {
            message: "len 3, expected 4".into(),
        },
        ServerError::InvalidProgram {
            message: "binding 0 too small".into(),
        },
        ServerError::UnsupportedOperation {
            operation: "f16 gemm".into(),
        },
        ServerError::DeviceUnavailable {
            device: "cuda:3".into(),
            reason: "no such device".into(),
        },
        ServerError::DeviceMismatch {
            expected: "cpu:0".into(),
            found: "cpu:1".into(),
        },
        ServerError::StaleGeneration {
            ordinal: 1,
            resource_generation: 3,
            current_generation: 4,
        },
        ServerError::ContextPoisoned(poison()),
        ServerError::ContextRetiring { ordinal: 1 },
        ServerError::ContextUnrecoverable {
            ordinal: 1,
            probe_error: "probe mismatch".into(),
        },
        ServerError::CaptureInProgress { ordinal: 1 },
        ServerError::ServerPanicked {
            ordinal: 1,
            message: "index out of bounds".into(),
        },
        ServerError::ServerGone { ordinal: 1 },
        ServerError::CudaUnavailable {
            reason: "libcuda.so.1 not found".into(),
        },
    ]
}

pub fn shape_samples() -> Vec<ShapeError> {
    vec![
        ShapeError::ElementCountMismatch {
            expected: 12,
            actual: 10,
        },
        ShapeError::RankMismatch {
            expected: 2,
            actual: 3,
        },
        ShapeError::ElementCountOverflow {
            dims: vec![usize::MAX, 2],
        },
        ShapeError::DimensionMismatch {
            axis: 1,
            expected: 64,
            actual: 32,
        },
        ShapeError::AxisOutOfRange { axis: 4, rank: 2 },
    ]
}

pub fn backend_samples() -> Vec<BackendError> {
    vec![
        BackendError::CudaUnavailable("libcuda.so not found".into()),
        BackendError::ShapeMismatch(ShapeError::RankMismatch {
            expected: 2,
            actual: 1,
        }),
        BackendError::DeviceMismatch,
        BackendError::DeviceAllocationFailed("cuMemAlloc: 2".into()),
        BackendError::KernelLaunchFailed("fill: queue full".into()),
        BackendError::DeviceUnavailable("cuda:3: no such device".into()),
        BackendError::TransferFailed("dma timeout".into()),
        BackendError::Unsupported("f16 gemm".into()),
        BackendError::store_poisoned(BackendError::KernelLaunchFailed("adam: trap".into())),
        BackendError::TapeMismatch,
        BackendError::PendingForwardUnconsumed,
        BackendError::MissingGradient("slot 3".into()),
        BackendError::InvalidArgument("lr must be positive".into()),
        BackendError::DeviceContextPoisoned("device 1 poisoned".into()),
        BackendError::StaleDeviceGeneration {
            ordinal: 1,
            resource_generation: 3,
            current_generation: 4,
        },
        BackendError::DeviceContextRetiring { ordinal: 1 },
        BackendError::DeviceContextUnrecoverable {
            ordinal: 1,
            probe_error: "probe mismatch".into(),
        },
        BackendError::DeviceContextCaptureInProgress { ordinal: 1 },
        BackendError::OutOfMemory { size: 4096 },
        BackendError::BufferTooBig { size: 1 << 40 },
        BackendError::AllocationForbidden { size: 512 },
        BackendError::HandleNotFound("allocation not found: already freed".into()),
        BackendError::KernelCompileFailed {
            kernel: "adam".into(),
            message: "expected ;".into(),
        },
        BackendError::InvalidProgram("binding 0 too small".into()),
        BackendError::ServerPanicked {
            ordinal: 1,
            message: "index out of bounds".into(),
        },
        BackendError::ServerGone { ordinal: 1 },
        BackendError::Unknown("driver said no".into()),
    ]
}

pub fn autodiff_samples() -> Vec<AutodiffError> {
    vec![
        AutodiffError::Backend(BackendError::store_poisoned(
            BackendError::DeviceContextPoisoned("device 1 poisoned".into()),
        )),
        AutodiffError::UnknownVar { var: 42 },
        AutodiffError::ShapeMismatch(ShapeError::ElementCountMismatch {
            expected: 4,
            actual: 5,
        }),
        AutodiffError::TapeMismatch,
        AutodiffError::GradientTrackingDisabled,
        AutodiffError::InvalidArgument("backward needs a scalar loss".into()),
    ]
}

pub fn reported_samples() -> Vec<ReportedError> {
    vec![
        ReportedError::Io(io_samples()[7].clone()),
        ReportedError::Server(ServerError::ContextPoisoned(poison())),
        ReportedError::Backend(BackendError::StaleDeviceGeneration {
            ordinal: 1,
            resource_generation: 3,
            current_generation: 4,
        }),
        ReportedError::Autodiff(AutodiffError::UnknownVar { var: 42 }),
    ]
}

/// A report of each carried-error kind, with fixed time and trace.
pub fn report_samples() -> Vec<ErrorReport> {
    let time = 1_700_000_000_123_456_789;
    reported_samples()
        .into_iter()
        .enumerate()
        .map(|(index, error)| {
            let ordinal = (index % 2 == 0).then_some(index);
            ErrorReport::with_parts(error, ordinal, None, trace(), time + index as u64)
        })
        .collect()
}
