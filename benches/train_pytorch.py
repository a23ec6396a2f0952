"""The PyTorch peer of `cistern train`'s default run: the same MLP
(11-64-64-1, ReLU), batch 32, SGD lr 0.05, MSE, 780 steps on red wine
quality (standardised, 80/20 split), 2 threads. Prints one JSON line.

    ~/torch/bin/python3 benches/train_pytorch.py [CSV.gz]

With `--dataset digits`, the peer of `cistern train --dataset digits`: the
MLP 64-64-64-10 (ReLU), batch 32, SGD lr 0.05, cross-entropy, 880 steps
on the 8x8 digits (smartcore's copy, standardised, 80/20 split).
"""
import glob, gzip, json, os, random, struct, sys, time

import torch

torch.set_num_threads(2)


def digits():
    """smartcore's digits.xy: u64 features, u64 samples, then f32 pixels and labels."""
    path = sorted(glob.glob(os.path.expanduser(
        "~/.cargo/registry/src/*/smartcore-*/src/dataset/digits.xy")))[-1]
    raw = open(path, "rb").read()
    features, samples = struct.unpack_from("<QQ", raw)
    x = torch.tensor(struct.unpack_from(f"<{features * samples}f", raw, 16)).reshape(samples, features)
    y = torch.tensor(struct.unpack_from(f"<{samples}f", raw, 16 + 4 * features * samples)).long()
    order = list(range(samples))
    random.Random(0).shuffle(order)
    held = round(samples * 0.2)
    val, train = torch.tensor(order[:held]), torch.tensor(order[held:])
    mean, std = x[train].mean(0), x[train].std(0, unbiased=False)
    std[std < 1e-12] = 1
    x = (x - mean) / std
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = x[train], y[train]
    steps, batch, per_epoch = 880, 32, len(xt) // 32
    start = time.perf_counter()
    for step in range(steps):
        if step % per_epoch == 0:
            perm = torch.randperm(len(xt))
        rows = perm[(step % per_epoch) * batch:(step % per_epoch + 1) * batch]
        opt.zero_grad()
        loss = loss_fn(model(xt[rows]), yt[rows])
        loss.backward()
        opt.step()
        loss.item()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        accuracy = float((model(x[val]).argmax(1) == y[val]).float().mean())
    print(json.dumps({"bench": "train_pytorch", "dataset": "digits", "steps": steps,
                      "steps_per_s": steps / seconds, "val_accuracy": accuracy,
                      "torch": torch.__version__}))


if "--dataset" in sys.argv:
    dataset = sys.argv[sys.argv.index("--dataset") + 1]
    if dataset != "digits":
        sys.exit(f"--dataset {dataset}: this peer knows digits (and, without --dataset, winequality)")
    digits()
    sys.exit(0)

import numpy as np

path = sys.argv[1] if len(sys.argv) > 1 else sorted(glob.glob(os.path.expanduser(
    "~/.cargo/registry/src/*/linfa-datasets-*/data/winequality-red.csv.gz")))[-1]
data = np.loadtxt(gzip.open(path, "rt"), delimiter=",", skiprows=1, dtype=np.float32)
rng = np.random.default_rng(0)
order = rng.permutation(len(data))
held = round(len(data) * 0.2)
val, train = data[order[:held]], data[order[held:]]
mean, std = train.mean(0), train.std(0)
std[std < 1e-12] = 1
train, val = (train - mean) / std, (val - mean) / std
x, y = torch.from_numpy(train[:, :11]), torch.from_numpy(train[:, 11:])
xv, yv = torch.from_numpy(val[:, :11]), torch.from_numpy(val[:, 11:])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(11, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                            torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = torch.nn.MSELoss()
steps, batch, per_epoch = 780, 32, len(x) // 32
start = time.perf_counter()
for step in range(steps):
    if step % per_epoch == 0:
        perm = torch.randperm(len(x))
    rows = perm[(step % per_epoch) * batch:(step % per_epoch + 1) * batch]
    opt.zero_grad()
    loss = loss_fn(model(x[rows]), y[rows])
    loss.backward()
    opt.step()
    loss.item()
seconds = time.perf_counter() - start
with torch.no_grad():
    val_mse = float(loss_fn(model(xv), yv)) * float(std[11]) ** 2
print(json.dumps({"bench": "train_pytorch", "steps": steps, "steps_per_s": steps / seconds,
                  "val_mse": val_mse, "torch": torch.__version__}))
