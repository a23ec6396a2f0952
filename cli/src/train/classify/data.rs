//! A classification table: numeric features and one class per row, the
//! classes named (the digits `0`–`9`, `malignant`/`benign`, or the values
//! of a CSV column), from `smartcore`'s built-in datasets or a CSV file.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use super::super::csv_file;
use super::super::data::{BuiltIn, Table};

/// Samples with a class each: `features` row-major, `labels[r]` an index
/// into `classes`.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassTable {
    /// What the data is called in the summary.
    pub name: String,
    /// The feature columns' names, in order.
    pub columns: Vec<String>,
    /// The class column's name.
    pub target: String,
    /// `rows × columns.len()` feature values, row-major.
    pub features: Vec<f32>,
    /// One class index per row.
    pub labels: Vec<usize>,
    /// The class names, by index.
    pub classes: Vec<String>,
}

impl ClassTable {
    /// Rows held.
    pub fn rows(&self) -> usize {
        self.labels.len()
    }

    /// The same rows as a regression table whose target is the class
    /// index, for the shared split and standardisation.
    pub fn as_table(&self) -> Table {
        Table {
            name: self.name.clone(),
            columns: self.columns.clone(),
            target: self.target.clone(),
            features: self.features.clone(),
            targets: self.labels.iter().map(|&l| l as f32).collect(),
        }
    }
}

/// The built-in classification datasets (`smartcore`'s): `None` for the
/// regression ones.
pub fn built_in(dataset: BuiltIn) -> Option<ClassTable> {
    match dataset {
        BuiltIn::Digits => {
            let data = smartcore::dataset::digits::load_dataset();
            let columns = (0..data.num_features)
                .map(|i| format!("pixel_{}_{}", i / 8, i % 8))
                .collect();
            Some(ClassTable {
                name: "digits".into(),
                columns,
                target: "digit".into(),
                features: data.data,
                labels: data.target.iter().map(|&t| t.max(0.0) as usize).collect(),
                classes: (0..10).map(|d| d.to_string()).collect(),
            })
        }
        BuiltIn::BreastCancer => {
            let data = smartcore::dataset::breast_cancer::load_dataset();
            Some(ClassTable {
                name: "breast-cancer".into(),
                columns: data.feature_names,
                target: "diagnosis".into(),
                features: data.data,
                labels: data.target.iter().map(|&t| t as usize).collect(),
                // scikit-learn's order: 0 malignant, 1 benign.
                classes: vec!["malignant".into(), "benign".into()],
            })
        }
        BuiltIn::Winequality | BuiltIn::Diabetes => None,
    }
}

/// A regression table's targets taken as classes (their distinct values),
/// for `--task classify` on a built-in regression dataset.
pub fn from_values(table: &Table, max_classes: usize) -> Result<ClassTable, String> {
    let names: Vec<String> = table.targets.iter().map(|t| t.to_string()).collect();
    let (labels, classes) = classes_of(&table.name, &table.target, &names, max_classes)?;
    Ok(ClassTable {
        name: table.name.clone(),
        columns: table.columns.clone(),
        target: table.target.clone(),
        features: table.features.clone(),
        labels,
        classes,
    })
}

/// Reads a CSV file whose `target` column names each row's class (any
/// text) and whose other columns are numbers.
pub fn read_csv(path: &Path, target: &str, max_classes: usize) -> Result<ClassTable, String> {
    let mut text = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut file| file.read_to_end(&mut text))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    class_table(&path.display().to_string(), &text, target, max_classes)
}

/// A class table from CSV `text`; errors start with `name`.
pub(crate) fn class_table(
    name: &str,
    text: &[u8],
    target: &str,
    max_classes: usize,
) -> Result<ClassTable, String> {
    let (header, values) = target_column(name, text, target)?;
    let columns: Vec<String> = header.iter().filter(|h| *h != target).cloned().collect();
    if columns.is_empty() {
        return Err(format!(
            "{name}: the only column is the target `{target}`: there are no features"
        ));
    }
    let (features, _) = csv_file::feature_rows(name, text, &columns)?;
    let (labels, classes) = classes_of(name, target, &values, max_classes)?;
    Ok(ClassTable {
        name: name.to_string(),
        columns,
        target: target.to_string(),
        features,
        labels,
        classes,
    })
}

