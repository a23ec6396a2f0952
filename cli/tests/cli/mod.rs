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
