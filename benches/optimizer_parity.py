#!/usr/bin/env python3
"""Writes kernels/tests/fixtures/pytorch_optimizers.txt: each optimizer
family (PyTorch's defaults, and the options that change its arithmetic)
run by torch.optim on the CPU in float32 for 20 steps over fixed
parameters and gradients; kernels/tests/pytorch_parity.rs runs Cistern's
kernels over the same numbers and holds them to PyTorch's result.

Format, one item a line: `params V...`, then `grad V...` per step, shared
by every case; then per case `case NAME` and `want V...` (the parameters
after the last step). Values are float32, written exactly.

Usage: python3 benches/optimizer_parity.py   (needs torch; not part of CI)
"""
import math
import pathlib

import torch

N = 96
STEPS = 20

CASES = [
    ("sgd", torch.optim.SGD, dict(lr=0.01)),
    ("sgd_momentum_nesterov_decay", torch.optim.SGD,
     dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("adam", torch.optim.Adam, dict()),
    ("adam_amsgrad_decay", torch.optim.Adam, dict(amsgrad=True, weight_decay=0.01)),
    ("adamw", torch.optim.AdamW, dict()),
    ("rmsprop", torch.optim.RMSprop, dict()),
    ("rmsprop_centered_momentum_decay", torch.optim.RMSprop,
     dict(centered=True, momentum=0.9, weight_decay=0.01)),
    ("adagrad", torch.optim.Adagrad, dict()),
    ("adagrad_lr_decay_decay", torch.optim.Adagrad, dict(lr_decay=0.01, weight_decay=0.01)),
]


def values(fn):
    return torch.tensor([fn(i) for i in range(N)], dtype=torch.float32)


def line(tag, tensor):
    return tag + " " + " ".join(repr(float(v)) for v in tensor.tolist())


def main():
    torch.set_num_threads(1)
    params0 = values(lambda i: 0.25 + math.sin(0.7 * i + 0.1))
    grads = [values(lambda i, t=t: math.sin(1.3 * i + 0.77 * t) * 10 ** (i % 5 - 3))
             for t in range(STEPS)]
    out = [line("params", params0)]
    out.extend(line("grad", g) for g in grads)
    for name, cls, options in CASES:
        p = torch.nn.Parameter(params0.clone())
        opt = cls([p], foreach=False, **options)
        for g in grads:
            p.grad = g.clone()
            opt.step()
        out.append(f"case {name}")
        out.append(line("want", p.detach()))
    path = pathlib.Path(__file__).resolve().parent.parent / "kernels/tests/fixtures/pytorch_optimizers.txt"
    path.write_text(f"# torch {torch.__version__}, written by benches/optimizer_parity.py\n"
                    + "\n".join(out) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
