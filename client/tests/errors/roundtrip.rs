//! Every variant of every error type, and every report, round-trips through
//! JSON and bincode equal to itself.

use std::fmt::Debug;

use cistern_client::codec::{from_bincode, from_json_line, to_bincode, to_json_line};
use cistern_client::{AutodiffError, BackendError, ErrorReport, ReportedError, ShapeError};
use cistern_memory::IoError;
use cistern_runtime::ServerError;
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::samples::{
    autodiff_samples, backend_samples, io_samples, report_samples, reported_samples,
    server_samples, shape_samples,
};
use super::strategies::{
    arb_autodiff_error, arb_backend_error, arb_io_error, arb_report, arb_reported_error,
    arb_server_error, arb_shape_error,
};

/// Both encodings decode to `value`; returns the first failure as text.
fn round_trips<T>(value: &T) -> Result<(), String>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let line = to_json_line(value).map_err(|e| e.to_string())?;
    let from_json: T = from_json_line(&line).map_err(|e| format!("{e}: {line}"))?;
    if &from_json != value {
        return Err(format!("JSON gave {from_json:?}"));
    }
    let bytes = to_bincode(value).map_err(|e| e.to_string())?;
    let from_bytes: T = from_bincode(&bytes).map_err(|e| e.to_string())?;
    if &from_bytes != value {
        return Err(format!("bincode gave {from_bytes:?}"));
    }
    Ok(())
}

proptest! {
    #[test]
    fn any_io_error_round_trips(error in arb_io_error()) {
        prop_assert_eq!(round_trips(&error), Ok(()));
    }

    #[test]
    fn any_server_error_round_trips(error in arb_server_error()) {
        prop_assert_eq!(round_trips(&error), Ok(()));
    }

    #[test]
    fn any_backend_error_round_trips(error in arb_backend_error()) {
        prop_assert_eq!(round_trips(&error), Ok(()));
    }

    #[test]
    fn any_shape_error_round_trips(error in arb_shape_error()) {
        prop_assert_eq!(round_trips(&error), Ok(()));
    }

    #[test]
    fn any_autodiff_error_round_trips(error in arb_autodiff_error()) {
        prop_assert_eq!(round_trips(&error), Ok(()));
    }

    #[test]
    fn any_reported_error_round_trips(error in arb_reported_error()) {
        prop_assert_eq!(round_trips(&error), Ok(()));
    }

    #[test]
    fn any_report_round_trips(report in arb_report()) {
        prop_assert_eq!(round_trips(&report), Ok(()));
    }
}

fn all_round_trip<T>(samples: Vec<T>)
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    for sample in samples {
        assert_eq!(round_trips(&sample), Ok(()), "{sample:?}");
    }
}

#[test]
fn every_sample_of_every_type_round_trips() {
    all_round_trip::<IoError>(io_samples());
    all_round_trip::<ServerError>(server_samples());
    all_round_trip::<BackendError>(backend_samples());
    all_round_trip::<ShapeError>(shape_samples());
    all_round_trip::<AutodiffError>(autodiff_samples());
    all_round_trip::<ReportedError>(reported_samples());
    all_round_trip::<ErrorReport>(report_samples());
}

#[test]
fn a_report_made_now_round_trips_with_its_resolved_backtrace() {
    let poisoned = BackendError::store_poisoned(BackendError::Unknown("trap".into()));
    let report = ErrorReport::from_backend_error(&poisoned, Some(0), Some(1));
    assert_eq!(round_trips(&report), Ok(()));
    let decoded = ErrorReport::from_bincode(&report.to_bincode().unwrap_or_default());
    assert_eq!(
        decoded.map(|r| r.backtrace.text().to_string()).ok(),
        Some(report.backtrace.text().to_string())
    );
}
