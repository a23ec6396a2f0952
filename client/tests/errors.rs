//! The whole error model seen from the client: `IoError`, `ServerError`,
//! `BackendError`, `ShapeError`, `AutodiffError` and `ErrorReport` — their
//! mappings, codes, encodings, golden bytes and the catalogue in
//! `docs/error-codes.md`.

mod errors {
    mod catalogue;
    mod codec;
    mod compact;
    mod decode;
    mod golden;
    mod mapping;
    mod report;
    mod roundtrip;
    mod samples;
    mod shape;
    mod strategies;
}
