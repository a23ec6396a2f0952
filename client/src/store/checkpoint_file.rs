//! A [`StoreCheckpoint`] as a file: safetensors (one tensor per slot for
//! the parameters and for each optimizer state buffer) whose metadata
//! holds the format and its version, the store's layout, family,
//! configuration and step count, the caller's own run state (JSON), and
//! a CRC-32 of all of it. Reading refuses a truncated, corrupt, foreign
//! or newer file, saying which.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;

use cistern_optim::OptimizerConfig;
use safetensors::tensor::{Dtype, Metadata, SafeTensors, TensorInfo};
use serde::{Deserialize, Serialize};

use super::amp::DeviceAmpState;
use super::checkpoint::{DeviceAmpCheckpoint, OptimizerCheckpoint, StoreCheckpoint};

/// The format's name, in the metadata's `format` entry.
pub const CHECKPOINT_FORMAT: &str = "cistern-checkpoint";
/// The format version this build writes and reads.
pub const CHECKPOINT_FORMAT_VERSION: u32 = 1;

/// Why a checkpoint could not be written or read. Plain data, so a
/// telemetry pipeline can keep it.
#[derive(Clone, Debug, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum CheckpointError {
    /// The file system refused: check the path, its permissions and the
    /// free space.
    #[error("{path}: {message}")]
    Io {
        /// The file or directory.
        path: String,
        /// What the system said.
        message: String,
    },
    /// The bytes are not a Cistern checkpoint (another safetensors file,
    /// or not safetensors at all): point at a checkpoint directory.
    #[error("not a Cistern checkpoint: {0}")]
    Foreign(String),
    /// Another format version: this build reads only its own.
    #[error(
        "checkpoint format version {found}; this build reads version {expected}: \
         resume with the build that wrote it"
    )]
    Version {
        /// The file's version.
        found: String,
        /// This build's.
        expected: u32,
    },
    /// Truncated or corrupt (a torn write, a bad disk): use an older
    /// checkpoint.
    #[error("damaged checkpoint: {0}")]
    Damaged(String),
    /// The checkpoint is sound but does not fit what it was asked to
    /// resume: resume it with the model and run that wrote it.
    #[error("checkpoint of another model: {0}")]
    Mismatch(String),
    /// A bad request (a `keep` of 0, a run state that is not JSON).
    #[error("checkpoint: {0}")]
    InvalidArgument(String),
}

impl CheckpointError {
    /// An I/O failure on `path`.
    pub fn io(path: &std::path::Path, error: &std::io::Error) -> Self {
        CheckpointError::Io {
            path: path.display().to_string(),
            message: error.to_string(),
        }
    }
}

/// The store's part of the metadata (the tensors carry the numbers).
#[derive(Serialize, Deserialize)]
struct StoreHeader {
    shapes: Vec<Vec<usize>>,
    optimizer: Option<OptimizerHeader>,
}

#[derive(Serialize, Deserialize)]
struct OptimizerHeader {
    config: OptimizerConfig,
    steps: u64,
    buffers: Vec<String>,
    device_amp: Option<DeviceAmpHeader>,
}

#[derive(Serialize, Deserialize)]
struct DeviceAmpHeader {
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u32,
    scale: f32,
    growth_tracker: u32,
    skipped: u32,
    steps: u32,
}

/// A checkpoint read back: the store's state and the caller's run state.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointContents {
    /// The store's parameters and optimizer state.
    pub store: StoreCheckpoint,
    /// What the writer passed as its run state.
    pub run: serde_json::Value,
}

