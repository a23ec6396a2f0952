//! Every value round-trips through JSON and bincode equal to itself.

use cistern_memory::{BackTrace, DevicePoison, ErrorCode, IoError, Reason};
use proptest::prelude::*;

use super::samples::{arb_io_error, arb_poison, arb_reason, from_bincode, io_samples, to_bincode};

fn json<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> Result<T, String> {
    let text = serde_json::to_string(value).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

proptest! {
    #[test]
    fn any_io_error_round_trips_through_json(error in arb_io_error()) {
        prop_assert_eq!(json(&error), Ok(error));
    }

    #[test]
    fn any_io_error_round_trips_through_bincode(error in arb_io_error()) {
        prop_assert_eq!(from_bincode::<IoError>(&to_bincode(&error)), Ok(error));
    }

    #[test]
    fn any_poison_and_reason_round_trip(poison in arb_poison(), reason in arb_reason()) {
        prop_assert_eq!(json(&poison), Ok(poison.clone()));
        prop_assert_eq!(from_bincode::<DevicePoison>(&to_bincode(&poison)), Ok(poison));
        prop_assert_eq!(from_bincode::<Reason>(&to_bincode(&reason)), Ok(reason));
    }

    #[test]
    fn any_stable_code_round_trips(index in 0..ErrorCode::ALL.len()) {
        let code = ErrorCode::ALL[index];
        prop_assert_eq!(json(&code), Ok(code));
        prop_assert_eq!(from_bincode::<ErrorCode>(&to_bincode(&code)), Ok(code));
    }
}

#[test]
fn every_sample_round_trips_through_both_encodings() {
    for error in io_samples() {
        assert_eq!(json(&error), Ok(error.clone()));
        assert_eq!(from_bincode::<IoError>(&to_bincode(&error)), Ok(error));
    }
}

#[test]
fn a_captured_error_round_trips_with_its_resolved_frames() {
    let error = IoError::out_of_memory(64);
    let decoded: Result<IoError, _> = from_bincode(&to_bincode(&error));
    assert_eq!(decoded.as_ref(), Ok(&error));
    let decoded_trace = decoded.map(|e| e.backtrace().clone()).unwrap_or_default();
    assert_eq!(
        decoded_trace,
        BackTrace::from_text(error.backtrace().text())
    );
}
