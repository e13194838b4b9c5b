"""A DDP training run on device "pjrt", launched by torchrun from tests/python/test_distributed.py.

argv: model (mlp | tinygpt), eager mode, steps, output JSON path. Every rank trains on its slice of
the same global batches; rank 0 writes the global losses (the mean of the ranks' losses) and the
final parameters, for the test to compare with one process training on the whole batch."""

import json
import sys

import torch
import torch.distributed as dist

import torch_pjrt

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from models import build, global_batches  # noqa: E402

model_name, mode, steps, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch_pjrt.set_eager_mode(mode)
dist.init_process_group("pjrt")
rank, world = dist.get_rank(), dist.get_world_size()

model, loss_fn = build(model_name)
model = model.to("pjrt")
ddp = torch.nn.parallel.DistributedDataParallel(model)
ddp._set_ddp_runtime_logging_sample_rate(1)  # DDP's own timing of every step, through its timer
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
losses = []
for inputs, targets in global_batches(model_name, steps):
    share = inputs.shape[0] // world
    x = inputs[rank * share : (rank + 1) * share].to("pjrt")
    y = targets[rank * share : (rank + 1) * share].to("pjrt")
    opt.zero_grad()
    loss = loss_fn(ddp(x), y)
    loss.backward()
    opt.step()
    global_loss = loss.detach().clone()
    dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)
    losses.append(global_loss.item())

metrics = torch_pjrt.metrics()
logging = ddp._get_ddp_logging_data()
if rank == 0:
    with open(out_path, "w") as f:
        json.dump(
            {
                "losses": losses,
                "params": {k: v.detach().cpu().flatten().tolist() for k, v in model.state_dict().items()},
                "collectives": metrics["collectives"],
                "fallback_ops": metrics["fallback_ops"],
                "ddp_times": {
                    k: logging.get(k, 0)
                    for k in ("avg_forward_compute_time", "avg_backward_compute_time",
                              "avg_backward_comm_time")
                },
            },
            f,
        )
dist.destroy_process_group()