/// Writes `checkpoint` with the caller's `run` state (the step reached,
/// the data order's position, anything a resume needs) to `out` as a
/// checkpoint file. Writes each tensor once, with no copy of the whole.
pub fn write_checkpoint(
    out: &mut impl Write,
    checkpoint: &StoreCheckpoint,
    run: &serde_json::Value,
) -> Result<(), CheckpointError> {
    let tensors = tensors_of(checkpoint)?;
    let header = serde_json::to_string(&header_of(checkpoint)).map_err(invalid)?;
    let run = serde_json::to_string(run).map_err(invalid)?;
    let mut crc = crc32fast::Hasher::new();
    let mut infos = Vec::with_capacity(tensors.len());
    let mut offset = 0;
    for (name, shape, values) in &tensors {
        let bytes = le_bytes(values);
        crc.update(&bytes);
        infos.push((
            name.clone(),
            TensorInfo {
                dtype: Dtype::F32,
                shape: shape.clone(),
                data_offsets: (offset, offset + bytes.len()),
            },
        ));
        offset += bytes.len();
    }
    crc.update(header.as_bytes());
    crc.update(run.as_bytes());
    let metadata = HashMap::from([
        ("format".to_string(), CHECKPOINT_FORMAT.to_string()),
        (
            "format_version".to_string(),
            CHECKPOINT_FORMAT_VERSION.to_string(),
        ),
        ("store".to_string(), header),
        ("run".to_string(), run),
        ("crc32".to_string(), format!("{:08x}", crc.finalize())),
    ]);
    let metadata = Metadata::new(Some(metadata), infos).map_err(invalid)?;
    let mut json = serde_json::to_vec(&metadata).map_err(invalid)?;
    json.resize(json.len().next_multiple_of(8), b' ');
    let io = |error: std::io::Error| CheckpointError::Io {
        path: "checkpoint".into(),
        message: error.to_string(),
    };
    out.write_all(&(json.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&json).map_err(io)?;
    for (_, _, values) in &tensors {
        out.write_all(&le_bytes(values)).map_err(io)?;
    }
    Ok(())
}

/// Reads a checkpoint file's bytes: refuses a truncated or corrupt file
/// (`Damaged`), another kind of file (`Foreign`) and another format
/// version (`Version`), naming what is wrong.
pub fn read_checkpoint(bytes: &[u8]) -> Result<CheckpointContents, CheckpointError> {
    let (header_len, metadata) =
        SafeTensors::read_metadata(bytes).map_err(|error| match bytes.len() < 8 {
            true => CheckpointError::Damaged(format!("{} bytes, no header", bytes.len())),
            false => CheckpointError::Damaged(format!("header: {error}")),
        })?;
    let entries = metadata.metadata().clone().unwrap_or_default();
    let entry = |key: &str| {
        entries
            .get(key)
            .ok_or_else(|| CheckpointError::Damaged(format!("metadata has no `{key}`")))
    };
    match entries.get("format") {
        Some(format) if format == CHECKPOINT_FORMAT => {}
        Some(other) => return Err(CheckpointError::Foreign(format!("its format is `{other}`"))),
        None => {
            return Err(CheckpointError::Foreign(
                "its metadata names no format".into(),
            ));
        }
    }
    let version = entry("format_version")?;
    if version != &CHECKPOINT_FORMAT_VERSION.to_string() {
        return Err(CheckpointError::Version {
            found: version.clone(),
            expected: CHECKPOINT_FORMAT_VERSION,
        });
    }
    let data = bytes.get(8 + header_len..).unwrap_or_default();
    if data.len() != metadata.data_len() {
        return Err(CheckpointError::Damaged(format!(
            "{} bytes of tensors, the header lists {} (truncated?)",
            data.len(),
            metadata.data_len()
        )));
    }
    let (header, run) = (entry("store")?, entry("run")?);
    let mut crc = crc32fast::Hasher::new();
    crc.update(data);
    crc.update(header.as_bytes());
    crc.update(run.as_bytes());
    let computed = format!("{:08x}", crc.finalize());
    if entry("crc32")? != &computed {
        return Err(CheckpointError::Damaged(format!(
            "its CRC-32 is {computed}, the file says {}",
            entry("crc32")?
        )));
    }
    let tensors = SafeTensors::deserialize(bytes)
        .map_err(|error| CheckpointError::Damaged(format!("tensors: {error}")))?;
    let header: StoreHeader = serde_json::from_str(header)
        .map_err(|error| CheckpointError::Damaged(format!("store metadata: {error}")))?;
    let run = serde_json::from_str(run)
        .map_err(|error| CheckpointError::Damaged(format!("run metadata: {error}")))?;
    Ok(CheckpointContents {
        store: store_of(header, &tensors)?,
        run,
    })
}

/// Every tensor the file holds: its name, shape and values.
type Named<'a> = (String, Vec<usize>, &'a [f32]);

/// The parameters, then each state buffer, cut into the slots' shapes.
fn tensors_of(checkpoint: &StoreCheckpoint) -> Result<Vec<Named<'_>>, CheckpointError> {
    let mut tensors = slots(&checkpoint.shapes, &checkpoint.params, "param")?;
    if let Some(optimizer) = &checkpoint.optimizer {
        let layout = optimizer.config.state_layout().buffers;
        if layout.len() != optimizer.state.len() {
            return Err(invalid(format!(
                "{} state buffers for the layout's {}",
                optimizer.state.len(),
                layout.len()
            )));
        }
        for (buffer, values) in layout.iter().zip(&optimizer.state) {
            tensors.extend(slots(&checkpoint.shapes, values, buffer.name)?);
        }
    }
    Ok(tensors)
}

