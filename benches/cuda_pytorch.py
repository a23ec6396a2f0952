"""PyTorch's side of the CUDA figures (scripts/gpu-check.sh runs it on the
GPU machine): fused Adam over one flat parameter tensor beside a
device-to-device copy of it, and torch.mm (cuBLAS) at bench gemm's shapes.
One JSON object per line, named as `cistern bench optim` and `bench gemm`
name theirs, so the two sides can be read against each other.

Usage: python3 benches/cuda_pytorch.py [--params N] [--steps N]
"""

import argparse
import json
import statistics

import torch


def timed_ms(run, samples, warmup=2):
    """Median milliseconds of `samples` event-timed calls of `run`."""
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(samples + warmup):
        begin.record()
        run()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(begin.elapsed_time(end))
    return statistics.median(times)


def adam(params, steps):
    """Fused Adam on `params` floats against a copy of them: 28 and 8 bytes a float."""
    weights = torch.zeros(params, device="cuda", dtype=torch.float32, requires_grad=True)
    weights.grad = torch.full_like(weights, 1e-3)
    optimizer = torch.optim.Adam([weights], lr=1e-3, fused=True)
    step_ms = timed_ms(optimizer.step, steps)
    spare = torch.empty_like(weights)
    copy_ms = timed_ms(lambda: spare.copy_(weights.detach()), steps)
    gb_per_s = 28 * params / (step_ms * 1e-3) / 1e9
    copy_gb_per_s = 8 * params / (copy_ms * 1e-3) / 1e9
    print(json.dumps({
        "bench": "pytorch_adam",
        "params": params,
        "fused": True,
        "steps": steps,
        "ms_per_step": round(step_ms, 4),
        "gb_per_s": round(gb_per_s, 1),
        "copy_gb_per_s": round(copy_gb_per_s, 1),
        "vs_copy": round(gb_per_s / copy_gb_per_s, 3),
    }), flush=True)


SHAPES = [
    (4096, 4096, 4096, False, False),
    (512, 512, 512, False, False),
    (1024, 1024, 1024, False, False),
    (2048, 2048, 2048, False, False),
    (256, 1024, 784, False, False),
    (256, 1024, 1024, False, False),
    (784, 1024, 256, True, False),
    (1024, 1024, 256, True, False),
    (256, 784, 1024, False, True),
    (256, 1024, 1024, False, True),
]


def gemms():
    """torch.mm in fp32 (no TF32) at each shape, its operands stored as bench gemm's."""
    torch.backends.cuda.matmul.allow_tf32 = False
    for m, n, k, ta, tb in SHAPES:
        a = torch.rand(k, m, device="cuda") if ta else torch.rand(m, k, device="cuda")
        b = torch.rand(n, k, device="cuda") if tb else torch.rand(k, n, device="cuda")
        op_a = a.t() if ta else a
        op_b = b.t() if tb else b
        out = torch.empty(m, n, device="cuda")
        flops = 2.0 * m * n * k
        samples = max(5, min(50, int(2e12 / flops)))
        ms = timed_ms(lambda: torch.mm(op_a, op_b, out=out), samples)
        print(json.dumps({
            "bench": "pytorch_gemm",
            "m": m, "n": n, "k": k,
            "transpose_a": ta, "transpose_b": tb,
            "gflops": round(flops / (ms * 1e6), 1),
        }), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=1 << 28)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps({
        "bench": "pytorch_device",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "name": torch.cuda.get_device_name(0),
    }), flush=True)
    adam(args.params, args.steps)
    gemms()


if __name__ == "__main__":
    main()
