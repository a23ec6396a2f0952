//! The saved model: parameters in the `safetensors` format (readable from
//! Python), with the layout, the standardisation and the column names in
//! its metadata. Written atomically: a temporary file, then a rename.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::model::Layout;
use super::prep::Standardisation;

/// The metadata key naming this file's layout version.
const FORMAT_KEY: &str = "cistern.format";
/// The layout version written: weights `[in, out]` (the store's layout).
const FORMAT: &str = "cistern-mlp-2";
/// The version before it: weights `[out, in]` (PyTorch's), read by
/// transposing them. A loader refuses any other.
const FORMAT_OUT_IN: &str = "cistern-mlp-1";
/// The metadata key naming the weights' storage order, and its value.
const WEIGHT_LAYOUT_KEY: &str = "cistern.weight_layout";
const WEIGHT_LAYOUT: &str = "in-out";

/// Everything a saved model holds.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedModel {
    /// The MLP's shape.
    pub layout: Layout,
    /// One tensor per entry of [`Layout::tensors`], in order.
    pub parameters: Vec<Vec<f32>>,
    /// How to standardise inputs and read outputs.
    pub standardisation: Standardisation,
    /// The feature columns, in input order.
    pub columns: Vec<String>,
    /// The target column's name.
    pub target: String,
    /// A classifier's class names, by output (the last width); `None` for
    /// a regressor (one output).
    pub classes: Option<Vec<String>>,
}

impl SavedModel {
    /// Writes the model to `path` atomically. The error names the file.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let failed = |e: &dyn std::fmt::Display| format!("cannot save {}: {e}", path.display());
        let encoded = self.encode().map_err(|e| failed(&e))?;
        write_atomically(path, &encoded).map_err(|e| failed(&e))
    }

    /// The bytes [`save`](Self::save) writes.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, String> {
        let bytes: Vec<Vec<u8>> = self
            .parameters
            .iter()
            .map(|values| values.iter().flat_map(|v| v.to_le_bytes()).collect())
            .collect();
        let mut views = Vec::new();
        for ((name, shape), data) in self.layout.tensors().into_iter().zip(&bytes) {
            let view = TensorView::new(Dtype::F32, shape, data).map_err(|e| e.to_string())?;
            views.push((name, view));
        }
        let json = |value: &dyn erased::Json| value.to_json().map_err(|e| e.to_string());
        let metadata = HashMap::from([
            (FORMAT_KEY.to_string(), FORMAT.to_string()),
            (WEIGHT_LAYOUT_KEY.to_string(), WEIGHT_LAYOUT.to_string()),
            ("layout".to_string(), json(&self.layout)?),
            ("standardisation".to_string(), json(&self.standardisation)?),
            ("columns".to_string(), json(&self.columns)?),
            ("target".to_string(), self.target.clone()),
        ]);
        let mut metadata = metadata;
        if let Some(classes) = &self.classes {
            metadata.insert("classes".to_string(), json(classes)?);
        }
        safetensors::serialize(views, Some(metadata)).map_err(|e| e.to_string())
    }

    /// Reads a model saved by [`save`](Self::save), checking every shape.
    /// A truncated, foreign or inconsistent file is an error saying so.
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A model from the bytes of a saved file; errors as [`load`](Self::load)'s.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let tensors = SafeTensors::deserialize(bytes)
            .map_err(|e| format!("not a whole safetensors file (truncated or corrupt?): {e}"))?;
        let (_, header) = SafeTensors::read_metadata(bytes)
            .map_err(|e| format!("not a whole safetensors file: {e}"))?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let field = |key: &str| {
            metadata
                .get(key)
                .ok_or_else(|| format!("no `{key}` in its metadata: not a model saved by cistern"))
        };
        let out_in = match field(FORMAT_KEY)?.as_str() {
            FORMAT
                if metadata.get(WEIGHT_LAYOUT_KEY).map(String::as_str) == Some(WEIGHT_LAYOUT) =>
            {
                false
            }
            FORMAT_OUT_IN => true,
            format => {
                let weights = metadata
                    .get(WEIGHT_LAYOUT_KEY)
                    .map_or("unnamed", String::as_str);
                return Err(format!(
                    "layout `{format}` (weights {weights}), this build reads `{FORMAT}` \
                     (weights `{WEIGHT_LAYOUT}`) and `{FORMAT_OUT_IN}`"
                ));
            }
        };
        let parse = |key: &str| -> Result<serde_json::Value, String> {
            serde_json::from_str(field(key)?).map_err(|e| format!("metadata `{key}`: {e}"))
        };
        let layout: Layout = serde_json::from_value(parse("layout")?)
            .map_err(|e| format!("metadata `layout`: {e}"))?;
        let standardisation: Standardisation = serde_json::from_value(parse("standardisation")?)
            .map_err(|e| format!("metadata `standardisation`: {e}"))?;
        let columns: Vec<String> = serde_json::from_value(parse("columns")?)
            .map_err(|e| format!("metadata `columns`: {e}"))?;
        let classes: Option<Vec<String>> = match metadata.get("classes") {
            Some(text) => {
                Some(serde_json::from_str(text).map_err(|e| format!("metadata `classes`: {e}"))?)
            }
            None => None,
        };
        let outputs = classes.as_ref().map_or(1, Vec::len);
        let inputs = layout.widths.first().copied().unwrap_or(0);
        if layout.widths.len() < 2
            || layout.widths.last() != Some(&outputs)
            || layout.widths.contains(&0)
            || columns.len() != inputs
            || standardisation.feature_mean.len() != inputs
            || standardisation.feature_std.len() != inputs
        {
            return Err(format!(
                "inconsistent model: widths {:?}, {} columns, {} standardised features",
                layout.widths,
                columns.len(),
                standardisation.feature_mean.len()
            ));
        }
        let mut parameters = Vec::new();
        for (name, shape) in layout.tensors() {
            let view = tensors
                .tensor(&name)
                .map_err(|_| format!("no tensor `{name}`"))?;
            let stored = match (out_in, &shape[..]) {
                (true, &[inputs, outputs]) => vec![outputs, inputs],
                _ => shape.clone(),
            };
            if view.dtype() != Dtype::F32 || view.shape() != stored.as_slice() {
                return Err(format!(
                    "tensor `{name}` is {:?} {:?}, the layout needs F32 {stored:?}",
                    view.dtype(),
                    view.shape()
                ));
            }
            let values: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            parameters.push(match stored[..] {
                [rows, cols] if out_in => transposed(&values, rows, cols),
                _ => values,
            });
        }
        Ok(SavedModel {
            layout,
            parameters,
            standardisation,
            columns,
            target: field("target")?.clone(),
            classes,
        })
    }
}

