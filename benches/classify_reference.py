#!/usr/bin/env python3
"""PyTorch's own values for the classification operations (issue 43), written
to a JSON fixture that `client/tests/tape/pytorch.rs` reads through the tape.

Writes client/tests/fixtures/classify_pytorch.json: the inputs (so the test
needs no random generator of PyTorch's), and per case the loss and the
input's gradient from autograd, in float32 as PyTorch computes them.

Usage: python3 benches/classify_reference.py [--out PATH]
Needs torch (pip install torch --index-url https://download.pytorch.org/whl/cpu);
it is not part of CI: the fixture is committed.
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F


def flat(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


def class_case(op, logits, targets, weight, reduction, ignore_index, smoothing):
    x = logits.clone().requires_grad_(True)
    w = weight if weight is not None else None
    if op == "cross_entropy":
        loss = F.cross_entropy(x, targets, weight=w, ignore_index=ignore_index,
                               reduction=reduction, label_smoothing=smoothing)
    else:
        loss = F.nll_loss(F.log_softmax(x, dim=-1), targets, weight=w,
                          ignore_index=ignore_index, reduction=reduction)
    upstream = torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape)
    loss.backward(upstream)
    return {
        "op": op,
        "reduction": reduction,
        "weighted": weight is not None,
        "ignore_index": ignore_index,
        "label_smoothing": smoothing,
        "upstream": flat(upstream),
        "loss": flat(loss),
        "grad": flat(x.grad),
    }


def bce_case(logits, target, pos_weight, weight, reduction):
    x = logits.clone().requires_grad_(True)
    loss = F.binary_cross_entropy_with_logits(x, target, weight=weight,
                                              pos_weight=pos_weight, reduction=reduction)
    upstream = torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape)
    loss.backward(upstream)
    return {
        "reduction": reduction,
        "pos_weighted": pos_weight is not None,
        "weighted": weight is not None,
        "upstream": flat(upstream),
        "loss": flat(loss),
        "grad": flat(x.grad),
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "client", "tests", "fixtures", "classify_pytorch.json")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=default)
    args = parser.parse_args()

    torch.manual_seed(43)
    rows, classes = 8, 5
    logits = torch.randn(rows, classes) * 3
    # Row 2: equal logits; row 5: ±1e30.
    logits[2] = 1.5
    logits[5] = torch.tensor([1e30, -1e30, 0.0, -1e30, 1e30])
    targets = torch.tensor([0, 4, 2, -100, 1, 0, 3, 2])
    weight = torch.rand(classes) + 0.5
    cases = []
    for op in ["cross_entropy", "nll_loss"]:
        for reduction in ["mean", "sum", "none"]:
            for w in [None, weight]:
                smoothings = [0.0, 0.25] if op == "cross_entropy" else [0.0]
                # With smoothing every class counts: the ±1e30 row makes the
                # loss ~1e29, still finite.
                for smoothing in smoothings:
                    cases.append(class_case(op, logits, targets, w, reduction, -100, smoothing))
    # A non-default ignore_index that is a real class.
    cases.append(class_case("cross_entropy", logits, torch.tensor([0, 4, 2, 3, 1, 0, 3, 2]),
                            None, "mean", 3, 0.0))

    bce_logits = torch.randn(4, 3) * 4
    bce_logits[0, 0] = 1e30
    bce_logits[0, 1] = -1e30
    bce_target = torch.rand(4, 3).round()
    bce_target[1, 2] = 0.3
    pos_weight = torch.tensor([0.5, 2.0, 3.0])
    bce_weight = torch.rand(4, 3) + 0.5
    bce = []
    for reduction in ["mean", "sum", "none"]:
        for pw in [None, pos_weight]:
            for w in [None, bce_weight]:
                bce.append(bce_case(bce_logits, bce_target, pw, w, reduction))

    fixture = {
        "torch": torch.__version__,
        "rows": rows,
        "classes": classes,
        "logits": flat(logits),
        "targets": [int(t) for t in targets.tolist()],
        "weight": flat(weight),
        "softmax": flat(F.softmax(logits, dim=-1)),
        "log_softmax": flat(F.log_softmax(logits, dim=-1)),
        "cases": cases,
        "bce_shape": list(bce_logits.shape),
        "bce_logits": flat(bce_logits),
        "bce_target": flat(bce_target),
        "bce_pos_weight": flat(pos_weight),
        "bce_weight": flat(bce_weight),
        "bce": bce,
    }
    with open(args.out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(json.dumps({"wrote": os.path.relpath(args.out), "cases": len(cases), "bce": len(bce)}))


if __name__ == "__main__":
    main()
