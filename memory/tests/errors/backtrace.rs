//! `BackTrace`: compared by text, resolved when serialized, switchable off.

use std::process::Command;

use cistern_memory::BackTrace;

use super::samples::{from_bincode, to_bincode};

#[test]
fn backtraces_are_equal_when_their_text_is() {
    assert_eq!(
        BackTrace::from_text("a\nb\n"),
        BackTrace::from_text("a\nb\n")
    );
    assert_ne!(BackTrace::from_text("a\n"), BackTrace::from_text("b\n"));
    assert_eq!(BackTrace::none(), BackTrace::from_text(""));
    assert_eq!(BackTrace::default(), BackTrace::none());
    let captured = BackTrace::capture();
    assert_eq!(captured, BackTrace::from_text(captured.text()));
}

#[test]
fn serializing_a_captured_trace_resolves_its_frames() {
    let captured = BackTrace::capture();
    if captured.is_empty() {
        // Capture is switched off in this environment; the switch is tested below.
        return;
    }
    let json = serde_json::to_string(&captured).unwrap_or_default();
    let decoded: BackTrace = serde_json::from_str(&json).unwrap_or_default();
    assert!(
        decoded.text().contains("BackTrace::capture"),
        "{}",
        decoded.text()
    );
    assert_eq!(decoded, captured);
    assert_eq!(
        from_bincode::<BackTrace>(&to_bincode(&captured)),
        Ok(captured.clone())
    );
    assert_eq!(captured.to_string(), captured.text());
}

#[test]
fn debug_never_resolves_but_shows_known_text() {
    let known = BackTrace::from_text("frame one\n");
    assert!(format!("{known:?}").contains("frame one"));
    let captured = BackTrace::capture();
    if !captured.is_empty() {
        assert!(format!("{captured:?}").contains("unresolved_frames"));
    }
}

/// Runs in a child process with `CISTERN_BACKTRACE=0`; ignored otherwise.
#[test]
#[ignore = "run by capture_can_be_switched_off_by_the_environment"]
fn capture_is_empty_in_this_process() {
    if std::env::var("CISTERN_BACKTRACE").as_deref() != Ok("0") {
        // Run by hand with `--ignored`: nothing to check in this process.
        return;
    }
    assert!(BackTrace::capture().is_empty());
    assert_eq!(BackTrace::capture().text(), "");
}

#[test]
fn capture_can_be_switched_off_by_the_environment() {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => panic!("no test binary path: {error}"),
    };
    let status = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "errors::backtrace::capture_is_empty_in_this_process",
        ])
        .env("CISTERN_BACKTRACE", "0")
        .output();
    let output = match status {
        Ok(output) => output,
        Err(error) => panic!("could not run the test binary: {error}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("1 passed"), "{stdout}");
}

#[test]
fn the_switch_and_its_default_are_documented() {
    let source = include_str!("../../src/trace.rs");
    assert!(source.contains("`CISTERN_BACKTRACE=0`"));
    assert!(source.contains("Capture is on by default"));
}
