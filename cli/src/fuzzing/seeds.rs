//! Valid inputs for every target, made by the encoders themselves: the
//! checked-in corpus is written from them, and the stable suite runs them
//! too, so a target always sees inputs of the current layouts.

use cistern_client::{AutodiffError, BackendError, CompactReport, ErrorReport, ReportedError};
use cistern_memory::{BackTrace, DevicePoison, IoError, Reason, SplitMix64};
use cistern_runtime::ServerError;
use serde::Serialize;

use cistern_client::codec;

/// One seed input: its target, a file name in the target's corpus, its bytes.
#[derive(Clone, Debug)]
pub struct Seed {
    /// The target it feeds.
    pub target: &'static str,
    /// Its file name under `fuzz/corpus/<target>/`.
    pub name: String,
    /// The input.
    pub bytes: Vec<u8>,
}

/// Every seed, for every target.
pub fn seeds() -> Vec<Seed> {
    let mut seeds = Vec::new();
    let reports: Vec<ErrorReport> = reported_errors()
        .into_iter()
        .enumerate()
        .map(|(index, error)| {
            let trace = BackTrace::from_text(format!("   0: cistern::seed::{index}"));
            ErrorReport::with_parts(
                error,
                Some(index % 2),
                None,
                trace,
                1_700_000_000 + index as u64,
            )
        })
        .collect();
    encodings(&mut seeds, "error_report", &reports);
    let compact: Vec<CompactReport> = reports
        .iter()
        .enumerate()
        .map(|(index, report)| CompactReport::from_report(report, index % 2 == 0))
        .collect();
    encodings(&mut seeds, "compact_report", &compact);
    encodings(&mut seeds, "server_error", &server_errors());
    encodings(&mut seeds, "io_error", &io_errors());
    for (index, length) in [16, 128, 1024, 4096].into_iter().enumerate() {
        let mut rng = SplitMix64::derived(0x5eed, index as u64);
        let bytes = (0..length).map(|_| rng.next_u64() as u8).collect();
        seeds.push(seed("memory_manager", format!("random-{length}"), bytes));
    }
    seeds.extend(super::files::seeds());
    seeds
}

pub(super) fn seed(target: &'static str, name: String, bytes: Vec<u8>) -> Seed {
    Seed {
        target,
        name,
        bytes,
    }
}

/// Each value as a JSON line and as bincode, and all of them as one stream of frames.
fn encodings<T: Serialize>(seeds: &mut Vec<Seed>, target: &'static str, values: &[T]) {
    let mut frames = Vec::new();
    for (index, value) in values.iter().enumerate() {
        if let Ok(line) = codec::to_json_line(value) {
            seeds.push(seed(target, format!("{index:02}.json"), line.into_bytes()));
        }
        if let Ok(bytes) = codec::to_bincode(value) {
            seeds.push(seed(target, format!("{index:02}.bincode"), bytes));
        }
        let _ = codec::write_bincode_frame(&mut frames, value);
    }
    seeds.push(seed(target, "all.frames".to_string(), frames));
}

fn trace() -> BackTrace {
    BackTrace::from_text("   0: cistern::seed\n   1: main")
}

fn poison() -> DevicePoison {
    DevicePoison {
        ordinal: 1,
        generation: 3,
        operation: "launch fill".into(),
        status: "illegal address".into(),
        backtrace: trace(),
    }
}

fn io_errors() -> Vec<IoError> {
    let not_found = IoError::NotFound {
        backtrace: trace(),
        reason: Reason::AlreadyFreed,
    };
    let mapping = |source: IoError| IoError::StorageMappingFailed {
        size: 1 << 20,
        source: Box::new(source),
        backtrace: BackTrace::none(),
    };
    vec![
        IoError::OutOfMemory {
            size: 4096,
            backtrace: trace(),
        },
        IoError::BufferTooBig {
            size: u64::MAX,
            backtrace: BackTrace::none(),
        },
        not_found.clone(),
        mapping(mapping(mapping(not_found))),
        IoError::DevicePoisoned(poison()),
    ]
}

fn server_errors() -> Vec<ServerError> {
    vec![
        ServerError::Io(IoError::PageSizesExhausted {
            size: 77,
            backtrace: trace(),
        }),
        ServerError::KernelLaunchFailed {
            kernel: "gemm".into(),
            message: "grid too large".into(),
        },
        ServerError::StaleGeneration {
            ordinal: 0,
            resource_generation: 1,
            current_generation: 2,
        },
        ServerError::ContextPoisoned(poison()),
        ServerError::ServerPanicked {
            ordinal: 2,
            message: "bad \"quote\"\nand newline".into(),
        },
    ]
}

fn reported_errors() -> Vec<ReportedError> {
    let mut errors: Vec<ReportedError> = io_errors().into_iter().map(Into::into).collect();
    errors.extend(server_errors().into_iter().map(ReportedError::from));
    errors.push(BackendError::OutOfMemory { size: 1 << 30 }.into());
    errors.push(AutodiffError::Backend(BackendError::TapeMismatch).into());
    errors.push(AutodiffError::InvalidArgument("empty batch".into()).into());
    errors
}
