//! A directory of checkpoint files, written atomically (a temporary
//! file, `fsync`, rename, `fsync` of the directory) so that a process
//! killed at any moment leaves the previous checkpoints whole; the last
//! `keep` are kept, and resuming takes the newest that reads back whole.

use std::fs::{self, File};
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use super::checkpoint::StoreCheckpoint;
use super::checkpoint_file::{
    CheckpointContents, CheckpointError, read_checkpoint, write_checkpoint,
};
use super::store::DeviceParamStore;

const PREFIX: &str = "checkpoint-";
const SUFFIX: &str = ".safetensors";
/// A write in progress; a killed writer leaves one, removed by the next.
const PARTIAL: &str = ".partial";

/// A run's checkpoint directory.
#[derive(Clone, Debug)]
pub struct CheckpointDir {
    dir: PathBuf,
    keep: usize,
}

/// The newest checkpoint that read back whole, and the newer ones that
/// did not (each with why), for the caller to report.
#[derive(Clone, Debug, PartialEq)]
pub struct ResumePoint {
    /// Its file.
    pub path: PathBuf,
    /// The step it was saved at.
    pub step: u64,
    /// What it holds.
    pub contents: CheckpointContents,
    /// Newer files passed over, newest first.
    pub passed_over: Vec<(PathBuf, CheckpointError)>,
}

impl CheckpointDir {
    /// The directory `dir` (created if missing), keeping the newest
    /// `keep` checkpoints; `keep` of 0 is `InvalidArgument`.
    pub fn create(dir: impl Into<PathBuf>, keep: usize) -> Result<Self, CheckpointError> {
        let dir = dir.into();
        if keep == 0 {
            return Err(CheckpointError::InvalidArgument(
                "keep 0 checkpoints: keep at least 1".into(),
            ));
        }
        fs::create_dir_all(&dir).map_err(|e| CheckpointError::io(&dir, &e))?;
        Ok(CheckpointDir { dir, keep })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Saves `checkpoint` and the caller's `run` state as the checkpoint
    /// of `step`, atomically, then removes all but the newest `keep`.
    /// Returns its path. On a failure the earlier checkpoints are intact.
    pub fn save(
        &self,
        step: u64,
        checkpoint: &StoreCheckpoint,
        run: &serde_json::Value,
    ) -> Result<PathBuf, CheckpointError> {
        self.save_with(step, |mut out| {
            write_checkpoint(&mut out, checkpoint, run)?;
            Ok(out)
        })
    }

    /// [`save`](Self::save) of `store`'s checkpoint, streamed: each of its
    /// buffers is downloaded while the one before it is written, and no
    /// host copy of the whole is made (the fastest way to checkpoint a
    /// store). A failed download latches the store (`Device`).
    pub fn save_store(
        &self,
        step: u64,
        store: &DeviceParamStore,
        run: &serde_json::Value,
    ) -> Result<PathBuf, CheckpointError> {
        self.save_with(step, |out| store.stream_checkpoint(out, run))
    }

    /// Writes the checkpoint of `step` through `write` into a partial
    /// file, makes it durable, renames it into place, then prunes.
    fn save_with(
        &self,
        step: u64,
        write: impl FnOnce(BufWriter<File>) -> Result<BufWriter<File>, CheckpointError>,
    ) -> Result<PathBuf, CheckpointError> {
        self.remove_partials()?;
        let path = self.dir.join(file_name(step));
        let partial = self.dir.join(format!("{}{PARTIAL}", file_name(step)));
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |e: std::io::Error| CheckpointError::io(&path, &e)
        };
        let file = File::create(&partial).map_err(io(&partial))?;
        let out = write(BufWriter::with_capacity(1 << 20, file)).map_err(|error| match error {
            CheckpointError::Io { message, .. } => CheckpointError::Io {
                path: partial.display().to_string(),
                message,
            },
            other => other,
        })?;
        let file = out
            .into_inner()
            .map_err(|e| CheckpointError::io(&partial, e.error()))?;
        file.sync_all().map_err(io(&partial))?;
        drop(file);
        fs::rename(&partial, &path).map_err(io(&path))?;
        sync_dir(&self.dir)?;
        for (_, old) in self.steps()?.into_iter().rev().skip(self.keep) {
            fs::remove_file(&old).map_err(io(&old))?;
        }
        Ok(path)
    }

    /// The checkpoints present, oldest first, by step.
    pub fn steps(&self) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
        let mut found = Vec::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| CheckpointError::io(&self.dir, &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| CheckpointError::io(&self.dir, &e))?;
            let name = entry.file_name();
            let step = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?.parse().ok());
            if let Some(step) = step {
                found.push((step, entry.path()));
            }
        }
        found.sort();
        Ok(found)
    }

    /// The newest checkpoint that reads back whole; `None` where the
    /// directory holds none. Damaged newer files are passed over and
    /// listed; where every file is damaged, `Damaged` names the newest's
    /// fault.
    pub fn newest(&self) -> Result<Option<ResumePoint>, CheckpointError> {
        let mut passed_over = Vec::new();
        for (step, path) in self.steps()?.into_iter().rev() {
            let read = fs::read(&path)
                .map_err(|e| CheckpointError::io(&path, &e))
                .and_then(|bytes| read_checkpoint(&bytes));
            match read {
                Ok(contents) => {
                    return Ok(Some(ResumePoint {
                        path,
                        step,
                        contents,
                        passed_over,
                    }));
                }
                Err(error) => passed_over.push((path, error)),
            }
        }
        match passed_over.into_iter().next() {
            None => Ok(None),
            Some((path, error)) => Err(CheckpointError::Damaged(format!(
                "no checkpoint in {} reads back whole; the newest, {}: {error}",
                self.dir.display(),
                path.display()
            ))),
        }
    }

    fn remove_partials(&self) -> Result<(), CheckpointError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| CheckpointError::io(&self.dir, &e))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let partial = name
                .to_str()
                .is_some_and(|n| n.starts_with(PREFIX) && n.ends_with(PARTIAL));
            if partial {
                let path = entry.path();
                fs::remove_file(&path).map_err(|e| CheckpointError::io(&path, &e))?;
            }
        }
        Ok(())
    }
}

fn file_name(step: u64) -> String {
    format!("{PREFIX}{step:012}{SUFFIX}")
}

/// Makes a rename in `dir` durable (a no-op where directories cannot be
/// opened, as on Windows).
fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    match cfg!(unix) {
        true => File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| CheckpointError::io(dir, &e)),
        false => Ok(()),
    }
}
