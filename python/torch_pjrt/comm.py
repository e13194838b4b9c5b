"""Collectives across the pjrt devices of one process (RFC 0046).

With several devices in the process (``TORCH_PJRT_CLIENT_OPTIONS=cpu_device_count=4`` gives
``pjrt:0`` .. ``pjrt:3`` on XLA CPU), each function takes a list of tensors of one dtype and
shape, one per device, and runs the collective as one replicated StableHLO program on all of
those devices at once (replica ``i`` on the device of ``tensors[i]``), the single-process,
multi-device path of the CUDA and TPU plugins. Like ``torch.cuda.comm.broadcast`` and
``reduce_add``, they return new tensors, one per input and on its device, in the order of the
inputs; the inputs are left unchanged (``t.copy_(r)`` writes a result back in place).

    xs = [torch.full((4,), float(i), device=f"pjrt:{i}") for i in range(4)]
    sums = torch_pjrt.comm.all_reduce(xs)          # each: tensor([6., 6., 6., 6.])

Each call launches what is pending on its inputs' devices and queues the collective after it,
without waiting: its results are computed in order with the regions, like any op's.
``torch_pjrt.metrics()["device_collectives"]`` counts the programs run and
``["device_collective_compiles"]`` the compiles they needed (one per collective, dtype, shape
and device list). Across processes, use ``torch.distributed`` with the ``"pjrt"`` backend.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["all_gather", "all_reduce", "reduce_scatter", "buffer_device"]

_KINDS = {"all_reduce": 0, "all_gather": 1, "reduce_scatter": 2}
_REDUCTIONS = {"sum": 0, "prod": 1, "product": 1, "max": 2, "min": 3}


def _reduction(op) -> int:
    name = op if isinstance(op, str) else getattr(op, "name", str(op))
    code = _REDUCTIONS.get(str(name).lower().rsplit(".", 1)[-1])
    if code is None:
        raise ValueError(f"unsupported reduction {op!r}: use 'sum', 'prod', 'max' or 'min'")
    return code


def _checked(tensors: Sequence, what: str) -> list:
    import torch

    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{what} expects a non-empty list of tensors, one per pjrt device")
    devices = set()
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type != "pjrt":
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{what} expects pjrt tensors, got one on {where}")
        if t.device in devices:
            raise ValueError(f"{what} takes one tensor per device, but {t.device} has two")
        devices.add(t.device)
        if t.dtype != tensors[0].dtype or t.shape != tensors[0].shape:
            raise ValueError(
                f"{what} expects tensors of one dtype and shape, got {tensors[0].dtype} "
                f"{tuple(tensors[0].shape)} and {t.dtype} {tuple(t.shape)}"
            )
    return tensors


def _dim(dim: int, tensors: list, what: str) -> int:
    rank = tensors[0].dim()
    if not -rank <= dim < max(rank, 1) or rank == 0:
        raise IndexError(
            f"{what}: dimension out of range (expected to be in range of [{-rank}, "
            f"{rank - 1}], but got {dim})"
        )
    return dim % rank


def _run(kind: str, reduction: int, dim: int, tensors: list) -> list:
    from . import _native

    _native.ensure_started()
    return _native.native()._collective(_KINDS[kind], reduction, dim, tensors)


def all_reduce(tensors: Sequence, op="sum") -> list:
    """Each device's result is the elementwise reduction (``op``: ``"sum"``, ``"prod"``,
    ``"max"``, ``"min"``, or a ``torch.distributed.ReduceOp`` of those) of all the tensors."""
    tensors = _checked(tensors, "all_reduce")
    return _run("all_reduce", _reduction(op), 0, tensors)


def all_gather(tensors: Sequence, dim: int = 0) -> list:
    """Each device's result is ``torch.cat(tensors, dim)``."""
    tensors = _checked(tensors, "all_gather")
    return _run("all_gather", 0, _dim(dim, tensors, "all_gather"), tensors)


def reduce_scatter(tensors: Sequence, op="sum", dim: int = 0) -> list:
    """Device ``i``'s result is part ``i`` of the reduction of all the tensors, split into
    ``len(tensors)`` equal parts along ``dim``."""
    tensors = _checked(tensors, "reduce_scatter")
    dim = _dim(dim, tensors, "reduce_scatter")
    if tensors[0].shape[dim] % len(tensors) != 0:
        raise ValueError(
            f"reduce_scatter: dimension {dim} of size {tensors[0].shape[dim]} does not split "
            f"into {len(tensors)} equal parts"
        )
    return _run("reduce_scatter", _reduction(op), dim, tensors)


def buffer_device(tensor) -> int:
    """The PJRT device id of the buffer that holds ``tensor``'s storage, computing it first
    (-1: a storage never written). For tests and debugging: it says where the value really is,
    not where PyTorch says it is."""
    from . import _native

    _native.ensure_started()
    return _native.native()._storage_device(tensor)
