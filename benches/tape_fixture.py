#!/usr/bin/env python3
"""PyTorch's own values and gradients for the tape operations of issue 44,
written to a JSON fixture that `client/tests/tape/pytorch_ops.rs` reads
through the tape.

Writes client/tests/fixtures/tape_ops.json: per case the operation, its
arguments, its inputs (values stored: the test needs no random generator of
PyTorch's), the output, and each input's gradient of `Σ output ⊙ upstream`
(`upstream` stored too), in float32 as PyTorch computes them.

Usage: python3 benches/tape_fixture.py [--out PATH]
Needs torch (pip install torch --index-url https://download.pytorch.org/whl/cpu);
it is not part of CI: the fixture is committed.
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F


def flat(t):
    """Nine significant digits: every f32 reads back exactly."""
    return [float(f"{v:.9g}") for v in t.detach().reshape(-1).tolist()]


def values(shape, low=-2.0, high=2.0, positive=False):
    """Inputs rounded to 1/1024 (exact in f32 and in JSON), away from ties."""
    t = torch.rand(shape) * (high - low) + low
    if positive:
        t = t.abs() + 0.5
    return torch.round(t * 1024) / 1024


def case(op, args, inputs, fn, grads=None):
    """`fn(*inputs)` and the gradients of `Σ out ⊙ upstream` for the inputs
    whose index is in `grads` (every input by default)."""
    grads = range(len(inputs)) if grads is None else grads
    leaves = [x.clone().requires_grad_(i in grads) for i, x in enumerate(inputs)]
    out = fn(*leaves)
    upstream = torch.linspace(-1.0, 1.5, out.numel()).reshape(out.shape)
    (out * upstream).sum().backward()
    return {
        "op": op,
        "args": args,
        "inputs": [{"shape": list(x.shape), "data": flat(x)} for x in inputs],
        "grads": [flat(leaf.grad) if i in grads else None for i, leaf in enumerate(leaves)],
        "shape": list(out.shape),
        "output": flat(out),
        "upstream": flat(upstream),
    }


def cases():
    out = []
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
    for name, fn in binary.items():
        for a, b in [([2, 3, 4], [3, 1]), ([2, 1, 3], [2, 2, 1]), ([4], [2, 3, 4])]:
            out.append(case(name, {}, [values(a), values(b, positive=name == "div")], fn))
    x = values([2, 3, 4])
    out.append(case("sum_dim", {"dims": [0, 2], "keepdim": False}, [x],
                    lambda x: x.sum(dim=(0, 2))))
    out.append(case("mean_dim", {"dims": [-2], "keepdim": True}, [x],
                    lambda x: x.mean(dim=-2, keepdim=True)))
    for dim, keepdim in [(1, False), (-1, True), (0, False)]:
        out.append(case("max_dim", {"dim": dim, "keepdim": keepdim}, [x],
                        lambda x, d=dim, k=keepdim: torch.max(x, d, keepdim=k).values))
    # A row of ties: the gradient goes to the first maximal element.
    tied = torch.tensor([[1.0, 3.0, 3.0, -1.0], [2.0, 2.0, 2.0, 2.0]])
    out.append(case("max_dim", {"dim": 1, "keepdim": False}, [tied],
                    lambda x: torch.max(x, 1).values))
    out.append(case("reshape", {"shape": [6, -1]}, [x], lambda x: x.reshape(6, -1)))
    out.append(case("permute", {"dims": [2, 0, 1]}, [x], lambda x: x.permute(2, 0, 1)))
    out.append(case("transpose", {"dim0": 0, "dim1": -1}, [x], lambda x: x.transpose(0, -1)))
    out.append(case("narrow", {"dim": 1, "start": 1, "length": 2}, [x],
                    lambda x: x.narrow(1, 1, 2)))
    out.append(case("narrow", {"dim": 0, "start": 1, "length": 1}, [x],
                    lambda x: x.narrow(0, 1, 1)))
    out.append(case("cat", {"dim": 1}, [values([2, 2, 3]), values([2, 1, 3])],
                    lambda a, b: torch.cat([a, b], dim=1)))
    out.append(case("cat", {"dim": 0}, [values([1, 3]), values([2, 3])],
                    lambda a, b: torch.cat([a, b], dim=0)))
    for a, b in [([2, 3, 4], [2, 4, 5]), ([2, 1, 3, 4], [3, 4, 2]), ([3, 4], [2, 4, 5])]:
        out.append(case("matmul", {}, [values(a), values(b)], torch.matmul))
    out.append(case("layer_norm", {"normalized_shape": [5], "eps": 1e-5},
                    [values([2, 3, 5]), values([5]), values([5])],
                    lambda x, w, b: F.layer_norm(x, [5], w, b, 1e-5)))
    out.append(case("layer_norm", {"normalized_shape": [3, 4], "eps": 1e-5}, [values([2, 3, 4])],
                    lambda x: F.layer_norm(x, [3, 4], None, None, 1e-5)))
    indices = [[1, 4, 1], [0, 5, 1]]
    out.append(case("embedding", {"indices": [i for row in indices for i in row], "shape": [2, 3]},
                    [values([6, 4])], lambda w: F.embedding(torch.tensor(indices), w)))
    for name, fn in [("softmax_dim", F.softmax), ("log_softmax_dim", F.log_softmax)]:
        for dim in [1, -1]:
            out.append(case(name, {"dim": dim}, [values([2, 3, 4], -4, 4)],
                            lambda x, f=fn, d=dim: f(x, dim=d)))
    for name, fn in [("gelu", lambda x: F.gelu(x)), ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"))]:
        out.append(case(name, {}, [values([4, 8], -5, 5)], fn))
    q, k, v = values([2, 2, 3, 4]), values([2, 2, 5, 4]), values([2, 2, 5, 3])
    mask = torch.zeros(3, 5)
    mask[0, 3:] = -math.inf
    mask[1, 0] = -math.inf
    mask[2, 1] = 0.5
    out.append(case("sdpa", {"causal": False, "mask": True}, [q, k, v, mask],
                    lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                    grads=[0, 1, 2]))
    q, k, v = values([2, 4, 4]), values([2, 4, 4]), values([2, 4, 3])
    out.append(case("sdpa", {"causal": True, "mask": False}, [q, k, v],
                    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
    # Attention as a transformer writes it, the heads split from the
    # embedding and merged back: the tape's fused multi_head_attention.
    for causal in [False, True]:
        q, k, v = values([2, 3, 8]), values([2, 5, 8]), values([2, 5, 8])
        out.append(case("mha", {"heads": 2, "causal": causal}, [q, k, v],
                        lambda q, k, v, c=causal: multi_head(q, k, v, 2, c)))
    return out


def multi_head(q, k, v, heads, causal):
    """`[B, T, E]` split into heads, attended, merged back to `[B, L, E]`."""
    b, l, e = q.shape

    def split(x):
        return x.reshape(b, x.shape[1], heads, e // heads).transpose(1, 2)

    y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=causal)
    return y.transpose(1, 2).reshape(b, l, e)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "client", "tests", "fixtures", "tape_ops.json")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=default)
    args = parser.parse_args()
    torch.manual_seed(44)
    fixture = {"torch": torch.__version__, "cases": cases()}
    text = json.dumps(fixture, separators=(",", ":"))
    # -inf in a mask: JSON has no infinity, so the script writes a string.
    text = text.replace("-Infinity", '"-inf"')
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(f"{len(fixture['cases'])} cases, {len(text)} bytes to {args.out}")


if __name__ == "__main__":
    main()
