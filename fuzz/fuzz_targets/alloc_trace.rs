//! cargo-fuzz target `alloc_trace`: the body is `cistern_cli::fuzzing::alloc_trace`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern_cli::fuzzing::alloc_trace(data));
