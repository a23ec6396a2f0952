"""The PyTorch peer of `cargo run --release -p cistern-cli --example
vit_digits`: the same vision transformer on the 8x8 digits (smartcore's
copy, pixels / 16, each image its 8 rows of 8 pixels; a learned class
token put first), 2 pre-norm blocks (d 64, 4
heads with separate q, k, v projections, GELU MLP 128, dropout 0.1), a
layer norm and a linear head on the class token; AdamW lr 1e-3, weight
decay 0.05, batch 64, 2 threads, eager. Prints one JSON line: the mean
step time (forward, backward, step; the loss read each step as Cistern's
example does) and the validation accuracy.

    ~/torch/bin/python3 benches/vit_pytorch.py [--epochs 60]
"""
import glob, json, os, random, struct, sys, time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
D, HEADS, HIDDEN, TOKENS, BLOCKS = 64, 4, 128, 9, 2


def digits():
    """smartcore's digits.xy: u64 features, u64 samples, then f32 pixels and labels."""
    path = sorted(glob.glob(os.path.expanduser(
        "~/.cargo/registry/src/*/smartcore-*/src/dataset/digits.xy")))[-1]
    raw = open(path, "rb").read()
    features, samples = struct.unpack_from("<QQ", raw)
    x = torch.tensor(struct.unpack_from(f"<{features * samples}f", raw, 16)).reshape(samples, 8, 8)
    y = torch.tensor(struct.unpack_from(f"<{samples}f", raw, 16 + 4 * features * samples)).long()
    x = x / 16
    order = list(range(samples))
    random.Random(0).shuffle(order)
    split = samples * 4 // 5
    train, val = torch.tensor(order[:split]), torch.tensor(order[split:])
    return (x[train], y[train]), (x[val], y[val])


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(D, D) for _ in range(4))
        self.fc1, self.fc2 = torch.nn.Linear(D, HIDDEN), torch.nn.Linear(HIDDEN, D)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        b = x.shape[0]
        h = self.ln1(x)
        heads = lambda t: t.reshape(b, TOKENS, HEADS, -1).permute(0, 2, 1, 3)
        a = F.scaled_dot_product_attention(heads(self.q(h)), heads(self.k(h)), heads(self.v(h)))
        a = self.o(a.permute(0, 2, 1, 3).reshape(b, TOKENS, D))
        x = x + self.drop(a)
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class ViT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = torch.nn.Linear(8, D)
        self.cls = torch.nn.Parameter(torch.empty(1, 1, D).uniform_(-0.02, 0.02))
        self.position = torch.nn.Parameter(torch.empty(TOKENS, D).uniform_(-0.02, 0.02))
        self.blocks = torch.nn.Sequential(*(Block() for _ in range(BLOCKS)))
        self.norm, self.head = torch.nn.LayerNorm(D), torch.nn.Linear(D, 10)

    def forward(self, x):
        x = torch.cat([self.cls.expand(x.shape[0], 1, D), self.patch(x)], dim=1)
        x = self.blocks(x + self.position)
        return self.head(self.norm(x)[:, 0])


def main():
    epochs = int(sys.argv[sys.argv.index("--epochs") + 1]) if "--epochs" in sys.argv else 60
    (xt, yt), (xv, yv) = digits()
    torch.manual_seed(0)
    model = ViT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    steps, elapsed = 0, 0.0
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(xt))
        for start in range(0, len(xt), 64):
            batch = order[start:start + 64]
            began = time.perf_counter()
            loss = F.cross_entropy(model(xt[batch]), yt[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            elapsed += time.perf_counter() - began
            steps += 1
    model.eval()
    with torch.no_grad():
        accuracy = (model(xv).argmax(1) == yv).float().mean().item()
    print(json.dumps({"bench": "vit_pytorch", "epochs": epochs, "steps": steps,
                      "step_ms": round(1000 * elapsed / steps, 3),
                      "validation_accuracy": round(accuracy, 4),
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
