//! Resumable runs: `--checkpoint-every N` saves the store's checkpoint
//! with the run's own state (the step reached, the AMP scaler, what the
//! run is) into a `CheckpointDir`; `--resume DIR` reads the newest good
//! one back and refuses one written by another run, naming the argument
//! that differs. The data order needs no saving: it is the seed's, and a
//! resumed run passes over the batches already drawn.

use std::path::PathBuf;

use cistern_client::{CheckpointDir, CheckpointError, DeviceParamStore, StoreCheckpoint};
use cistern_optim::GradScaler;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::args::TrainArgs;
use super::failure::Failure;
use super::model::Layout;
use super::output::Output;
use super::prep::Standardisation;

/// What a checkpoint keeps beside the store, in its `run` metadata.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunState {
    /// Steps taken (batches drawn from the seeded order).
    pub step: u64,
    /// AMP steps skipped so far.
    pub skipped: u64,
    /// The AMP scaler as it stood (with --amp).
    pub scaler: Option<GradScaler>,
    /// The arguments that make the run what it is.
    pub identity: Value,
    /// The training part's statistics (a changed data file shows here).
    pub standardisation: Standardisation,
}

/// A run to resume: its store and its state.
#[derive(Debug)]
pub struct Resume {
    /// The file resumed from.
    pub path: PathBuf,
    /// The store's state.
    pub store: StoreCheckpoint,
    /// The run's state.
    pub state: RunState,
    /// Newer files passed over as damaged, with why.
    pub passed_over: Vec<String>,
}

/// The weight layout a checkpoint's run state names: `[in, out]`, the
/// store's. Checkpoints without it hold `[out, in]` weights.
const WEIGHT_LAYOUT: &str = "in-out";

/// The arguments that must match for a checkpoint to resume this run.
fn identity(args: &TrainArgs, dataset: &str) -> Value {
    json!({
        "task": format!("{:?}", args.task()).to_lowercase(),
        "dataset": dataset,
        "layers": args.layers,
        "activation": format!("{:?}", args.activation).to_lowercase(),
        "optimizer": args.optimizer.name(),
        "lr": args.lr(),
        "batch": args.batch,
        "seed": args.seed,
        "validation": args.validation,
        "amp": args.amp,
        "step": format!("{:?}", args.step_path()).to_lowercase(),
        "weight_layout": WEIGHT_LAYOUT,
    })
}

/// The checkpoint `--resume` names, checked against this run; `None`
/// where the directory holds none yet (the run starts at step 0).
fn resume(
    args: &TrainArgs,
    identity: &Value,
    standardisation: &Standardisation,
    layout: &Layout,
) -> Result<Option<Resume>, Failure> {
    let Some(dir) = &args.resume else {
        return Ok(None);
    };
    let checkpoints = CheckpointDir::create(dir, args.keep).map_err(usage("--resume"))?;
    let Some(point) = checkpoints.newest().map_err(usage("--resume"))? else {
        return Ok(None);
    };
    let state: RunState = serde_json::from_value(point.contents.run).map_err(|e| {
        Failure::Usage(format!(
            "--resume {}: its run state is not cistern train's: {e}",
            point.path.display()
        ))
    })?;
    let refuse = |what: String| {
        Failure::Usage(format!(
            "--resume {}: the checkpoint is of another run: {what}; resume with the \
             arguments it was started with",
            point.path.display()
        ))
    };
    if state.identity.get("weight_layout") != Some(&json!(WEIGHT_LAYOUT)) {
        return Err(Failure::Usage(format!(
            "--resume {}: the checkpoint stores its weights [out, in], as builds before \
             the [in, out] layout did; start a new run, or resume it with that build",
            point.path.display()
        )));
    }
    if let Some(what) = differences(&state.identity, identity) {
        return Err(refuse(what));
    }
    if &state.standardisation != standardisation {
        return Err(refuse("the training data differs".into()));
    }
    let shapes: Vec<Vec<usize>> = layout.tensors().into_iter().map(|(_, s)| s).collect();
    if point.contents.store.shapes != shapes {
        return Err(refuse(format!(
            "its tensors are {:?}, this model's {shapes:?}",
            point.contents.store.shapes
        )));
    }
    Ok(Some(Resume {
        path: point.path,
        store: point.contents.store,
        state,
        passed_over: point
            .passed_over
            .into_iter()
            .map(|(path, error)| format!("{}: {error}", path.display()))
            .collect(),
    }))
}

/// The first argument whose value differs, as `name: A there, B here`.
fn differences(saved: &Value, current: &Value) -> Option<String> {
    let (Value::Object(saved), Value::Object(current)) = (saved, current) else {
        return Some("its arguments are unreadable".into());
    };
    current.iter().find_map(|(name, value)| {
        let there = saved.get(name).unwrap_or(&Value::Null);
        (there != value).then(|| format!("--{name} {there} there, {value} here"))
    })
}

