//! The codec: JSON lines and length-prefixed bincode frames.

use cistern_client::codec::{
    BINCODE_LIMIT, from_bincode, read_bincode_frame, to_bincode, write_bincode_frame,
    write_json_line,
};
use cistern_client::{BackendError, CodecError, ErrorReport};
use cistern_memory::BackTrace;

use super::samples::report_samples;

#[test]
fn a_json_line_has_no_newline_even_when_the_text_does() {
    let report = ErrorReport::with_parts(
        BackendError::InvalidArgument("two\nlines\r\n".into()),
        None,
        None,
        BackTrace::from_text("0: a\n1: b\n"),
        7,
    );
    let line = report.to_json_line().unwrap_or_default();
    assert!(!line.contains('\n') && !line.contains('\r'), "{line}");
    assert_eq!(
        ErrorReport::from_json_line(&line).ok(),
        Some(report.clone())
    );
    assert_eq!(
        ErrorReport::from_json_line(&format!("{line}\r\n")).ok(),
        Some(report)
    );
}

#[test]
fn two_records_on_one_read_are_refused() {
    let line = report_samples()[0].to_json_line().unwrap_or_default();
    let two = format!("{line}\n{line}\n");
    assert!(matches!(
        ErrorReport::from_json_line(&two),
        Err(CodecError::Json { .. })
    ));
}

#[test]
fn written_json_lines_read_back_one_per_line() {
    let mut file = Vec::new();
    for report in report_samples() {
        assert!(write_json_line(&mut file, &report).is_ok());
    }
    let text = String::from_utf8(file).unwrap_or_default();
    let decoded: Vec<ErrorReport> = text
        .lines()
        .filter_map(|line| ErrorReport::from_json_line(line).ok())
        .collect();
    assert_eq!(decoded, report_samples());
}

#[test]
fn frames_read_back_in_order_then_end() {
    let mut stream = Vec::new();
    for report in report_samples() {
        assert!(report.write_bincode_frame(&mut stream).is_ok());
    }
    let mut reader = stream.as_slice();
    let mut decoded = Vec::new();
    while let Some(frame) = ErrorReport::read_bincode_frame(&mut reader) {
        match frame {
            Ok(report) => decoded.push(report),
            Err(error) => panic!("{error}"),
        }
    }
    assert_eq!(decoded, report_samples());
}

#[test]
fn a_stream_cut_inside_a_frame_reports_truncation_after_the_whole_frames() {
    let mut stream = Vec::new();
    for report in report_samples().iter().take(2) {
        assert!(report.write_bincode_frame(&mut stream).is_ok());
    }
    let whole = stream.len();
    assert!(report_samples()[2].write_bincode_frame(&mut stream).is_ok());
    for cut in [whole + 1, whole + 3, whole + 4, stream.len() - 1] {
        let mut reader = &stream[..cut];
        assert!(matches!(
            ErrorReport::read_bincode_frame(&mut reader),
            Some(Ok(_))
        ));
        assert!(matches!(
            ErrorReport::read_bincode_frame(&mut reader),
            Some(Ok(_))
        ));
        assert!(
            matches!(
                ErrorReport::read_bincode_frame(&mut reader),
                Some(Err(CodecError::TruncatedFrame))
            ),
            "cut at {cut}"
        );
    }
}

#[test]
fn a_frame_claiming_more_than_the_limit_is_refused_without_reading_it() {
    let claim = (BINCODE_LIMIT as u32 + 1).to_le_bytes();
    let mut reader = claim.as_slice();
    assert!(matches!(
        read_bincode_frame::<ErrorReport>(&mut reader),
        Some(Err(CodecError::FrameTooLarge { .. }))
    ));
    let mut reader = u32::MAX.to_le_bytes();
    let mut reader = reader.as_mut_slice() as &[u8];
    assert!(matches!(
        read_bincode_frame::<ErrorReport>(&mut reader),
        Some(Err(CodecError::FrameTooLarge { .. }))
    ));
}

#[test]
fn a_value_over_the_limit_is_not_written() {
    let huge = BackendError::InvalidArgument("x".repeat(BINCODE_LIMIT + 1));
    let mut stream = Vec::new();
    assert!(matches!(
        write_bincode_frame(&mut stream, &huge),
        Err(CodecError::FrameTooLarge { .. })
    ));
    assert!(stream.is_empty());
    // Nor read back from a plain encoding.
    let bytes = to_bincode(&huge).unwrap_or_default();
    assert!(from_bincode::<BackendError>(&bytes).is_err());
}

#[test]
fn bytes_after_a_value_are_refused() {
    let mut bytes = report_samples()[0].to_bincode().unwrap_or_default();
    bytes.push(0);
    assert!(matches!(
        ErrorReport::from_bincode(&bytes),
        Err(CodecError::TrailingBytes { extra: 1 })
    ));
}

#[test]
fn an_empty_stream_has_no_frames() {
    let mut reader: &[u8] = &[];
    assert!(read_bincode_frame::<ErrorReport>(&mut reader).is_none());
}