/// The header and the `target` column's cells of CSV `text`, trimmed.
pub(crate) fn target_column(
    name: &str,
    text: &[u8],
    target: &str,
) -> Result<(Vec<String>, Vec<String>), String> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text);
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| format!("{name}: {e}"))?
        .iter()
        .map(str::to_string)
        .collect();
    let Some(index) = header.iter().position(|h| h == target) else {
        return Err(format!(
            "{name}: line 1: no column `{target}` in the header (columns: {})",
            header.join(", ")
        ));
    };
    let mut values = Vec::new();
    for (row, record) in reader.records().enumerate() {
        let record = record.map_err(|e| format!("{name}: {e}"))?;
        let cell = record.get(index).unwrap_or_default();
        if cell.is_empty() {
            return Err(format!(
                "{name}: line {}: the class `{target}` is empty; every row needs a class \
                 (fill it in or remove the row)",
                row + 2
            ));
        }
        values.push(cell.to_string());
    }
    Ok((header, values))
}

/// Each value's class index and the class names: in numeric order where
/// every value is a number, else in text order. More than `max_classes`
/// distinct values, or fewer than two, is an error saying what to do.
fn classes_of(
    name: &str,
    target: &str,
    values: &[String],
    max_classes: usize,
) -> Result<(Vec<usize>, Vec<String>), String> {
    let distinct: BTreeSet<&str> = values.iter().map(String::as_str).collect();
    if distinct.len() > max_classes {
        let examples: Vec<&str> = distinct.iter().take(5).copied().collect();
        return Err(format!(
            "{name}: the class column `{target}` has {} distinct values (e.g. {}), more than \
             --max-classes {max_classes}: if it is a quantity, use --task regress; else raise \
             --max-classes",
            distinct.len(),
            examples.join(", ")
        ));
    }
    if distinct.len() < 2 {
        return Err(format!(
            "{name}: the class column `{target}` has {} distinct value(s): a classifier needs \
             at least two classes",
            distinct.len()
        ));
    }
    let mut classes: Vec<String> = distinct.iter().map(|s| s.to_string()).collect();
    let numbers: Option<Vec<f64>> = classes.iter().map(|c| c.parse::<f64>().ok()).collect();
    if let Some(numbers) = numbers {
        let mut order: Vec<usize> = (0..classes.len()).collect();
        order.sort_by(|&a, &b| numbers[a].total_cmp(&numbers[b]));
        classes = order.into_iter().map(|i| classes[i].clone()).collect();
    }
    let index: BTreeMap<&str, usize> = classes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.as_str(), i))
        .collect();
    let labels = values
        .iter()
        .map(|v| index.get(v.as_str()).copied().unwrap_or(0))
        .collect();
    Ok((labels, classes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_named_by_the_column_in_numeric_order_where_they_are_numbers() {
        let csv = b"a,b,label\n1,2,10\n3,4,9\n5,6,10\n7,8,100\n";
        let table = class_table("t.csv", csv, "label", 10).expect("a table");
        assert_eq!(table.classes, ["9", "10", "100"]);
        assert_eq!(table.labels, [1, 0, 1, 2]);
        assert_eq!(table.columns, ["a", "b"]);
        assert_eq!(table.features, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let text = b"x,kind\n1,cat\n2,dog\n3,cat\n";
        let table = class_table("t.csv", text, "kind", 10).expect("a table");
        assert_eq!(
            (table.classes, table.labels),
            (vec!["cat".to_string(), "dog".to_string()], vec![0, 1, 0])
        );
    }

    #[test]
    fn too_many_classes_one_class_and_an_empty_class_are_errors_saying_what_to_do() {
        let csv = b"a,y\n1,1\n2,2\n3,3\n";
        let error = class_table("t.csv", csv, "y", 2).expect_err("3 > 2");
        assert!(
            error.contains("3 distinct values") && error.contains("--task regress"),
            "{error}"
        );
        let error = class_table("t.csv", b"a,y\n1,x\n2,x\n", "y", 9).expect_err("one class");
        assert!(error.contains("at least two classes"), "{error}");
        let error = class_table("t.csv", b"a,y\n1,x\n2,\n", "y", 9).expect_err("empty");
        assert!(
            error.contains("line 3") && error.contains("empty"),
            "{error}"
        );
    }

    #[test]
    fn the_built_in_datasets_have_their_rows_and_classes() {
        let digits = built_in(BuiltIn::Digits).expect("digits");
        assert_eq!(
            (digits.rows(), digits.columns.len(), digits.classes.len()),
            (1797, 64, 10)
        );
        assert_eq!(digits.features.len(), 1797 * 64);
        assert!(digits.labels.iter().all(|&l| l < 10));
        let cancer = built_in(BuiltIn::BreastCancer).expect("breast cancer");
        assert_eq!((cancer.rows(), cancer.columns.len()), (569, 30));
        assert_eq!(cancer.labels.iter().filter(|&&l| l == 0).count(), 212);
    }
}
