"""Every collective on pjrt tensors against the same collective on CPU tensors through gloo.

Launched by torchrun from tests/python/test_distributed.py; argv: eager mode, output directory.
Each rank writes rank<N>.json: a list of [check, passed, detail]."""

import json
import os
import sys

import torch
import torch.distributed as dist

import torch_pjrt

mode, out_dir = sys.argv[1], sys.argv[2]
torch_pjrt.set_eager_mode(mode)
dist.init_process_group("pjrt")
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
results = []


def same(name, got, want):
    got = [g.cpu() if isinstance(g, torch.Tensor) else g for g in got]
    ok = len(got) == len(want) and all(
        g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want)
    )
    detail = "" if ok else f"got {got} want {want}"
    results.append([name, ok, detail])


def values(dtype, shape, salt=0):
    base = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape)
    v = (base + 3 * rank + salt) % 7 + 1
    return v.to(dtype)


dtypes = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.uint8]
for dtype in dtypes:
    for op_name in ["SUM", "PRODUCT", "MIN", "MAX"]:
        if dtype == torch.uint8 and op_name == "PRODUCT":
            continue
        op = getattr(dist.ReduceOp, op_name)
        x, c = values(dtype, (5, 3)).to("pjrt"), values(dtype, (5, 3))
        dist.all_reduce(x, op=op)
        dist.all_reduce(c, op=op, group=gloo)
        same(f"all_reduce {op_name} {dtype}", [x], [c])

    x, c = values(dtype, (4,)).to("pjrt"), values(dtype, (4,))
    dist.broadcast(x, src=world - 1)
    dist.broadcast(c, src=world - 1, group=gloo)
    same(f"broadcast {dtype}", [x], [c])

    x, c = values(dtype, (2, 3)).to("pjrt"), values(dtype, (2, 3))
    dist.reduce(x, dst=1, op=dist.ReduceOp.SUM)
    dist.reduce(c, dst=1, op=dist.ReduceOp.SUM, group=gloo)
    # Only the destination's result is defined; pjrt leaves the others' tensors as they were
    # (gloo leaves partial sums in them).
    same(f"reduce {dtype}", [x], [c if rank == 1 else values(dtype, (2, 3))])

    outs = [torch.empty(3, dtype=dtype, device="pjrt") for _ in range(world)]
    cpu_outs = [torch.empty(3, dtype=dtype) for _ in range(world)]
    dist.all_gather(outs, values(dtype, (3,)).to("pjrt"))
    dist.all_gather(cpu_outs, values(dtype, (3,)), group=gloo)
    same(f"all_gather {dtype}", outs, cpu_outs)

    out, cpu_out = torch.empty(world * 2, 3, dtype=dtype, device="pjrt"), torch.empty(world * 2, 3, dtype=dtype)
    dist.all_gather_into_tensor(out, values(dtype, (2, 3)).to("pjrt"))
    dist.all_gather_into_tensor(cpu_out, values(dtype, (2, 3)), group=gloo)
    same(f"all_gather_into_tensor {dtype}", [out], [cpu_out])

    out, cpu_out = torch.empty(2, 3, dtype=dtype, device="pjrt"), torch.empty(2, 3, dtype=dtype)
    dist.reduce_scatter_tensor(out, values(dtype, (world * 2, 3)).to("pjrt"))
    dist.reduce_scatter_tensor(cpu_out, values(dtype, (world * 2, 3)), group=gloo)
    same(f"reduce_scatter_tensor {dtype}", [out], [cpu_out])

    out, cpu_out = torch.empty(4, dtype=dtype, device="pjrt"), torch.empty(4, dtype=dtype)
    dist.reduce_scatter(out, [values(dtype, (4,), s).to("pjrt") for s in range(world)])
    dist.reduce_scatter(cpu_out, [values(dtype, (4,), s) for s in range(world)], group=gloo)
    same(f"reduce_scatter {dtype}", [out], [cpu_out])

# AVG and PREMUL_SUM: gloo has neither on the CPU, so the reference is a sum then a scale.
x, c = values(torch.float32, (6,)).to("pjrt"), values(torch.float32, (6,))
dist.all_reduce(x, op=dist.ReduceOp.AVG)
dist.all_reduce(c, group=gloo)
same("all_reduce AVG", [x], [c / world])
x, c = values(torch.float32, (6,)).to("pjrt"), values(torch.float32, (6,))
dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
dist.all_reduce(c, group=gloo)
same("all_reduce PREMUL_SUM", [x], [c * 0.5])
out, cpu_out = torch.empty(2, dtype=torch.float32, device="pjrt"), torch.empty(2)
dist.reduce_scatter_tensor(out, values(torch.float32, (world * 2,)).to("pjrt"), op=dist.ReduceOp.AVG)
dist.reduce_scatter_tensor(cpu_out, values(torch.float32, (world * 2,)), group=gloo)
same("reduce_scatter_tensor AVG", [out], [cpu_out / world])
try:
    dist.all_reduce(torch.ones(2, dtype=torch.int64, device="pjrt"), op=dist.ReduceOp.AVG)
    results.append(["AVG of integers raises", False, "no error"])
