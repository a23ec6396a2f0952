//! cargo-fuzz target `csv_table`: the body is `cistern_cli::fuzzing::csv_table`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cistern_cli::fuzzing::csv_table(data));
