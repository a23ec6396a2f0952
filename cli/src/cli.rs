//! The `cistern` command line: argument definitions and dispatch.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Cistern: a compute runtime for training programs.
#[derive(Debug, Parser)]
#[command(name = "cistern", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// More log output (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// The top-level subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train an MLP on a real dataset (red wine quality by default) or a CSV file.
    Train(crate::train::TrainArgs),
    /// Predict with a model saved by `train --save`.
    Predict(crate::train::PredictArgs),
    /// List the devices present on this machine, and why a backend is absent.
    Devices,
    /// Run a benchmark; each prints one JSON object per result line.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Stress a device: many clients, a tight memory limit, injected faults.
    Stress(crate::stress::StressArgs),
    /// Count the errors of a telemetry file by code.
    Report(crate::report::ReportArgs),
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Replay an allocation trace through the memory manager.
    Alloc {
        /// A trace written by `shared/traces/gen_trace.py`.
        #[arg(long)]
        trace: std::path::PathBuf,
        /// Whether the storage can map memory into address ranges (the
        /// manager's virtual range), like a device with virtual memory
        /// management; `off` replays on pages only.
        #[arg(long, default_value = "on", value_parser = ["on", "off"])]
        mapping: String,
    },
    /// Client/server round trips and submit rates against a bare channel.
    Roundtrip {
        /// The device the server runs on: `cpu:0`, `wgpu:N`, `cuda:N`.
        #[arg(long, default_value = "cpu:0")]
        device: String,
    },
    /// Optimizer steps through the server against an in-place axpy.
    Optim {
        /// adam, adamw, sgd (momentum 0.9), rmsprop, adagrad or lamb.
        #[arg(long, default_value = "adam")]
        optimizer: String,
        /// Parameters updated per step.
        #[arg(long, default_value_t = 1 << 26)]
        params: u64,
        /// `server`: the raw command alone; `store`: through
        /// `DeviceParamStore` (200 slots) beside the raw command.
        #[arg(long, default_value = "server", value_parser = ["server", "store"])]
        through: String,
        /// The device (with `--through server`): `cpu:0`, `wgpu:N`, `cuda:N`.
        #[arg(long, default_value = "cpu:0")]
        device: String,
    },
    /// GEMM through the server against the GEMM crate called directly.
    Gemm {
        /// The device: `cpu:0`, `wgpu:N`, `cuda:N` (the host references run
        /// on the CPU only; on CUDA the reference is cuBLAS).
        #[arg(long, default_value = "cpu:0")]
        device: String,
        /// Samples per shape (one warm-up), in place of about 3·10¹⁰ flops' worth (8–60).
        #[arg(long)]
        samples: Option<usize>,
        /// Only this product (repeatable): `MxNxK`, then `,ta` and/or `,tb`
        /// for a transposed A or B (`784x1024x256,ta`); the squares and the
        /// MLP's products by default.
        #[arg(long = "shape")]
        shapes: Vec<crate::bench::gemm::Shape>,
    },
    /// The replica group's all-reduce, 1 KiB to 256 MiB, against its engine
    /// called directly (`MPI_Allreduce`; in one process a bare sum).
    Allreduce {
        /// `in-process`, or `mpi` (under `mpirun -np N`, a `--features mpi` build).
        #[arg(long, value_enum, default_value = "in-process")]
        engine: crate::bench::parallel::EngineName,
        /// The largest buffer, in bytes (sizes go by fours from 1 KiB).
        #[arg(long, default_value_t = 1 << 28)]
        max_bytes: usize,
    },
    /// Weak scaling of the bench MLP (batch 256 per replica, Adam, one core
    /// each): a group of two against one replica alone.
    DataParallel {
        /// `in-process`, or `mpi` (under `mpirun -np 2`, a `--features mpi` build).
        #[arg(long, value_enum, default_value = "in-process")]
        engine: crate::bench::parallel::EngineName,
    },
    /// A checkpoint of a 16.5M-parameter Adam store against `std::fs::write`
    /// plus `fsync` of as many bytes; the bench MLP's loop with a
    /// checkpoint every 100 steps against the loop without.
    Checkpoint {
        /// Parameters in the saved store.
        #[arg(long, default_value_t = 16_500_000)]
        params: usize,
        /// Where the files go (removed after) [default: a temporary folder].
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
    /// An MLP step's forward + backward on the tape against its replayed kernels.
    Tape,
    /// The ViT's attention, forward + backward, fused against composed.
    Attention,
    /// A whole training step.
    TrainStep,
    /// Cross-entropy forward + backward of a 256×1000 batch on the CPU
    /// (PyTorch's in turns: benches/cross_entropy_pytorch.py).
    CrossEntropy {
        /// Samples of which the median is reported.
        #[arg(long, default_value_t = 50)]
        samples: usize,
    },
}