/// A run's checkpoints: where it resumes, and its saves after each step.
#[derive(Debug)]
pub struct Checkpointing {
    identity: Value,
    standardisation: Standardisation,
    resume: Option<Resume>,
    saver: Option<Saver>,
    /// Checkpoints saved, and the seconds they took.
    saved: u64,
    seconds: f64,
}

impl Checkpointing {
    /// The run's checkpointing: the checkpoint `--resume` names (checked
    /// against this run: its arguments, data and model), and the saver
    /// `--checkpoint-every` asks for.
    pub fn new(
        args: &TrainArgs,
        dataset: &str,
        standardisation: &Standardisation,
        layout: &Layout,
    ) -> Result<Self, Failure> {
        let identity = identity(args, dataset);
        let resume = resume(args, &identity, standardisation, layout)?;
        Ok(Checkpointing {
            identity,
            standardisation: standardisation.clone(),
            resume,
            saver: Saver::new(args)?,
            saved: 0,
            seconds: 0.0,
        })
    }

    /// The checkpoint resumed from, if any.
    pub fn resume(&self) -> Option<&Resume> {
        self.resume.as_ref()
    }

    /// The step the run resumes after (`None`: it starts at step 0).
    pub fn resumed_at(&self) -> Option<u64> {
        self.resume.as_ref().map(|resume| resume.state.step)
    }

    /// Says where a `--resume` run starts, and which damaged checkpoints
    /// it passed over.
    pub fn announce(&self, output: &Output, args: &TrainArgs, steps: u64) {
        let Some(dir) = &args.resume else {
            return;
        };
        let Some(resume) = &self.resume else {
            output.notice(
                json!({"event": "resume", "step": 0, "path": null}),
                &format!("no checkpoint in {}: starting at step 0", dir.display()),
            );
            return;
        };
        for damaged in &resume.passed_over {
            output.notice(
                json!({"event": "checkpoint_damaged", "why": damaged}),
                &format!("passed over a damaged checkpoint, {damaged}"),
            );
        }
        output.notice(
            json!({"event": "resume", "step": resume.state.step, "path": resume.path}),
            &format!(
                "resumed from {} at step {} of {steps}",
                resume.path.display(),
                resume.state.step
            ),
        );
    }

    /// After step `step`: saves `store` with the run's state where one is
    /// due (`skipped` AMP steps so far, the `scaler` as it stands).
    pub fn after_step(
        &mut self,
        output: &Output,
        step: u64,
        store: &DeviceParamStore,
        skipped: u64,
        scaler: Option<&GradScaler>,
    ) -> Result<(), Failure> {
        let Some(saver) = self.saver.as_ref().filter(|saver| saver.due(step)) else {
            return Ok(());
        };
        let begun = std::time::Instant::now();
        let state = RunState {
            step,
            skipped,
            scaler: scaler.cloned(),
            identity: self.identity.clone(),
            standardisation: self.standardisation.clone(),
        };
        let path = saver.save(store, &state)?;
        self.seconds += begun.elapsed().as_secs_f64();
        self.saved += 1;
        output.record(json!({"event": "checkpoint", "step": step, "path": path}));
        Ok(())
    }

    /// Checkpoints saved, and the seconds they took.
    pub fn saved(&self) -> (u64, f64) {
        (self.saved, self.seconds)
    }
}

/// `--checkpoint-every`'s saver.
#[derive(Debug)]
struct Saver {
    dir: CheckpointDir,
    every: u64,
}

impl Saver {
    /// The saver the arguments ask for, if any.
    pub fn new(args: &TrainArgs) -> Result<Option<Self>, Failure> {
        let (Some(every), Some(dir)) = (args.checkpoint_every, args.checkpoint_dir()) else {
            return Ok(None);
        };
        let dir = CheckpointDir::create(dir, args.keep).map_err(usage("--checkpoint-dir"))?;
        Ok(Some(Saver { dir, every }))
    }

    /// Whether the run saves after `step`.
    pub fn due(&self, step: u64) -> bool {
        step % self.every == 0
    }

    /// Saves `store` and `state` as the checkpoint of `state.step`.
    pub fn save(&self, store: &DeviceParamStore, state: &RunState) -> Result<PathBuf, Failure> {
        let run = serde_json::to_value(state)
            .map_err(|e| Failure::Usage(format!("the run state: {e}")))?;
        match self.dir.save_store(state.step, store, &run) {
            Ok(path) => Ok(path),
            Err(CheckpointError::Device(error)) => Err(error.into()),
            Err(error) => Err(usage("--checkpoint-dir")(error)),
        }
    }
}

fn usage(flag: &'static str) -> impl Fn(CheckpointError) -> Failure {
    move |error| Failure::Usage(format!("{flag}: {error}"))
}
