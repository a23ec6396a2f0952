//! The memory layer's error model: `IoError`, `Reason`, `DevicePoison`,
//! `BackTrace` and `ErrorCode` — their meaning, their encodings, and what
//! malformed bytes do to a decoder.

mod errors {
    mod backtrace;
    mod codes;
    mod decode;
    mod golden;
    mod roundtrip;
    mod samples;
    mod semantics;
}
