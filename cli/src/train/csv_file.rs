//! Reading the user's CSV files: a header row, then one sample per line,
//! every used cell a finite number. Each error names the file, the line
//! and the column.

use std::io::Read;
use std::path::Path;

use super::data::Table;

/// The picked columns of a CSV file, row-major in the order picked.
#[derive(Debug)]
struct Picked {
    header: Vec<String>,
    values: Vec<f32>,
    rows: usize,
}

/// Reads a training table: every column but `target` is a feature.
pub fn read_training_table(path: &Path, target: &str) -> Result<Table, String> {
    training_table(&path.display().to_string(), open(path)?, target)
}

/// Reads the columns named `wanted`, in that order, as rows of features.
pub fn read_feature_rows(path: &Path, wanted: &[String]) -> Result<(Vec<f32>, usize), String> {
    feature_rows(&path.display().to_string(), open(path)?, wanted)
}

fn open(path: &Path) -> Result<std::io::BufReader<std::fs::File>, String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(std::io::BufReader::new(file))
}

/// A training table from CSV text read from `reader`; errors start with `name`.
pub(crate) fn training_table(name: &str, reader: impl Read, target: &str) -> Result<Table, String> {
    let mut target_index = 0;
    let picked = read_picked(name, reader, |header| {
        target_index = find(header, target)?;
        named_once(header)?;
        Ok((0..header.len()).collect())
    })?;
    let width = picked.header.len();
    if width < 2 {
        return Err(format!(
            "{name}: the only column is the target `{target}`: there are no features"
        ));
    }
    let mut features = Vec::with_capacity(picked.rows * (width - 1));
    let mut targets = Vec::with_capacity(picked.rows);
    for row in picked.values.chunks_exact(width) {
        for (index, &value) in row.iter().enumerate() {
            if index == target_index {
                targets.push(value);
            } else {
                features.push(value);
            }
        }
    }
    let mut columns = picked.header;
    columns.remove(target_index);
    Ok(Table {
        name: name.to_string(),
        columns,
        target: target.to_string(),
        features,
        targets,
    })
}

/// The columns named `wanted` of CSV text read from `reader`, as rows.
pub(crate) fn feature_rows(
    name: &str,
    reader: impl Read,
    wanted: &[String],
) -> Result<(Vec<f32>, usize), String> {
    let picked = read_picked(name, reader, |header| {
        wanted.iter().map(|name| find(header, name)).collect()
    })?;
    Ok((picked.values, picked.rows))
}

/// The column named `name`; an error if none is, or if two are (a saved
/// model finds its columns by name, so it would read the wrong one).
fn find(header: &[String], name: &str) -> Result<usize, String> {
    let mut named = header.iter().enumerate().filter(|(_, h)| *h == name);
    match (named.next(), named.next()) {
        (Some((index, _)), None) => Ok(index),
        (Some((first, _)), Some((second, _))) => Err(twice(name, first, second)),
        (None, _) => Err(format!(
            "line 1: no column `{name}` in the header (columns: {})",
            header.join(", ")
        )),
    }
}

/// An error if two columns of the header share a name.
fn named_once(header: &[String]) -> Result<(), String> {
    let mut seen = std::collections::HashMap::new();
    for (index, name) in header.iter().enumerate() {
        if let Some(first) = seen.insert(name, index) {
            return Err(twice(name, first, index));
        }
    }
    Ok(())
}

fn twice(name: &str, first: usize, second: usize) -> String {
    format!(
        "line 1: columns {} and {} are both named `{name}`: rename one",
        first + 1,
        second + 1
    )
}

