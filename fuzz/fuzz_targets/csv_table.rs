//! cargo-fuzz target `csv_table`: the body is `cistern::fuzzing::csv_table`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern::fuzzing::csv_table(data));
