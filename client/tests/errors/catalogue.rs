//! `docs/error-codes.md` agrees with the code: every code with its id, and
//! every variant listed under the code its `code()` returns.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use cistern_client::ErrorCode;

use super::samples::{autodiff_samples, backend_samples, io_samples, server_samples, variant_name};

/// Variants whose code is that of what they carry; the doc explains them
/// outside the table.
const CODE_OF_CONTENT: [&str; 3] = [
    "ServerError::Io",
    "IoError::StorageMappingFailed",
    "AutodiffError::Backend",
];

struct Row {
    name: String,
    id: String,
    meaning: String,
    variants: Vec<String>,
    action: String,
}

fn doc() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/error-codes.md");
    match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) => panic!("{}: {error}", path.display()),
    }
}

/// The rows of the table whose header starts `| code | id |`.
fn rows(doc: &str) -> Vec<Row> {
    let mut lines = doc
        .lines()
        .skip_while(|line| !line.replace(' ', "").starts_with("|code|id|"));
    let header = lines.next().unwrap_or_default();
    assert_eq!(
        header.replace(' ', ""),
        "|code|id|meaning|variants|callershould|",
        "table header"
    );
    lines
        .skip(1)
        .take_while(|line| line.trim_start().starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            assert_eq!(cells.len(), 5, "row {line}");
            Row {
                name: cells[0].trim_matches('`').to_string(),
                id: cells[1].to_string(),
                meaning: cells[2].to_string(),
                variants: backticked(cells[3]),
                action: cells[4].to_string(),
            }
        })
        .collect()
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// `Type::Variant` → the code of its sample.
fn sampled_codes() -> BTreeMap<String, ErrorCode> {
    let mut codes = BTreeMap::new();
    for error in io_samples() {
        codes.insert(format!("IoError::{}", variant_name(&error)), error.code());
    }
    for error in server_samples() {
        codes.insert(
            format!("ServerError::{}", variant_name(&error)),
            error.code(),
        );
    }
    for error in backend_samples() {
        codes.insert(
            format!("BackendError::{}", variant_name(&error)),
            error.code(),
        );
    }
    for error in autodiff_samples() {
        codes.insert(
            format!("AutodiffError::{}", variant_name(&error)),
            error.code(),
        );
    }
    codes
}

#[test]
fn the_table_lists_every_code_once_with_its_id_in_catalogue_order() {
    let rows = rows(&doc());
    let listed: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r.name.clone(), r.id.clone()))
        .collect();
    let expected: Vec<(String, String)> = ErrorCode::ALL
        .iter()
        .map(|code| (code.name().to_string(), code.stable_id().to_string()))
        .collect();
    assert_eq!(listed, expected);
    let ids: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids.len(), rows.len(), "ids are unique");
}

#[test]
fn every_row_says_what_it_means_and_what_to_do() {
    for row in rows(&doc()) {
        assert!(!row.meaning.is_empty(), "{} has no meaning", row.name);
        assert!(!row.action.is_empty(), "{} has no action", row.name);
    }
}

#[test]
fn every_variant_named_in_a_row_has_that_rows_code() {
    let codes = sampled_codes();
    for row in rows(&doc()) {
        for variant in &row.variants {
            let Some(code) = codes.get(variant) else {
                panic!("{} names {variant}, which is not a variant", row.name);
            };
            assert_eq!(
                code.name(),
                row.name,
                "{variant} is listed under {}",
                row.name
            );
        }
    }
}

#[test]
fn every_variant_with_a_fixed_code_is_in_exactly_one_row() {
    let rows = rows(&doc());
    for variant in sampled_codes().keys() {
        let count = rows.iter().filter(|r| r.variants.contains(variant)).count();
        let expected = usize::from(!CODE_OF_CONTENT.contains(&variant.as_str()));
        assert_eq!(count, expected, "{variant} appears in {count} rows");
    }
}

#[test]
fn variants_coded_by_their_content_are_explained_below_the_table() {
    let doc = doc();
    for variant in CODE_OF_CONTENT {
        assert!(
            doc.contains(&format!("`{variant}`")),
            "{variant} is not explained"
        );
    }
}

#[test]
fn the_backtrace_switch_and_its_default_are_documented() {
    let doc = doc();
    assert!(doc.contains("`CISTERN_BACKTRACE=0`"));
    assert!(doc.contains("on by default"));
}
