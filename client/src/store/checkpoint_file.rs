//! A [`StoreCheckpoint`] as a file: safetensors (one tensor per slot for
//! the parameters and for each optimizer state buffer) whose metadata
//! holds the format and its version, the store's layout, family,
//! configuration and step count, the caller's own run state (JSON), and
//! a CRC-32 of all of it. Reading refuses a truncated, corrupt, foreign
//! or newer file, saying which.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};

use cistern_optim::OptimizerConfig;
use safetensors::tensor::{Dtype, Metadata, SafeTensors, TensorInfo};
use serde::{Deserialize, Serialize};

use super::amp::DeviceAmpState;
use super::checkpoint::{DeviceAmpCheckpoint, OptimizerCheckpoint, StoreCheckpoint};
use crate::error::BackendError;

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
    /// The store could not be read from its device: see the device
    /// error; the previous checkpoints are intact.
    #[error("the store's download: {0}")]
    Device(BackendError),
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
pub(super) struct StoreHeader {
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
    let header = header_of(
        &checkpoint.shapes,
        checkpoint
            .optimizer
            .as_ref()
            .map(|o| (&o.config, o.steps, o.device_amp.as_ref())),
    );
    let (header, run) = texts(&header, run)?;
    let mut crc = crc32fast::Hasher::new();
    for (_, _, values) in &tensors {
        crc.update(&le_bytes(values));
    }
    crc.update(header.as_bytes());
    crc.update(run.as_bytes());
    let names: Vec<(String, Vec<usize>)> = tensors
        .iter()
        .map(|(name, shape, _)| (name.clone(), shape.clone()))
        .collect();
    let json = metadata_json(&names, header, run, &format!("{:08x}", crc.finalize()))?;
    out.write_all(&(json.len() as u64).to_le_bytes())
        .map_err(unnamed_io)?;
    out.write_all(&json).map_err(unnamed_io)?;
    for (_, _, values) in &tensors {
        out.write_all(&le_bytes(values)).map_err(unnamed_io)?;
    }
    Ok(())
}

/// The CRC's place-holder, patched by [`PartWriter::finish`].
const CRC_PLACEHOLDER: &str = "\"crc32\":\"00000000\"";

/// A checkpoint file written a whole buffer at a time (the parameters,
/// then each state buffer in its layout's order) as they arrive, its
/// CRC-32 patched into the header at the end: nothing of the whole is
/// held or copied.
pub(super) struct PartWriter<W> {
    out: W,
    crc: crc32fast::Hasher,
    /// Where the CRC's eight hex digits are in the file.
    crc_at: u64,
    /// The store and run metadata, which the CRC covers after the data.
    texts: (String, String),
    /// Bytes of tensors the header lists, and written so far.
    expected: usize,
    written: usize,
}

impl<W: Write + Seek> PartWriter<W> {
    /// Writes the header of a store of `header`'s layout and `run`.
    pub(super) fn start(
        mut out: W,
        header: &StoreHeader,
        run: &serde_json::Value,
    ) -> Result<Self, CheckpointError> {
        let mut names = Vec::new();
        let buffers = header
            .optimizer
            .as_ref()
            .map_or(&[][..], |o| &o.buffers[..]);
        for prefix in std::iter::once("param").chain(buffers.iter().map(String::as_str)) {
            for (slot, shape) in header.shapes.iter().enumerate() {
                names.push((format!("{prefix}.{slot}"), shape.clone()));
            }
        }
        let (store, run) = texts(header, run)?;
        let json = metadata_json(&names, store.clone(), run.clone(), "00000000")?;
        let at = json
            .windows(CRC_PLACEHOLDER.len())
            .position(|window| window == CRC_PLACEHOLDER.as_bytes())
            .ok_or_else(|| invalid("the header lost its CRC entry"))?;
        let expected = names
            .iter()
            .map(|(_, shape)| 4 * shape.iter().product::<usize>())
            .sum();
        out.write_all(&(json.len() as u64).to_le_bytes())
            .map_err(unnamed_io)?;
        out.write_all(&json).map_err(unnamed_io)?;
        Ok(PartWriter {
            out,
            crc: crc32fast::Hasher::new(),
            // The digits end one before the place-holder's closing quote.
            crc_at: (8 + at + CRC_PLACEHOLDER.len() - 9) as u64,
            texts: (store, run),
            expected,
            written: 0,
        })
    }

