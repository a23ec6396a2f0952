//! `ErrorReport`: what a report records about each kind of error.

use cistern_client::{AutodiffError, BackendError, ErrorCode, ErrorReport, ReportedError};
use cistern_memory::{BackTrace, IoError};
use cistern_runtime::ServerError;

use super::samples::{poison, trace};

#[test]
fn a_report_records_the_code_its_id_and_the_message() {
    let error = ServerError::InvalidArgument {
        message: "lr".into(),
    };
    let report = ErrorReport::from_server_error(&error, Some(2), Some(9));
    assert_eq!(report.code, ErrorCode::InvalidArgument);
    assert_eq!(report.stable_id, 1014);
    assert_eq!(report.message, error.to_string());
    assert_eq!(report.error, ReportedError::Server(error));
    assert_eq!((report.ordinal, report.generation), (Some(2), Some(9)));
    assert!(report.unix_nanos > 0);
}

#[test]
fn the_message_follows_the_source_chain() {
    let io = IoError::storage_mapping_failed(64, IoError::out_of_memory(64));
    let report = ErrorReport::from_io_error(&io, None, None);
    assert_eq!(
        report.message,
        "mapping storage for 64 bytes failed: out of memory reserving 64 bytes"
    );
    assert_eq!(report.code, ErrorCode::DeviceOutOfMemory);
}

#[test]
fn a_report_keeps_the_backtrace_the_error_carries() {
    let io = IoError::OutOfMemory {
        size: 1,
        backtrace: trace(),
    };
    assert_eq!(
        ErrorReport::from_io_error(&io, None, None).backtrace,
        trace()
    );
    let server = ServerError::from(io);
    assert_eq!(
        ErrorReport::from_server_error(&server, None, None).backtrace,
        trace()
    );
    let poisoned = ServerError::ContextPoisoned(poison());
    assert_eq!(
        ErrorReport::from_server_error(&poisoned, None, None).backtrace,
        poison().backtrace
    );
}

#[test]
fn a_poisoned_report_names_the_device_and_generation_of_the_fault() {
    let report =
        ErrorReport::from_server_error(&ServerError::ContextPoisoned(poison()), None, None);
    assert_eq!((report.ordinal, report.generation), (Some(1), Some(7)));
    // What the caller passes wins over what the error names.
    let report =
        ErrorReport::from_server_error(&ServerError::ContextPoisoned(poison()), Some(5), None);
    assert_eq!((report.ordinal, report.generation), (Some(5), Some(7)));
}

#[test]
fn a_poisoned_backend_error_gives_the_generation_to_invalidate() {
    let error = BackendError::from(ServerError::ContextPoisoned(poison()));
    assert_eq!(error.poisoned_generation(), Some(7));
    assert_eq!(error.poisoned_ordinal(), Some(1));
    let report = ErrorReport::from_backend_error(&error, None, None);
    assert_eq!((report.ordinal, report.generation), (Some(1), Some(7)));
    let through_autodiff = AutodiffError::from(error);
    let report = ErrorReport::from_autodiff_error(&through_autodiff, None, None);
    assert_eq!((report.ordinal, report.generation), (Some(1), Some(7)));
    let other = BackendError::DeviceContextPoisoned("not a poison's message".into());
    assert_eq!(other.poisoned_generation(), None);
    let latched = BackendError::store_poisoned(BackendError::Unknown("trap".into()));
    assert_eq!(latched.poisoned_generation(), None);
}

#[test]
fn a_latched_store_report_names_its_cause_and_the_device_the_cause_names() {
    let cause = BackendError::from(ServerError::ContextPoisoned(poison()));
    let latched = BackendError::store_poisoned(cause.clone());
    let report = ErrorReport::from_backend_error(&latched, None, None);
    assert_eq!(report.code, ErrorCode::StorePoisoned);
    assert!(
        report.message.contains(&cause.to_string()),
        "{}",
        report.message
    );
    assert_eq!((report.ordinal, report.generation), (Some(1), Some(7)));
    let through_autodiff = AutodiffError::from(latched);
    let report = ErrorReport::from_autodiff_error(&through_autodiff, None, None);
    assert_eq!((report.ordinal, report.generation), (Some(1), Some(7)));
}

#[test]
fn a_stale_handle_report_names_the_current_generation() {
    let error = BackendError::StaleDeviceGeneration {
        ordinal: 3,
        resource_generation: 1,
        current_generation: 2,
    };
    let report = ErrorReport::from_backend_error(&error, None, None);
    assert_eq!((report.ordinal, report.generation), (Some(3), Some(2)));
    assert_eq!(report.code, ErrorCode::StaleHandle);
}

#[test]
fn an_error_without_a_device_reports_none() {
    let report =
        ErrorReport::from_autodiff_error(&AutodiffError::UnknownVar { var: 1 }, None, None);
    assert_eq!((report.ordinal, report.generation), (None, None));
    assert_eq!(report.code, ErrorCode::HandleNotFound);
}

#[test]
fn parts_make_a_deterministic_report() {
    let make = || {
        ErrorReport::with_parts(
            BackendError::store_poisoned(BackendError::Unknown("trap".into())),
            Some(0),
            Some(1),
            BackTrace::from_text("x\n"),
            42,
        )
    };
    assert_eq!(make(), make());
    assert_eq!(make().to_bincode().ok(), make().to_bincode().ok());
    assert_eq!(
        make().to_string(),
        "[StorePoisoned (1017)] the parameter store is poisoned by an earlier device failure: \
         unknown device error: trap; rebuild it from the last host copy (device 0, generation 1)"
    );
}

#[test]
fn the_json_line_spells_out_the_stable_id() {
    let report = ErrorReport::with_parts(
        BackendError::BufferTooBig { size: 9 },
        None,
        None,
        BackTrace::none(),
        1,
    );
    let line = report.to_json_line().unwrap_or_default();
    assert!(
        line.starts_with("{\"code\":1010,\"stable_id\":1010,"),
        "{line}"
    );
}
