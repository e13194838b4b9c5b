"""One rank of a two-rank job that goes wrong on purpose; launched directly (not by torchrun, which
would kill the other rank) by tests/python/test_distributed.py.

argv: scenario (raise | diverge | timeout), rank, world size, port, timeout seconds."""

import datetime
import sys
import time

import torch
import torch.distributed as dist

import torch_pjrt  # noqa: F401

scenario, rank, world, port, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
dist.init_process_group(
    "pjrt",
    init_method=f"tcp://127.0.0.1:{port}",
    rank=rank,
    world_size=world,
    timeout=datetime.timedelta(seconds=timeout),
)
x = torch.ones(4, device="pjrt") * (rank + 1)
dist.all_reduce(x)  # every rank gets this far together
print(f"rank {rank} ready", flush=True)

if scenario == "raise":
    if rank == 1:
        raise RuntimeError("rank one gave up")
    dist.all_reduce(x)
elif scenario == "diverge":
    if rank == 1:
        dist.broadcast(torch.ones(5, device="pjrt"), src=0)
    else:
        dist.all_reduce(x)
elif scenario == "timeout":
    if rank == 1:
        time.sleep(2.5 * timeout)
    dist.all_reduce(x)
print(f"rank {rank} finished without an error", flush=True)
