//! cargo-fuzz target `server_error`: the body is `cistern::fuzzing::server_error`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern::fuzzing::server_error(data));
