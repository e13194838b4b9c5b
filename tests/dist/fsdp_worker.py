"""FSDP2 (fully_shard) of TinyGPT and DTensor ops on a 1-D "pjrt" device mesh, launched by torchrun
from tests/python/test_distributed.py. argv: eager mode, steps, output JSON path."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import torch_pjrt

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from models import build, global_batches  # noqa: E402

mode, steps, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch_pjrt.set_eager_mode(mode)
mesh = init_device_mesh("pjrt", (2,))  # init_process_group() without a backend
rank, world = dist.get_rank(), dist.get_world_size()
backend_config = str(dist.get_backend_config())
cpu = torch.ones(2)
dist.all_reduce(cpu)  # a CPU tensor finds gloo in the default group

model, loss_fn = build("tinygpt")
model = model.to("pjrt")
for block in model.blocks.layers:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
losses = []
for inputs, targets in global_batches("tinygpt", steps):
    share = inputs.shape[0] // world
    x = inputs[rank * share : (rank + 1) * share].to("pjrt")
    y = targets[rank * share : (rank + 1) * share].to("pjrt")
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    global_loss = loss.detach().clone()
    dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
    losses.append(global_loss.item())

torch.manual_seed(5)
a, b = torch.randn(8, 6), torch.randn(6, 4)
da = distribute_tensor(a.to("pjrt"), mesh, [Shard(0)])
db = distribute_tensor(b.to("pjrt"), mesh, [Replicate()])
errors = {
    "elementwise": ((da.relu() * 2 + 1).full_tensor().cpu() - (a.relu() * 2 + 1)).abs().max().item(),
    "matmul": ((da @ db).full_tensor().cpu() - a @ b).abs().max().item(),
    "redistribute": (da.redistribute(mesh, [Replicate()]).to_local().cpu() - a).abs().max().item(),
    "sum": (da.sum().full_tensor().cpu() - a.sum()).abs().item(),
}
metrics = torch_pjrt.metrics()
if rank == 0:
    with open(out_path, "w") as f:
        json.dump(
            {
                "backend_config": backend_config,
                "cpu_all_reduce": cpu.tolist(),
                "losses": losses,
                "dtensor_errors": errors,
                "fallback_ops": metrics["fallback_ops"],
            },
            f,
        )
dist.destroy_process_group()
