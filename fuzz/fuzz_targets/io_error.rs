//! cargo-fuzz target `io_error`: the body is `cistern_cli::fuzzing::io_error`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern_cli::fuzzing::io_error(data));
