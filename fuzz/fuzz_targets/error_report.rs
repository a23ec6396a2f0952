//! cargo-fuzz target `error_report`: the body is `cistern_cli::fuzzing::error_report`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern_cli::fuzzing::error_report(data));
