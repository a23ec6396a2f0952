#!/usr/bin/env python3
"""Cistern's fused cross-entropy forward + backward against PyTorch's
`F.cross_entropy(x, t)` + `.backward()`, a 256x1000 batch on the CPU,
measured in turns: `cistern bench cross-entropy` (median of its samples),
then PyTorch's median of as many samples, round after round. Prints one
JSON line per round and a summary (medians of the rounds' medians, and the
ratio the issue's target reads: Cistern / PyTorch <= 1.0).

Usage: ~/torch/bin/python3 benches/cross_entropy_pytorch.py [--rounds N]
           [--samples N] [--cistern target/release/cistern] [--threads N]
Build first: cargo build --release. Not part of CI (it needs torch).
"""
import argparse
import json
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

ROWS, CLASSES = 256, 1000


def pytorch_ms(samples):
    torch.manual_seed(0)
    x = (torch.rand(ROWS, CLASSES) * 8 - 4).requires_grad_(True)
    t = torch.randint(0, CLASSES, (ROWS,))
    for _ in range(5):
        F.cross_entropy(x, t).backward()
    times = []
    for _ in range(samples):
        x.grad = None
        begun = time.perf_counter()
        loss = F.cross_entropy(x, t)
        loss.backward()
        times.append(time.perf_counter() - begun)
    return statistics.median(times) * 1e3


def cistern_line(binary, samples):
    out = subprocess.run([binary, "bench", "cross-entropy", "--samples", str(samples)],
                         check=True, capture_output=True, text=True).stdout
    (line,) = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return line


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--cistern", default="target/release/cistern")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ours, theirs, kernels = [], [], []
    for round_ in range(args.rounds):
        line = cistern_line(args.cistern, args.samples)
        torch_ms = pytorch_ms(args.samples)
        ours.append(line["ms"])
        kernels.append(line["kernel_ms"])
        theirs.append(torch_ms)
        print(json.dumps({"round": round_, "cistern_ms": line["ms"],
                          "cistern_kernel_ms": line["kernel_ms"], "pytorch_ms": round(torch_ms, 4)}))
    summary = {
        "bench": "cross_entropy_versus_pytorch", "rows": ROWS, "classes": CLASSES,
        "cistern_ms": statistics.median(ours), "cistern_kernel_ms": statistics.median(kernels),
        "pytorch_ms": round(statistics.median(theirs), 4),
        "ratio": round(statistics.median(ours) / statistics.median(theirs), 3),
        "kernel_ratio": round(statistics.median(kernels) / statistics.median(theirs), 3),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
