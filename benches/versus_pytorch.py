#!/usr/bin/env python3
"""Cistern against PyTorch on this machine, measured in turns.

Memory bandwidth on a shared machine drifts by up to 2x within minutes, so
one run of each, minutes apart, compares the weather rather than the code.
This runs `cistern bench optim` / `cistern bench gemm` and
`benches/pytorch_reference.py` alternately, round after round, and prints
one JSON line per pair plus a summary (medians, and how many rounds
Cistern won).

Usage: python3 benches/versus_pytorch.py [--rounds N] [--what adam|adamw|gemm]
       [--python PYTHON_WITH_TORCH] [--cistern target/release/cistern]
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


def json_lines(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def cistern_optim(binary, name):
    lines = json_lines([binary, "bench", "optim", "--optimizer", name, "--params", str(PARAMS)])
    (line,) = [l for l in lines if l.get("bench") == "optim"]
    return line["ms_per_step"]


def pytorch_optim(python, name):
    lines = json_lines([python, os.path.join(HERE, "pytorch_reference.py"), "--only", "optim",
                        "--optimizer", name, "--impl", "fused", "--params", str(PARAMS)])
    (line,) = [l for l in lines if l.get("bench") == "pytorch_optim"]
    return line["ms_per_step"]


def cistern_gemm(binary):
    return {l["m"]: l["gflops"] for l in json_lines([binary, "bench", "gemm"])
            if l.get("bench") == "gemm"}


def pytorch_gemm(python):
    lines = json_lines([python, os.path.join(HERE, "pytorch_reference.py"), "--only", "gemm"])
    return {l["m"]: l["gflops"] for l in lines if l.get("bench") == "pytorch_gemm"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--what", choices=["adam", "adamw", "gemm"], default="adam")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--cistern", default=os.path.join(HERE, "..", "target", "release", "cistern"))
    a = ap.parse_args()
    pairs = []
    for round_ in range(1, a.rounds + 1):
        if a.what == "gemm":
            ours, theirs = cistern_gemm(a.cistern), pytorch_gemm(a.python)
            for size in sorted(ours):
                pair = {"bench": "versus_pytorch", "what": "gemm", "round": round_, "n": size,
                        "cistern_gflops": ours[size], "pytorch_gflops": theirs.get(size),
                        "ratio": round(ours[size] / theirs[size], 3) if theirs.get(size) else None}
                pairs.append(pair)
                print(json.dumps(pair), flush=True)
        else:
            ours, theirs = cistern_optim(a.cistern, a.what), pytorch_optim(a.python, a.what)
            pair = {"bench": "versus_pytorch", "what": a.what, "round": round_,
                    "cistern_ms": ours, "pytorch_ms": theirs,
                    "speedup": round(theirs / ours, 3)}
            pairs.append(pair)
            print(json.dumps(pair), flush=True)
    if a.what == "gemm":
        for size in sorted({p["n"] for p in pairs}):
            ratios = [p["ratio"] for p in pairs if p["n"] == size and p["ratio"]]
            print(json.dumps({"bench": "versus_pytorch_summary", "what": "gemm", "n": size,
                              "median_ratio": round(statistics.median(ratios), 3),
                              "rounds": len(ratios)}))
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