/// A row-major `rows×cols` matrix transposed (`cols×rows`).
fn transposed(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| values[r * cols + c]))
        .collect()
}

/// JSON text of metadata values, through one object-safe trait.
mod erased {
    /// A value written as JSON text.
    pub trait Json {
        /// Its JSON text.
        fn to_json(&self) -> serde_json::Result<String>;
    }

    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> serde_json::Result<String> {
            serde_json::to_string(self)
        }
    }
}

/// Writes `bytes` to a temporary file beside `path`, syncs it, then renames
/// it over `path`: a reader sees the old file or the whole new one.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}", std::process::id()));
    let temporary: PathBuf = path.with_file_name(name);
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::model::ActivationName;

    fn model() -> SavedModel {
        let layout = Layout::new(2, &[3], ActivationName::Relu);
        let parameters = layout.initial_parameters(1);
        SavedModel {
            layout,
            parameters,
            standardisation: Standardisation {
                feature_mean: vec![0.5, 1.5],
                feature_std: vec![2.0, 1.0],
                target_mean: 3.0,
                target_std: 0.5,
            },
            columns: vec!["a".into(), "b".into()],
            target: "y".into(),
            classes: None,
        }
    }

    #[test]
    fn a_saved_model_loads_back_whole() {
        let path = std::env::temp_dir().join(format!("cistern-model-{}.st", std::process::id()));
        let saved = model();
        assert_eq!(saved.save(&path), Ok(()));
        assert_eq!(SavedModel::load(&path), Ok(saved));
    }

    #[test]
    fn a_file_of_the_out_in_format_loads_with_its_weights_transposed() {
        let saved = model();
        let mut old = Vec::new();
        for ((name, shape), values) in saved.layout.tensors().into_iter().zip(&saved.parameters) {
            let (stored, values) = match shape[..] {
                [inputs, outputs] => (vec![outputs, inputs], transposed(values, inputs, outputs)),
                _ => (shape, values.clone()),
            };
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            old.push((name, stored, bytes));
        }
        let views: Vec<_> = old
            .iter()
            .map(|(name, shape, bytes)| {
                let view = TensorView::new(Dtype::F32, shape.clone(), bytes).expect("a view");
                (name.clone(), view)
            })
            .collect();
        let json = |value: &dyn erased::Json| value.to_json().expect("json");
        let metadata = HashMap::from([
            (FORMAT_KEY.to_string(), FORMAT_OUT_IN.to_string()),
            ("layout".to_string(), json(&saved.layout)),
            ("standardisation".to_string(), json(&saved.standardisation)),
            ("columns".to_string(), json(&saved.columns)),
            ("target".to_string(), saved.target.clone()),
        ]);
        let bytes = safetensors::serialize(views, Some(metadata)).expect("serialises");
        assert_eq!(SavedModel::decode(&bytes), Ok(saved));
    }

    #[test]
    fn a_file_of_an_unknown_format_names_the_ones_this_build_reads() {
        let mut bytes = model().encode().expect("encodes");
        let at = bytes
            .windows(FORMAT.len())
            .position(|w| w == FORMAT.as_bytes())
            .expect("the format is in the header");
        bytes[at + FORMAT.len() - 1] = b'9';
        let error = SavedModel::decode(&bytes).expect_err("an unknown format");
        assert!(
            error.contains(FORMAT) && error.contains(FORMAT_OUT_IN),
            "{error}"
        );
    }

    #[test]
    fn a_truncated_file_is_an_error_saying_so() {
        let path = std::env::temp_dir().join(format!("cistern-cut-{}.st", std::process::id()));
        assert_eq!(model().save(&path), Ok(()));
        let bytes = std::fs::read(&path).unwrap_or_default();
        for cut in [0, 7, 20, bytes.len() - 1] {
            let error = SavedModel::decode(&bytes[..cut]).expect_err("truncated");
            assert!(
                error.contains("not a whole safetensors file"),
                "{cut}: {error}"
            );
        }
    }

    #[test]
    fn a_classifier_keeps_its_class_names_and_one_output_per_class() {
        let mut classifier = model();
        classifier.layout.widths = vec![2, 3, 3];
        classifier.parameters = classifier.layout.initial_parameters(2);
        classifier.classes = Some(vec!["cat".into(), "dog".into(), "owl".into()]);
        let bytes = classifier.encode().expect("encodes");
        assert_eq!(SavedModel::decode(&bytes), Ok(classifier.clone()));
        // Two class names for three outputs: inconsistent.
        classifier.classes = Some(vec!["cat".into(), "dog".into()]);
        let bytes = classifier.encode().expect("encodes");
        let error = SavedModel::decode(&bytes).expect_err("two names, three outputs");
        assert!(error.contains("inconsistent model"), "{error}");
    }
}
