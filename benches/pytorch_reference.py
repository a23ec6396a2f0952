#!/usr/bin/env python3
"""PyTorch's CPU figures for the comparisons issue 8 asks for, measured on
this machine, so they can sit next to `cistern bench optim` and
`cistern bench gemm` taken in the same session.

Prints one JSON object per line:
  {"bench":"pytorch_optim","optimizer":..,"impl":"fused"|"foreach","params":N,"ms_per_step":..}
  {"bench":"pytorch_gemm","m":..,"n":..,"k":..,"gflops":..}

Usage: python3 benches/pytorch_reference.py [--params N] [--steps N]
           [--only optim|gemm] [--optimizer adam|adamw] [--impl fused|foreach]
Needs torch (pip install torch); it is not part of CI. To compare in turns
with Cistern's own benchmarks, use benches/versus_pytorch.py.
"""
import argparse
import json
import statistics
import time

import torch


def optim_step_ms(name, impl, params, steps):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(params))
    p.grad = torch.randn(params)
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    opt = cls([p], lr=1e-3, **{impl: True})
    for _ in range(3):
        opt.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def gemm_gflops(size, reps):
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    c = torch.empty(size, size)
    torch.mm(a, b, out=c)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=64 * 1024 * 1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", choices=["optim", "gemm"])
    ap.add_argument("--optimizer", choices=["adam", "adamw"])
    ap.add_argument("--impl", choices=["fused", "foreach"])
    a = ap.parse_args()
    print(json.dumps({"bench": "pytorch_info", "torch": torch.__version__,
                      "threads": torch.get_num_threads()}), flush=True)
    names = [a.optimizer] if a.optimizer else ["adam", "adamw"]
    impls = [a.impl] if a.impl else ["fused", "foreach"]
    for name in names if a.only != "gemm" else []:
        for impl in impls:
            ms = optim_step_ms(name, impl, a.params, a.steps)
            print(json.dumps({"bench": "pytorch_optim", "optimizer": name, "impl": impl,
                              "params": a.params, "ms_per_step": round(ms, 3)}), flush=True)
    for size in (512, 1024, 2048) if a.only != "optim" else ():
        g = gemm_gflops(size, 20 if size < 2048 else 8)
        print(json.dumps({"bench": "pytorch_gemm", "m": size, "n": size, "k": size,
                          "gflops": round(g, 1)}), flush=True)


if __name__ == "__main__":
    main()
