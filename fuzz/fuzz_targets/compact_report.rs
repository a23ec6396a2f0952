//! cargo-fuzz target `compact_report`: the body is `cistern_cli::fuzzing::compact_report`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern_cli::fuzzing::compact_report(data));
