//! cargo-fuzz target `checkpoint_file`: the body is `cistern_cli::fuzzing::checkpoint_file`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern_cli::fuzzing::checkpoint_file(data));
