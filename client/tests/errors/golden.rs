//! Golden bytes: the bincode layout of every variant of every client-side
//! type is pinned by `tests/fixtures/golden.txt`, so reordering variants or
//! fields fails here. `CISTERN_BLESS=1 cargo test -p cistern-client --test
//! errors golden` rewrites the fixture after an intended change.

use std::path::PathBuf;

use cistern_client::codec::to_bincode;
use serde::Serialize;

use super::samples::{
    autodiff_samples, backend_samples, report_samples, reported_samples, server_samples,
    shape_samples, variant_name,
};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden.txt")
}

fn hex<T: Serialize>(value: &T) -> String {
    match to_bincode(value) {
        Ok(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        Err(error) => panic!("encoding failed: {error}"),
    }
}

fn named<T: Serialize>(kind: &str, samples: Vec<T>) -> Vec<(String, String)> {
    samples
        .iter()
        .map(|sample| (format!("{kind}::{}", variant_name(sample)), hex(sample)))
        .collect()
}

fn current() -> Vec<(String, String)> {
    let mut entries = Vec::new();
    entries.extend(named("ServerError", server_samples()));
    entries.extend(named("BackendError", backend_samples()));
    entries.extend(named("ShapeError", shape_samples()));
    entries.extend(named("AutodiffError", autodiff_samples()));
    entries.extend(named("ReportedError", reported_samples()));
    for (index, report) in report_samples().iter().enumerate() {
        entries.push((format!("ErrorReport::{index}"), hex(report)));
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
        .map(|(now, then)| format!("now {} {}\n  fixture {} {}", now.0, now.1, then.0, then.1))
        .collect();
    assert!(
        differences.is_empty(),
        "the bincode layout changed (new variants and fields go last):\n{}",
        differences.join("\n")
    );
    assert_eq!(entries.len(), stored.len(), "entries added or removed");
}

#[test]
fn the_golden_fixture_decodes_back_to_the_samples() {
    // Guards the fixture against being blessed from samples that do not
    // round-trip: every stored line decodes to the value it names.
    let Ok(text) = std::fs::read_to_string(fixture()) else {
        return;
    };
    let bytes_of = |name: &str| -> Vec<u8> {
        let line = text.lines().find(|l| l.split(' ').next() == Some(name));
        let hex = line.and_then(|l| l.split(' ').nth(1)).unwrap_or("");
        (0..hex.len() / 2)
            .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
            .collect()
    };
    for sample in backend_samples() {
        let name = format!("BackendError::{}", variant_name(&sample));
        let decoded = cistern_client::codec::from_bincode(&bytes_of(&name));
        assert_eq!(decoded.ok(), Some(sample), "{name}");
    }
    for sample in server_samples() {
        let name = format!("ServerError::{}", variant_name(&sample));
        let decoded = cistern_client::codec::from_bincode(&bytes_of(&name));
        assert_eq!(decoded.ok(), Some(sample), "{name}");
    }
}
