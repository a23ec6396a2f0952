//! cargo-fuzz target `memory_manager`: the body is `cistern_cli::fuzzing::memory_manager`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern_cli::fuzzing::memory_manager(data));
