#!/usr/bin/env python3
"""Cistern against PyTorch on this machine, measured in turns.

Memory bandwidth on a shared machine drifts by up to 2x within minutes, so
one run of each, minutes apart, compares the weather rather than the code.
This runs `cistern bench optim` / `cistern bench gemm` and
`benches/pytorch_reference.py` alternately, round after round, and prints
one JSON line per pair plus a summary (medians, and how many rounds
Cistern won).

For gemm, PyTorch runs `torch.mm` at the shapes `cistern bench gemm` runs
(read from its output: the squares and the MLP products, transposes
included, as strided views like autograd's), timed the same way: the
median of as many samples as Cistern took, after 2 warm-up calls. The
turns are per shape: `cistern bench gemm --shape S`, then torch.mm at S in
one PyTorch process kept for the run (who goes first alternates), so both
sides of a pair run within seconds of each other. Cistern runs several
products per sample (`products_per_sample`: the server's, the direct and
the other kernel's, the pipelined ones); PyTorch runs as many per sample,
timing one, so both sides' samples span as many seconds of the host's
weather (a vCPU the host takes for a second halves a side's median).
PyTorch's environment drops OPENBLAS_* settings meant for other tools.
Each shape's summary gives
both sides' share of the FMA peak their round measured (`peak_fraction`),
of the median sample and of the fastest: the peak is the fastest of its
runs, since other guests only ever slow a vCPU down. `--threads N` runs
both sides (and the peak) on N threads, to compare how each scales;
`--shape` (repeatable) limits the run to those shapes.

For train-step, PyTorch runs the step `cistern bench train-step` runs (an
MLP 784-1024-1024-10, ReLU, batch 256, `nn.MSELoss`, random data) with
`optim.SGD` (lr 1e-3, momentum 0.9) beside `chain-sgd` and fused
`optim.Adam` beside `tape-adam`, 2 threads, timed to the loss read
(`loss.item()`): the median of 15 steps after 3 warm-up steps.

Usage: python3 benches/versus_pytorch.py [--rounds N] [--what adam|adamw|gemm|train-step]
       [--python PYTHON_WITH_TORCH] [--cistern target/release/cistern]
       [--threads N] [--shape MxNxK[,ta][,tb]]...   (gemm only)
Build first: cargo build --release. Not part of CI (it needs torch).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PARAMS = 64 * 1024 * 1024


def json_lines(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def torch_env():
    """This environment less OPENBLAS_* settings meant for other tools."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}


def cistern_env(threads):
    """This environment, with Cistern's GEMM on `threads` threads where set."""
    env = dict(os.environ)
    if threads:
        env["RAYON_NUM_THREADS"] = str(threads)
    return env


def cistern_optim(binary, name):
    lines = json_lines([binary, "bench", "optim", "--optimizer", name, "--params", str(PARAMS)])
    (line,) = [l for l in lines if l.get("bench") == "optim"]
    return line["ms_per_step"]


def pytorch_optim(python, name):
    lines = json_lines([python, os.path.join(HERE, "pytorch_reference.py"), "--only", "optim",
                        "--optimizer", name, "--impl", "fused", "--params", str(PARAMS)],
                       env=torch_env())
    (line,) = [l for l in lines if l.get("bench") == "pytorch_optim"]
    return line["ms_per_step"]


SHAPE_KEYS = ("m", "n", "k", "transpose_a", "transpose_b")

# Run by --python, kept running: times torch.mm at each shape it reads (one
# JSON object per line on stdin) and answers one JSON line per shape.
TORCH_GEMM = r"""
import json, statistics, sys, time
import torch
if int(sys.argv[1]):
    torch.set_num_threads(int(sys.argv[1]))
print(json.dumps({"bench": "pytorch_info", "torch": torch.__version__,
                  "threads": torch.get_num_threads()}), flush=True)
for request in sys.stdin:
    shape = json.loads(request)
    m, n, k, ta, tb, samples = (shape[key] for key in
                                ("m", "n", "k", "transpose_a", "transpose_b", "samples"))
    spread = shape.pop("spread", 1)
    a = torch.randn(k, m).t() if ta else torch.randn(m, k)
    b = torch.randn(n, k).t() if tb else torch.randn(k, n)
    c = torch.empty(m, n)
    for _ in range(2):
        torch.mm(a, b, out=c)
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        torch.mm(a, b, out=c)
        times.append(time.perf_counter() - t)
        for _ in range(spread - 1):
            torch.mm(a, b, out=c)
    shape["gflops"] = round(2 * m * n * k / statistics.median(times) / 1e9, 1)
    shape["best_gflops"] = round(2 * m * n * k / min(times) / 1e9, 1)
    shape["bench"] = "pytorch_gemm"
    print(json.dumps(shape), flush=True)
"""


def shape_of(line):
    return tuple(line[key] for key in SHAPE_KEYS)