    /// Writes the next buffer's bytes, as the device holds them.
    pub(super) fn part(&mut self, bytes: &[u8]) -> Result<(), CheckpointError> {
        let bytes: Cow<'_, [u8]> = match cfg!(target_endian = "little") {
            true => Cow::Borrowed(bytes),
            false => Cow::Owned(
                bytes
                    .chunks_exact(4)
                    .flat_map(|w| [w[3], w[2], w[1], w[0]])
                    .collect(),
            ),
        };
        self.crc.update(&bytes);
        self.written += bytes.len();
        self.out.write_all(&bytes).map_err(unnamed_io)
    }

    /// Patches the CRC in; every byte the header lists must be written.
    pub(super) fn finish(mut self) -> Result<W, CheckpointError> {
        if self.written != self.expected {
            return Err(invalid(format!(
                "{} bytes of tensors written, the header lists {}",
                self.written, self.expected
            )));
        }
        self.crc.update(self.texts.0.as_bytes());
        self.crc.update(self.texts.1.as_bytes());
        let digits = format!("{:08x}", self.crc.finalize());
        self.out
            .seek(SeekFrom::Start(self.crc_at))
            .and_then(|_| self.out.write_all(digits.as_bytes()))
            .and_then(|()| self.out.seek(SeekFrom::End(0)).map(|_| ()))
            .map_err(unnamed_io)?;
        Ok(self.out)
    }
}

/// The store and run metadata as the file keeps them.
fn texts(
    header: &StoreHeader,
    run: &serde_json::Value,
) -> Result<(String, String), CheckpointError> {
    Ok((
        serde_json::to_string(header).map_err(invalid)?,
        serde_json::to_string(run).map_err(invalid)?,
    ))
}

/// The safetensors header of tensors `names` (F32, in file order) with
/// the metadata, padded to 8 bytes.
fn metadata_json(
    names: &[(String, Vec<usize>)],
    store: String,
    run: String,
    crc: &str,
) -> Result<Vec<u8>, CheckpointError> {
    let mut infos = Vec::with_capacity(names.len());
    let mut offset = 0usize;
    for (name, shape) in names {
        let bytes = shape
            .iter()
            .try_fold(4usize, |n, &d| n.checked_mul(d))
            .and_then(|bytes| Some((bytes, offset.checked_add(bytes)?)))
            .ok_or_else(|| invalid(format!("`{name}` of shape {shape:?} is too large")))?;
        infos.push((
            name.clone(),
            TensorInfo {
                dtype: Dtype::F32,
                shape: shape.clone(),
                data_offsets: (offset, bytes.1),
            },
        ));
        offset = bytes.1;
    }
    let metadata = HashMap::from([
        ("format".to_string(), CHECKPOINT_FORMAT.to_string()),
        (
            "format_version".to_string(),
            CHECKPOINT_FORMAT_VERSION.to_string(),
        ),
        ("store".to_string(), store),
        ("run".to_string(), run),
        ("crc32".to_string(), crc.to_string()),
    ]);
    let metadata = Metadata::new(Some(metadata), infos).map_err(invalid)?;
    let mut json = serde_json::to_vec(&metadata).map_err(invalid)?;
    json.resize(json.len().next_multiple_of(8), b' ');
    Ok(json)
}

fn unnamed_io(error: std::io::Error) -> CheckpointError {
    CheckpointError::Io {
        path: "checkpoint".into(),
        message: error.to_string(),
    }
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

/// The store's metadata: its shapes and, once it stepped, its optimizer
/// (config, steps, the device form of AMP's words).
pub(super) fn header_of(
    shapes: &[Vec<usize>],
    optimizer: Option<(&OptimizerConfig, u64, Option<&DeviceAmpCheckpoint>)>,
) -> StoreHeader {
    StoreHeader {
        shapes: shapes.to_vec(),
        optimizer: optimizer.map(|(config, steps, device_amp)| OptimizerHeader {
            config: config.clone(),
            steps,
            buffers: config
                .state_layout()
                .buffers
                .iter()
                .map(|b| b.name.to_string())
                .collect(),
            device_amp: device_amp.map(|amp| DeviceAmpHeader {
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