fn read_picked(
    name: &str,
    reader: impl Read,
    pick: impl FnOnce(&[String]) -> Result<Vec<usize>, String>,
) -> Result<Picked, String> {
    let named = |message: String| format!("{name}: {message}");
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(reader);
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| named(csv_error(&e)))?
        .iter()
        .map(str::to_string)
        .collect();
    if header.iter().all(String::is_empty) {
        return Err(named(
            "the file is empty: a header row naming the columns is required".into(),
        ));
    }
    let columns = pick(&header).map_err(named)?;
    let mut values = Vec::new();
    let mut rows = 0;
    for record in reader.records() {
        let record = record.map_err(|e| named(csv_error(&e)))?;
        let line = record.position().map_or(rows + 2, |p| p.line() as usize);
        for &column in &columns {
            let cell = record.get(column).unwrap_or("");
            values.push(number(cell).ok_or_else(|| {
                named(format!(
                    "line {line}, column {} (`{}`): `{cell}` is not a finite number",
                    column + 1,
                    header[column]
                ))
            })?);
        }
        rows += 1;
    }
    if rows == 0 {
        return Err(named("line 2: no data rows after the header".into()));
    }
    let header = columns.iter().map(|&c| header[c].clone()).collect();
    Ok(Picked {
        header,
        values,
        rows,
    })
}

fn number(cell: &str) -> Option<f32> {
    cell.parse::<f32>().ok().filter(|v| v.is_finite())
}

fn csv_error(error: &csv::Error) -> String {
    match error.kind() {
        csv::ErrorKind::UnequalLengths {
            pos,
            expected_len,
            len,
        } => format!(
            "line {}: {len} columns where the header has {expected_len}",
            pos.as_ref().map_or(0, csv::Position::line)
        ),
        csv::ErrorKind::Utf8 { pos, .. } => format!(
            "line {}: not valid UTF-8",
            pos.as_ref().map_or(0, csv::Position::line)
        ),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CSV file in the temporary directory, removed when dropped.
    struct TempCsv(std::path::PathBuf);

    impl std::ops::Deref for TempCsv {
        type Target = Path;

        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempCsv {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn write(name: &str, text: &str) -> TempCsv {
        let path = std::env::temp_dir().join(format!("cistern-csv-{}-{name}", std::process::id()));
        assert!(std::fs::write(&path, text).is_ok());
        TempCsv(path)
    }

    #[test]
    fn a_table_splits_the_target_from_the_features() {
        let path = write("ok.csv", "a,y,b\n1,2,3\n4,5,6\n");
        let table = read_training_table(&path, "y");
        let table = table.expect("a good file");
        assert_eq!(table.columns, ["a", "b"]);
        assert_eq!(table.features, [1.0, 3.0, 4.0, 6.0]);
        assert_eq!(table.targets, [2.0, 5.0]);
    }

    #[test]
    fn a_non_numeric_cell_names_its_line_and_column() {
        let path = write("bad.csv", "a,y\n1,2\n3,x\n");
        let error = read_training_table(&path, "y").expect_err("bad cell");
        assert!(error.contains("line 3, column 2 (`y`)"), "{error}");
    }

    #[test]
    fn a_column_named_twice_is_an_error_naming_both() {
        // Found by the `csv_table` fuzz target: the second `y` became a
        // feature that `predict` would look up by name and read from the first.
        let path = write("twice.csv", "y,x,y,,w\n-1.58,9,8,9,152\n");
        let error = read_training_table(&path, "y").expect_err("target named twice");
        assert!(
            error.contains("columns 1 and 3 are both named `y`"),
            "{error}"
        );
        let path = write("twice-feature.csv", "x,y,x\n1,2,3\n");
        let error = read_training_table(&path, "y").expect_err("feature named twice");
        assert!(
            error.contains("columns 1 and 3 are both named `x`"),
            "{error}"
        );
        let wanted = ["x".to_string()];
        let error = read_feature_rows(&path, &wanted).expect_err("wanted column named twice");
        assert!(error.contains("both named `x`"), "{error}");
        let path = write("twice-unused.csv", "x,a,a\n1,2,3\n");
        assert_eq!(read_feature_rows(&path, &wanted), Ok((vec![1.0], 1)));
    }

    #[test]
    fn a_missing_column_and_an_empty_file_are_errors() {
        let path = write("nocol.csv", "a,b\n1,2\n");
        let error = read_training_table(&path, "y").expect_err("no column");
        assert!(error.contains("no column `y`"), "{error}");
        let path = write("empty.csv", "");
        let error = read_training_table(&path, "y").expect_err("empty");
        assert!(error.contains("empty"), "{error}");
        let path = write("header.csv", "a,y\n");
        let error = read_training_table(&path, "y").expect_err("no rows");
        assert!(error.contains("no data rows"), "{error}");
    }
}