def shape_arg(shape):
    """A shape as `cistern bench gemm --shape` reads it (784x1024x256,ta)."""
    m, n, k, ta, tb = shape
    return f"{m}x{n}x{k}" + (",ta" if ta else "") + (",tb" if tb else "")


def cistern_shapes(binary, only):
    """The shapes `cistern bench gemm` runs by default, or those of `only`
    (`--shape` arguments), one sample each (a warm-up too), and how many
    products it runs per sample."""
    chosen = [arg for shape in only for arg in ("--shape", shape)]
    lines = [l for l in json_lines([binary, "bench", "gemm", "--samples", "1", *chosen])
             if l.get("bench") == "gemm"]
    return [shape_of(l) for l in lines], max(l.get("products_per_sample", 1) for l in lines)


def cistern_gemm(binary, shape, threads):
    """Cistern's gemm line at one shape, and the FMA peak line its run printed first."""
    lines = json_lines([binary, "bench", "gemm", "--shape", shape_arg(shape)],
                       env=cistern_env(threads))
    peak = next((l for l in lines if l.get("bench") == "fma_peak"), {})
    (line,) = [l for l in lines if l.get("bench") == "gemm"]
    return line, peak


class TorchGemm:
    """One PyTorch process for the whole run, timing torch.mm shape by shape."""

    def __init__(self, python, threads):
        self.process = subprocess.Popen([python, "-c", TORCH_GEMM, str(threads or 0)],
                                        stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=torch_env())
        self.info = json.loads(self.process.stdout.readline())

    def gflops(self, shape, spread):
        flops_per_shape, lo, hi = 3e10, 8, 60  # as src/bench/gemm.rs
        samples = max(lo, min(hi, int(flops_per_shape / (2 * shape[0] * shape[1] * shape[2]))))
        request = dict(zip(SHAPE_KEYS, shape), samples=samples, spread=spread)
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            sys.exit(f"the PyTorch process ended (exit status {self.process.wait()})")
        line = json.loads(answer)
        return line["gflops"], line["best_gflops"]

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def gemm_round(a, round_, pairs, shapes, spread, torch):
    # Shape by shape, each side right after the other (who goes first
    # alternating), so both see the same minutes of a shared machine.
    for index, shape in enumerate(shapes):
        if (round_ + index) % 2:
            torch_gflops, torch_best = torch.gflops(shape, spread)
            line, peak = cistern_gemm(a.cistern, shape, a.threads)
        else:
            line, peak = cistern_gemm(a.cistern, shape, a.threads)
            torch_gflops, torch_best = torch.gflops(shape, spread)
        pair = {"bench": "versus_pytorch", "what": "gemm", "round": round_,
                **dict(zip(SHAPE_KEYS, shape)), "kernel": line.get("kernel"),
                "cistern_gflops": line["gflops"], "direct_gflops": line["direct_gflops"],
                "pytorch_gflops": torch_gflops,
                "cistern_best_gflops": line.get("best_gflops"), "pytorch_best_gflops": torch_best,
                "ratio": round(line["gflops"] / torch_gflops, 3) if torch_gflops else None,
                "vs_direct": line.get("vs_direct"),
                "pipelined_gflops": line.get("pipelined_gflops"),
                # A low peak marks a turn whose cores other work took.
                "fma_peak_gflops": peak.get("gflops"),
                "cistern_threads": peak.get("threads"),
                "pytorch_threads": torch.info.get("threads")}
        pairs.append(pair)
        print(json.dumps(pair), flush=True)


def median1(values):
    return round(statistics.median(values), 1)


def peak_fractions(pairs):
    """Each side's GFLOP/s over its round's FMA peak, the median over rounds:
    of the median sample, and of the fastest (like the peak, the fastest
    of its runs), for Cistern and for PyTorch."""
    fractions = {}
    for side, key in (("cistern", "cistern_gflops"), ("cistern_best", "cistern_best_gflops"),
                      ("pytorch", "pytorch_gflops"), ("pytorch_best", "pytorch_best_gflops")):
        values = [p[key] / p["fma_peak_gflops"] for p in pairs
                  if p.get(key) and p.get("fma_peak_gflops")]
        fractions[side] = round(statistics.median(values), 3) if values else None
    return fractions


def gemm_summary(pairs):
    medians = []
    for shape in dict.fromkeys(shape_of(p) for p in pairs):
        mine = [p for p in pairs if shape_of(p) == shape and p["ratio"]]
        if not mine:
            continue
        ratio = statistics.median(p["ratio"] for p in mine)
        medians.append(ratio)
        print(json.dumps({"bench": "versus_pytorch_summary", "what": "gemm",
                          **dict(zip(SHAPE_KEYS, shape)), "kernel": mine[0]["kernel"],
                          "median_cistern_gflops": median1([p["cistern_gflops"] for p in mine]),
                          "median_direct_gflops": median1([p["direct_gflops"] for p in mine]),
                          "median_pytorch_gflops": median1([p["pytorch_gflops"] for p in mine]),
                          "median_pipelined_gflops": median1([p["pipelined_gflops"] for p in mine]),
                          "median_ratio": round(ratio, 3),
                          "peak_fraction": peak_fractions(mine),
                          "median_vs_direct": round(statistics.median(p["vs_direct"] for p in mine), 3),
                          "rounds": len(mine)}))
    if medians:
        print(json.dumps({"bench": "versus_pytorch_summary", "what": "gemm", "shapes": len(medians),
                          "median_of_shape_ratios": round(statistics.median(medians), 3),
                          "lowest_shape_ratio": round(min(medians), 3)}))


