//! What the end-to-end tests of the `cistern` binary share: running it and
//! reading what it printed.

use std::process::{Command, Output};

/// Runs the built `cistern` with `args`, waiting for it to end.
pub fn cistern(args: &[&str]) -> Output {
    cistern_with_env(args, &[])
}

/// [`cistern`] with the environment variables `vars` set.
pub fn cistern_with_env(args: &[&str], vars: &[(&str, &str)]) -> Output {
    match Command::new(env!("CARGO_BIN_EXE_cistern"))
        .args(args)
        .envs(vars.iter().copied())
        .output()
    {
        Ok(output) => output,
        Err(error) => panic!("cannot run cistern: {error}"),
    }
}

/// Bytes it printed, as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every tensor of a saved model (safetensors), by name, as raw bytes.
// Not every test file that shares this module compares saved models.
#[allow(dead_code)]
pub fn tensors(file: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let tensors = safetensors::SafeTensors::deserialize(&bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut out: Vec<(String, Vec<u8>)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.data().to_vec()))
        .collect();
    out.sort();
    out
}
