//! `cistern train` and `cistern predict`: an MLP regressor on a real
//! dataset (or the user's CSV), trained on a device, kept as safetensors.
//!
//! `data` and `csv_file` read the table; `prep` splits and standardises it;
//! `model` is the MLP's layout, `store_model` its parameters in a
//! `DeviceParamStore`; `trainer` is the step (the store's device chain or
//! tape step); `run`
//! is the loop, with `output`, `summary` and `plot` showing it;
//! `model_file` saves and loads; `predict` reads a saved model back.
//! `classify` is the classification run (`--task classify`, the default
//! for the digits and breast-cancer datasets) and its `predict`.

mod args;
mod batches;
mod checkpoints;
mod classify;
pub(crate) mod csv_file;
mod data;
mod distributed;
mod failure;
pub(crate) mod model;
pub(crate) mod model_file;
mod output;
mod plot;
mod predict;
pub(crate) mod prep;
mod run;
mod store_model;
mod summary;
mod telemetry;
mod trainer;

pub use args::{PredictArgs, TrainArgs};
pub use predict::run_command as run_predict;
pub use run::run_command as run_train;
