//! cargo-fuzz target `server_error`: the body is `cistern_cli::fuzzing::server_error`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern_cli::fuzzing::server_error(data));