except Exception as e:  # noqa: BLE001
    results.append(["AVG of integers raises", "floating-point" in str(e), str(e)[:300]])

# Uneven all_to_all: rank r sends (r + d + 1) rows to rank d.
in_splits = [rank + d + 1 for d in range(world)]
out_splits = [s + rank + 1 for s in range(world)]
src = torch.arange(sum(in_splits) * 2, dtype=torch.float32).reshape(-1, 2) + 100 * rank
out, cpu_out = torch.empty(sum(out_splits), 2, device="pjrt"), torch.empty(sum(out_splits), 2)
dist.all_to_all_single(out, src.to("pjrt"), out_splits, in_splits)
dist.all_to_all_single(cpu_out, src, out_splits, in_splits, group=gloo)
same("all_to_all_single uneven", [out], [cpu_out])
ins = list(src.split(in_splits))
outs = [torch.empty(s, 2, device="pjrt") for s in out_splits]
dist.all_to_all(outs, [t.to("pjrt") for t in ins])
# gloo's list form needs equal sizes: the reference is the single-tensor form, split.
same("all_to_all uneven", outs, list(cpu_out.split(out_splits)))

# gather and scatter to and from rank 1.
gl = [torch.empty(3, device="pjrt") for _ in range(world)] if rank == 1 else None
cgl = [torch.empty(3) for _ in range(world)] if rank == 1 else None
dist.gather(values(torch.float32, (3,)).to("pjrt"), gl, dst=1)
dist.gather(values(torch.float32, (3,)), cgl, dst=1, group=gloo)
if rank == 1:
    same("gather", gl, cgl)
sl = [values(torch.float32, (3,), s).to("pjrt") for s in range(world)] if rank == 1 else None
csl = [values(torch.float32, (3,), s) for s in range(world)] if rank == 1 else None
out, cpu_out = torch.empty(3, device="pjrt"), torch.empty(3)
dist.scatter(out, sl, src=1)
dist.scatter(cpu_out, csl, src=1, group=gloo)
same("scatter", [out], [cpu_out])

# send/recv around the ring.
nxt, prv = (rank + 1) % world, (rank - 1) % world
got = torch.empty(4, device="pjrt")
if rank % 2 == 0:
    dist.send(values(torch.float32, (4,)).to("pjrt"), nxt)
    dist.recv(got, prv)
else:
    dist.recv(got, prv)
    dist.send(values(torch.float32, (4,)).to("pjrt"), nxt)
want = ((torch.arange(4, dtype=torch.float64) + 3 * prv) % 7 + 1).float()
same("send/recv ring", [got], [want])

# Async handles: wait() and the future, in this eager mode.
x = values(torch.float32, (3,)).to("pjrt") * 2
work = dist.all_reduce(x, async_op=True)
work.wait()
c = values(torch.float32, (3,)) * 2
dist.all_reduce(c, group=gloo)
same("async all_reduce wait", [x], [c])
x = values(torch.float32, (3,)).to("pjrt")
fut = dist.all_reduce(x, async_op=True).get_future()
same("async all_reduce future", fut.wait(), [c / 2])

# Coalesced forms.
xs = [values(torch.float32, (2,)).to("pjrt"), values(torch.float32, (3,), 1).to("pjrt")]
cs = [values(torch.float32, (2,)), values(torch.float32, (3,), 1)]
with dist._coalescing_manager(async_ops=True) as cm:
    for t in xs:
        dist.all_reduce(t)
cm.wait()
for t in cs:
    dist.all_reduce(t, group=gloo)
same("coalesced all_reduce", xs, cs)

# A subgroup given out of order: its collectives involve exactly its ranks.
members = [world - 1, 0, 1] if world >= 3 else [1, 0]
sub = dist.new_group(members)
gsub = dist.new_group(members, backend="gloo")
if rank in members:
    x, c = values(torch.float32, (4,)).to("pjrt"), values(torch.float32, (4,))
    dist.all_reduce(x, group=sub)
    dist.all_reduce(c, group=gsub)
    same("subgroup all_reduce", [x], [c])
    outs = [torch.empty(2, device="pjrt") for _ in members]
    couts = [torch.empty(2) for _ in members]
    dist.all_gather(outs, values(torch.float32, (2,)).to("pjrt"), group=sub)
    dist.all_gather(couts, values(torch.float32, (2,)), group=gsub)
    same("subgroup all_gather", outs, couts)

objs = [None] * world
dist.all_gather_object(objs, {"rank": rank})
results.append(["all_gather_object", objs == [{"rank": r} for r in range(world)], str(objs)])
dist.barrier()

m = torch_pjrt.metrics()
results.append(["collectives counted", m["collectives"] > 50, str(m["collectives"])])
results.append(["no fallback", not m["fallback_ops"], str(m["fallback_ops"])])
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
dist.destroy_process_group()