/// Runs a parsed command line; errors are printed to stderr and give a non-zero exit.
pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Train(args) => crate::train::run_train(&args),
        Command::Predict(args) => crate::train::run_predict(&args),
        Command::Devices => crate::devices::print_devices(),
        Command::Bench(bench) => run_bench(bench),
        Command::Stress(args) => crate::stress::run_command(&args),
        Command::Report(args) => crate::report::run_command(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("cistern: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run_bench(bench: BenchCommand) -> Result<(), String> {
    match bench {
        BenchCommand::Alloc { trace, mapping } => crate::bench::alloc::run(&trace, mapping == "on"),
        BenchCommand::Roundtrip { device } => {
            crate::devices::choose(&device).and_then(crate::bench::roundtrip::run)
        }
        BenchCommand::Optim {
            optimizer,
            params,
            through,
            device,
        } => match through.as_str() {
            "store" => crate::bench::optim_store::run(&optimizer, params),
            _ => crate::devices::choose(&device)
                .and_then(|device| crate::bench::optim::run(&optimizer, params, device)),
        },
        BenchCommand::Gemm {
            device,
            samples,
            shapes,
        } => crate::devices::choose(&device)
            .and_then(|device| crate::bench::gemm::run(device, samples, &shapes)),
        BenchCommand::Allreduce { engine, max_bytes } => {
            crate::bench::parallel::allreduce(engine, max_bytes)
        }
        BenchCommand::DataParallel { engine } => crate::bench::parallel::data_parallel(engine),
        BenchCommand::Checkpoint { params, dir } => {
            crate::bench::checkpoint::run(params, dir.as_deref())
        }
        BenchCommand::Tape => crate::bench::tape::run(),
        BenchCommand::Attention => crate::bench::attention::run(),
        BenchCommand::TrainStep => crate::bench::train_step::run(),
        BenchCommand::CrossEntropy { samples } => crate::bench::cross_entropy::run(samples),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{BenchCommand, Cli, Command};

    fn bench(args: &[&str]) -> BenchCommand {
        let line = ["cistern", "bench"].iter().chain(args);
        match Cli::try_parse_from(line) {
            Ok(Cli {
                command: Command::Bench(bench),
                ..
            }) => bench,
            Ok(other) => panic!("not a bench: {other:?}"),
            Err(error) => panic!("{args:?} refused: {error}"),
        }
    }

    #[test]
    fn a_gemm_shape_reads_as_its_sizes_and_transposes_and_a_bad_one_says_how_to_write_it() {
        use crate::bench::gemm::Shape;
        match bench(&[
            "gemm",
            "--shape",
            "512x512x512",
            "--shape",
            "784x1024x256,ta",
        ]) {
            BenchCommand::Gemm { shapes, .. } => assert_eq!(
                shapes,
                [
                    Shape(512, 512, 512, false, false),
                    Shape(784, 1024, 256, true, false)
                ]
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!("3x5x7,tb,ta".parse(), Ok(Shape(3, 5, 7, true, true)));
        for bad in ["512x512", "0x5x7", "3x5x7,tc", "3x5x7,ta,ta", "axbxc"] {
            let error = bad.parse::<Shape>().err().unwrap_or_default();
            assert!(error.contains(bad), "{bad}: {error}");
        }
        let line = ["cistern", "bench", "gemm", "--shape", "512x512"];
        assert!(Cli::try_parse_from(line).is_err());
    }

    #[test]
    fn every_device_bench_takes_a_device_and_defaults_to_the_cpu() {
        match bench(&["roundtrip"]) {
            BenchCommand::Roundtrip { device } => assert_eq!(device, "cpu:0"),
            other => panic!("{other:?}"),
        }
        match bench(&["roundtrip", "--device", "cuda:0"]) {
            BenchCommand::Roundtrip { device } => assert_eq!(device, "cuda:0"),
            other => panic!("{other:?}"),
        }
        match bench(&["gemm", "--device", "cuda:0", "--samples", "3"]) {
            BenchCommand::Gemm {
                device,
                samples,
                shapes,
            } => {
                assert_eq!((device.as_str(), samples), ("cuda:0", Some(3)));
                assert!(shapes.is_empty());
            }
            other => panic!("{other:?}"),
        }
        let line = [
            "optim",
            "--device",
            "cuda:0",
            "--optimizer",
            "adam",
            "--params",
            "268435456",
        ];
        match bench(&line) {
            BenchCommand::Optim {
                optimizer,
                params,
                through,
                device,
            } => {
                assert_eq!(optimizer, "adam");
                assert_eq!(params, 1 << 28);
                assert_eq!((through.as_str(), device.as_str()), ("server", "cuda:0"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_cistern_command_the_gpu_check_runs_parses() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/gpu-check.sh");
        let script = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) => panic!("{path}: {error}"),
        };
        let mut count = 0;
        for line in script.lines() {
            // check cistern SECONDS LABEL ARGUMENTS...
            let Some(rest) = line.trim().strip_prefix("check cistern ") else {
                continue;
            };
            let arguments = rest.split_whitespace().skip(2);
            let parsed = Cli::try_parse_from(std::iter::once("cistern").chain(arguments));
            assert!(parsed.is_ok(), "`{line}`: {:?}", parsed.err());
            count += 1;
        }
        assert!(count >= 4, "only {count} cistern commands in gpu-check.sh");
    }

    #[test]
    fn a_bench_refuses_an_argument_it_does_not_take() {
        let refused = Cli::try_parse_from(["cistern", "bench", "tape", "--device", "cuda:0"]);
        assert!(refused.is_err());
        let refused = Cli::try_parse_from(["cistern", "bench", "optim", "--params", "many"]);
        assert!(refused.is_err());
    }
}