# Run by --python: one training step per optimizer, timed to loss.item().
TORCH_TRAIN = r"""
import json, statistics, time
import torch
torch.set_num_threads(2)
torch.manual_seed(0)
x, y = torch.rand(256, 784) * 2 - 1, torch.rand(256, 10) * 2 - 1
for path in ("chain-sgd", "tape-adam"):
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    if path == "chain-sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    loss_fn = torch.nn.MSELoss()
    times = []
    for i in range(18):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        if i >= 3:
            times.append(time.perf_counter() - t)
    print(json.dumps({"bench": "pytorch_train_step", "path": path,
                      "ms_per_step": round(statistics.median(times) * 1e3, 3),
                      "threads": torch.get_num_threads()}), flush=True)
"""


def train_round(a, round_, pairs):
    lines = [l for l in json_lines([a.cistern, "bench", "train-step"])
             if l.get("bench") == "train_step"]
    ours = {l["path"]: l["ms_per_step"] for l in lines}
    kernels = {l["path"]: l["kernel_ms_per_step"] for l in lines}
    theirs = {l["path"]: l["ms_per_step"] for l in
              json_lines([a.python, "-c", TORCH_TRAIN], env=torch_env())
              if l.get("bench") == "pytorch_train_step"}
    for path in ("chain-sgd", "tape-adam"):
        pair = {"bench": "versus_pytorch", "what": "train-step", "path": path, "round": round_,
                "cistern_ms": ours[path], "cistern_kernel_ms": kernels[path],
                "vs_kernels": round(ours[path] / kernels[path], 3), "pytorch_ms": theirs[path],
                "speedup": round(theirs[path] / ours[path], 3)}
        pairs.append(pair)
        print(json.dumps(pair), flush=True)


def train_summary(pairs):
    for path in ("chain-sgd", "tape-adam"):
        mine = [p for p in pairs if p["path"] == path]
        print(json.dumps({"bench": "versus_pytorch_summary", "what": "train-step", "path": path,
                          "median_cistern_ms": statistics.median(p["cistern_ms"] for p in mine),
                          "median_pytorch_ms": statistics.median(p["pytorch_ms"] for p in mine),
                          "median_speedup": round(statistics.median(p["speedup"] for p in mine), 3),
                          "cistern_faster_rounds": sum(p["speedup"] > 1 for p in mine),
                          "rounds": len(mine)}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--what", choices=["adam", "adamw", "gemm", "train-step"], default="adam")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--cistern", default=os.path.join(HERE, "..", "target", "release", "cistern"))
    ap.add_argument("--threads", type=int, default=None,
                    help="gemm: both sides on this many threads (RAYON_NUM_THREADS, "
                         "torch.set_num_threads), the FMA peak too; default: every core")
    ap.add_argument("--shape", action="append", default=[],
                    help="gemm: only this shape, as bench gemm's --shape (repeatable)")
    a = ap.parse_args()
    pairs = []
    if a.what == "gemm":
        (shapes, spread) = cistern_shapes(a.cistern, a.shape)
        torch = TorchGemm(a.python, a.threads)
        print(json.dumps(torch.info), flush=True)
    for round_ in range(1, a.rounds + 1):
        if a.what == "gemm":
            gemm_round(a, round_, pairs, shapes, spread, torch)
        elif a.what == "train-step":
            train_round(a, round_, pairs)
        else:
            ours, theirs = cistern_optim(a.cistern, a.what), pytorch_optim(a.python, a.what)
            pair = {"bench": "versus_pytorch", "what": a.what, "round": round_,
                    "cistern_ms": ours, "pytorch_ms": theirs,
                    "speedup": round(theirs / ours, 3)}
            pairs.append(pair)
            print(json.dumps(pair), flush=True)
    if a.what == "gemm":
        torch.close()
        gemm_summary(pairs)
    elif a.what == "train-step":
        train_summary(pairs)
    else:
        speedups = [p["speedup"] for p in pairs]
        print(json.dumps({"bench": "versus_pytorch_summary", "what": a.what,
                          "median_cistern_ms": statistics.median(p["cistern_ms"] for p in pairs),
                          "median_pytorch_ms": statistics.median(p["pytorch_ms"] for p in pairs),
                          "median_speedup": round(statistics.median(speedups), 3),
                          "cistern_faster_rounds": sum(s > 1 for s in speedups),
                          "rounds": len(speedups)}))


if __name__ == "__main__":
    main()
