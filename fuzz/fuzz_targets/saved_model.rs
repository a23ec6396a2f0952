//! cargo-fuzz target `saved_model`: the body is `cistern_cli::fuzzing::saved_model`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern_cli::fuzzing::saved_model(data));
