"""One rank of the DDP benchmark (benches/python/ddp.py launches it with torchrun).

argv: device (cpu | pjrt), eager mode (ignored on cpu), steps, output JSON path. Trains an MLP
with DDP, one `loss.item()` per step (the step's sync), and rank 0 writes the per-step times and,
on pjrt, the seconds spent in collectives."""

import json
import sys
import time

import torch
import torch.distributed as dist

device, mode, steps, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if device == "pjrt":
    import torch_pjrt

    torch_pjrt.set_eager_mode(mode)
    dist.init_process_group("pjrt")
else:
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
width = 512
model = torch.nn.Sequential(
    *[m for _ in range(4) for m in (torch.nn.Linear(width, width), torch.nn.GELU())],
    torch.nn.Linear(width, 10),
).to(device)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(rank)
batches = [
    (torch.randn(64, width, generator=gen).to(device), torch.randint(0, 10, (64,), generator=gen).to(device))
    for _ in range(4)
]


def step(i):
    x, y = batches[i % len(batches)]
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    loss.backward()
    opt.step()
    return loss.item()


for i in range(5):  # warm-up: compiles, DDP's bucket rebuild after the first step
    step(i)
dist.barrier()
collective_seconds = 0.0
if device == "pjrt":
    torch_pjrt.reset_metrics()
times = []
for i in range(steps):
    start = time.perf_counter()
    step(i)
    times.append(time.perf_counter() - start)
if device == "pjrt":
    m = torch_pjrt.metrics()
    collective_seconds = m["collective_seconds"]
    compilations = m["compilations"]
else:
    compilations = 0
if rank == 0:
    with open(out_path, "w") as f:
        json.dump({"times": times, "collective_seconds": collective_seconds,
                   "compilations": compilations}, f)
dist.destroy_process_group()
