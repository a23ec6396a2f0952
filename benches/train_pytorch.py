"""The PyTorch peer of `cistern train`'s default run: the same MLP
(11-64-64-1, ReLU), batch 32, SGD lr 0.05, MSE, 780 steps on red wine
quality (standardised, 80/20 split), 2 threads. Prints one JSON line.

    ~/torch/bin/python3 benches/train_pytorch.py [CSV.gz]
"""
import glob, gzip, json, os, sys, time

import numpy as np
import torch

torch.set_num_threads(2)
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