/// `values` cut into `shapes`, named `prefix.slot`.
fn slots<'a>(
    shapes: &[Vec<usize>],
    values: &'a [f32],
    prefix: &str,
) -> Result<Vec<Named<'a>>, CheckpointError> {
    let mut rest = values;
    let mut out = Vec::with_capacity(shapes.len());
    for (slot, shape) in shapes.iter().enumerate() {
        let len = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let Some((part, after)) = len.and_then(|len| rest.split_at_checked(len)) else {
            return Err(invalid(format!(
                "`{prefix}`: {} floats do not fill slot {slot} (shape {shape:?})",
                values.len()
            )));
        };
        out.push((format!("{prefix}.{slot}"), shape.clone(), part));
        rest = after;
    }
    if !rest.is_empty() {
        return Err(invalid(format!(
            "`{prefix}`: {} floats, {} more than the slots hold",
            values.len(),
            rest.len()
        )));
    }
    Ok(out)
}

fn header_of(checkpoint: &StoreCheckpoint) -> StoreHeader {
    StoreHeader {
        shapes: checkpoint.shapes.clone(),
        optimizer: checkpoint.optimizer.as_ref().map(|o| OptimizerHeader {
            config: o.config.clone(),
            steps: o.steps,
            buffers: o
                .config
                .state_layout()
                .buffers
                .iter()
                .map(|b| b.name.to_string())
                .collect(),
            device_amp: o.device_amp.as_ref().map(|amp| DeviceAmpHeader {
                growth_factor: amp.growth_factor,
                backoff_factor: amp.backoff_factor,
                growth_interval: amp.growth_interval,
                scale: amp.state.scale,
                growth_tracker: amp.state.growth_tracker,
                skipped: amp.state.skipped,
                steps: amp.state.steps,
            }),
        }),
    }
}

/// The store's checkpoint from the header and the file's tensors.
fn store_of(
    header: StoreHeader,
    tensors: &SafeTensors<'_>,
) -> Result<StoreCheckpoint, CheckpointError> {
    let params = joined(tensors, &header.shapes, "param")?;
    let optimizer = match header.optimizer {
        None => None,
        Some(o) => {
            let layout = o.config.state_layout().buffers;
            let names: Vec<&str> = layout.iter().map(|b| b.name).collect();
            if names != o.buffers {
                return Err(CheckpointError::Damaged(format!(
                    "state buffers {:?}, {} keeps {names:?}",
                    o.buffers,
                    o.config.name()
                )));
            }
            let state = names
                .iter()
                .map(|name| joined(tensors, &header.shapes, name))
                .collect::<Result<_, _>>()?;
            Some(OptimizerCheckpoint {
                config: o.config,
                steps: o.steps,
                state,
                device_amp: o.device_amp.map(|amp| DeviceAmpCheckpoint {
                    growth_factor: amp.growth_factor,
                    backoff_factor: amp.backoff_factor,
                    growth_interval: amp.growth_interval,
                    state: DeviceAmpState {
                        scale: amp.scale,
                        growth_tracker: amp.growth_tracker,
                        skipped: amp.skipped,
                        steps: amp.steps,
                    },
                }),
            })
        }
    };
    Ok(StoreCheckpoint {
        shapes: header.shapes,
        params,
        optimizer,
    })
}

/// The tensors `prefix.0`, `prefix.1`, … of `shapes`, concatenated.
fn joined(
    tensors: &SafeTensors<'_>,
    shapes: &[Vec<usize>],
    prefix: &str,
) -> Result<Vec<f32>, CheckpointError> {
    let mut values = Vec::new();
    for (slot, shape) in shapes.iter().enumerate() {
        let name = format!("{prefix}.{slot}");
        let tensor = tensors
            .tensor(&name)
            .map_err(|_| CheckpointError::Damaged(format!("no tensor `{name}`")))?;
        if tensor.dtype() != Dtype::F32 || tensor.shape() != shape.as_slice() {
            return Err(CheckpointError::Damaged(format!(
                "`{name}` is {:?} {:?}, its slot is F32 {shape:?}",
                tensor.dtype(),
                tensor.shape()
            )));
        }
        values.extend(
            tensor
                .data()
                .chunks_exact(4)
                .map(|word| f32::from_le_bytes([word[0], word[1], word[2], word[3]])),
        );
    }
    Ok(values)
}

/// `values` as little-endian bytes, borrowed where the host is.
fn le_bytes(values: &[f32]) -> Cow<'_, [u8]> {
    match cfg!(target_endian = "little") {
        true => Cow::Borrowed(bytemuck::cast_slice(values)),
        false => Cow::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
    }
}

fn invalid(error: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::InvalidArgument(error.to_string())
}
