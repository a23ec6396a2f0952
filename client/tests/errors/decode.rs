//! Malformed input decodes to a `CodecError`: never a panic, and never an
//! allocation beyond the limit.

use cistern_client::codec::{BINCODE_LIMIT, from_bincode, read_bincode_frame, to_bincode};
use cistern_client::{
    AutodiffError, BackendError, CodecError, ErrorReport, ReportedError, ShapeError,
};
use cistern_memory::IoError;
use cistern_runtime::ServerError;
use proptest::prelude::*;

use super::samples::{backend_samples, report_samples, server_samples};
use super::strategies::{arb_backend_error, arb_report, arb_server_error};

fn decode_as_everything(bytes: &[u8]) {
    let _ = from_bincode::<IoError>(bytes);
    let _ = from_bincode::<ServerError>(bytes);
    let _ = from_bincode::<BackendError>(bytes);
    let _ = from_bincode::<ShapeError>(bytes);
    let _ = from_bincode::<AutodiffError>(bytes);
    let _ = from_bincode::<ReportedError>(bytes);
    let _ = from_bincode::<ErrorReport>(bytes);
    let text = String::from_utf8_lossy(bytes);
    let _ = ErrorReport::from_json_line(&text);
    let _ = cistern_client::codec::from_json_line::<BackendError>(&text);
}

fn every_truncation_fails<T>(bytes: &[u8]) -> Result<(), String>
where
    T: serde::de::DeserializeOwned + std::fmt::Debug,
{
    for end in 0..bytes.len() {
        if let Ok(value) = from_bincode::<T>(&bytes[..end]) {
            return Err(format!("prefix of {end} bytes decoded to {value:?}"));
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn random_bytes_decode_to_an_error_or_a_value_never_a_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..512)
    ) {
        decode_as_everything(&bytes);
    }

    #[test]
    fn a_valid_prefix_with_random_tail_never_panics(
        report in arb_report(),
        tail in proptest::collection::vec(any::<u8>(), 0..32),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = to_bincode(&report).map_err(|e| TestCaseError::fail(e.to_string()))?;
        bytes.truncate(cut.index(bytes.len() + 1));
        bytes.extend(tail);
        decode_as_everything(&bytes);
    }

    #[test]
    fn every_truncation_of_a_report_is_an_error(report in arb_report()) {
        let bytes = to_bincode(&report).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(every_truncation_fails::<ErrorReport>(&bytes), Ok(()));
    }

    #[test]
    fn every_truncation_of_a_backend_or_server_error_is_an_error(
        backend in arb_backend_error(),
        server in arb_server_error(),
    ) {
        let backend = to_bincode(&backend).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(every_truncation_fails::<BackendError>(&backend), Ok(()));
        let server = to_bincode(&server).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(every_truncation_fails::<ServerError>(&server), Ok(()));
    }

    #[test]
    fn a_random_stream_of_frames_ends_or_errs_never_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..512)
    ) {
        let mut reader = bytes.as_slice();
        let mut frames = 0;
        while let Some(frame) = read_bincode_frame::<ErrorReport>(&mut reader) {
            frames += 1;
            if frame.is_err() || frames > bytes.len() {
                break;
            }
        }
    }
}

#[test]
fn every_truncation_of_every_sample_is_an_error() {
    for sample in backend_samples() {
        let bytes = to_bincode(&sample).unwrap_or_default();
        assert_eq!(every_truncation_fails::<BackendError>(&bytes), Ok(()));
    }
    for sample in server_samples() {
        let bytes = to_bincode(&sample).unwrap_or_default();
        assert_eq!(every_truncation_fails::<ServerError>(&bytes), Ok(()));
    }
    for sample in report_samples() {
        let bytes = to_bincode(&sample).unwrap_or_default();
        assert_eq!(every_truncation_fails::<ErrorReport>(&bytes), Ok(()));
    }
}

#[test]
fn a_length_beyond_the_limit_is_refused_before_allocating() {
    // BackendError::CudaUnavailable (variant 0) whose text claims u64::MAX bytes.
    let mut bytes = vec![0u8, 0xfd];
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        from_bincode::<BackendError>(&bytes),
        Err(CodecError::Bincode { .. })
    ));
    // Just over the limit, with no bytes behind it.
    let mut bytes = vec![0u8, 0xfc];
    bytes.extend_from_slice(&(BINCODE_LIMIT as u32 + 1).to_le_bytes());
    assert!(from_bincode::<BackendError>(&bytes).is_err());
}

#[test]
fn an_unknown_variant_index_is_an_error() {
    let past_the_end = backend_samples().len() as u8;
    assert!(from_bincode::<BackendError>(&[past_the_end]).is_err());
    assert!(from_bincode::<ServerError>(&[200]).is_err());
}

#[test]
fn an_unknown_code_id_in_a_report_is_an_error() {
    let mut json = report_samples()[0].to_json_line().unwrap_or_default();
    let id = report_samples()[0].stable_id.to_string();
    json = json.replacen(&format!("\"code\":{id}"), "\"code\":4242", 1);
    assert!(json.contains("4242"));
    assert!(matches!(
        ErrorReport::from_json_line(&json),
        Err(CodecError::Json { .. })
    ));
}
