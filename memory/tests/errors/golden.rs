//! Golden bytes: the bincode layout of every variant is pinned by
//! `tests/fixtures/golden.txt`, so reordering variants or fields fails here.
//! `CISTERN_BLESS=1 cargo test -p cistern-memory --test errors` rewrites it.

use std::path::PathBuf;

use cistern_memory::{BackTrace, ErrorCode, Reason};

use super::samples::{io_samples, poison, to_bincode, variant_name};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden.txt")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn current() -> Vec<(String, String)> {
    let mut entries = Vec::new();
    for error in io_samples() {
        entries.push((
            format!("IoError::{}", variant_name(&error)),
            hex(&to_bincode(&error)),
        ));
    }
    for reason in [
        Reason::UnknownId,
        Reason::AlreadyFreed,
        Reason::OtherDevice,
        Reason::StorageReleased,
    ] {
        entries.push((format!("Reason::{reason:?}"), hex(&to_bincode(&reason))));
    }
    entries.push(("DevicePoison".into(), hex(&to_bincode(&poison()))));
    entries.push((
        "BackTrace::none".into(),
        hex(&to_bincode(&BackTrace::none())),
    ));
    entries.push((
        "BackTrace::from_text".into(),
        hex(&to_bincode(&BackTrace::from_text("0: main\n"))),
    ));
    for code in ErrorCode::ALL {
        entries.push((
            format!("ErrorCode::{}", code.name()),
            hex(&to_bincode(&code)),
        ));
    }
    entries
}

#[test]
fn the_bincode_layout_matches_the_golden_fixture() {
    let entries = current();
    let rendered: String = entries
        .iter()
        .map(|(name, bytes)| format!("{name} {bytes}\n"))
        .collect();
    if std::env::var_os("CISTERN_BLESS").is_some_and(|v| v == "1") {
        if let Err(error) = std::fs::write(fixture(), &rendered) {
            panic!("writing {}: {error}", fixture().display());
        }
        return;
    }
    let stored = match std::fs::read_to_string(fixture()) {
        Ok(text) => text,
        Err(error) => panic!(
            "{}: {error}; run with CISTERN_BLESS=1 to create it",
            fixture().display()
        ),
    };
    let stored: Vec<(String, String)> = stored
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let (name, bytes) = line.split_once(' ').unwrap_or((line, ""));
            (name.to_string(), bytes.to_string())
        })
        .collect();
    let differences: Vec<String> = entries
        .iter()
        .zip(stored.iter())
        .filter(|(now, then)| now != then)
        .map(|(now, then)| format!("now {} {}, fixture {} {}", now.0, now.1, then.0, then.1))
        .collect();
    assert!(
        differences.is_empty(),
        "the bincode layout changed (new variants go last):\n{}",
        differences.join("\n")
    );
    assert_eq!(entries.len(), stored.len(), "entries added or removed");
}
