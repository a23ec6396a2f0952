//! cargo-fuzz target `compact_report`: the body is `cistern::fuzzing::compact_report`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern::fuzzing::compact_report(data));
