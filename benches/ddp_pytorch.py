"""PyTorch DDP's weak scaling on the bench MLP, the peer of `cistern bench
data-parallel`: 784-1024-1024-10 (ReLU, ReLU), MSE, Adam, batch 256 per
rank, one thread per rank, gloo over localhost. Prints one JSON line: one
rank alone against two ranks under DistributedDataParallel (its 25 MiB
buckets, the reduction overlapping the backward), each a median step time
up to `loss.item()`.

    ~/torch/bin/python3 benches/ddp_pytorch.py
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WARMUP, STEPS, BATCH = 3, 20, 256


def model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    )


def steps(net, optimizer):
    x, y = torch.randn(BATCH, 784), torch.randn(BATCH, 10)
    loss_fn = nn.MSELoss()
    times = []
    for step in range(WARMUP + STEPS):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        optimizer.step()
        loss.item()
        if step >= WARMUP:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def rank_main(rank, world, results):
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    net = nn.parallel.DistributedDataParallel(model())
    seconds = steps(net, torch.optim.Adam(net.parameters(), lr=1e-4))
    if rank == 0:
        results.put(seconds)
    dist.destroy_process_group()


def main():
    torch.set_num_threads(1)
    alone = model()
    one = steps(alone, torch.optim.Adam(alone.parameters(), lr=1e-4))
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(2, results), nprocs=2, join=True)
    two = results.get()
    print(json.dumps({
        "bench": "ddp_pytorch",
        "replicas": 2,
        "batch_per_replica": BATCH,
        "one_replica_ms": round(one * 1e3, 3),
        "group_ms": round(two * 1e3, 3),
        "efficiency": round(one / two, 3),
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    sys.exit(main())
