"""Long-tail ops run through PyTorch's own decompositions (`torch._decomp`), registered for pjrt.

An op listed here has no pjrt kernel and is rare enough that a Python kernel's cost per call
does not matter, while PyTorch already ships its formula as ATen ops that pjrt runs natively:
registering that decomposition keeps the op on the device (no CPU fallback, no region cut in
DeferAndFuse) without writing the formula again (RFC 0045).

Each op is registered twice:
- at `AutogradPrivateUse1`, so autograd differentiates the decomposed ops: the op's own backward
  (often a second op with no pjrt kernel and no decomposition) is never called;
- at `PrivateUse1`, for calls that skip autograd (`torch.inference_mode`).
"""

from __future__ import annotations

import torch

_lib = None

# ATen overloads decomposed on pjrt. A new entry needs a decomposition in
# `torch._decomp.decomposition_table` and a test against the CPU (tests/python/test_decompositions.py).
#
# Checked and left out: `multilabel_margin_loss_forward` (torch 2.13's decomposition counts the
# entries after a row's first -1 as targets, so it disagrees with the CPU kernel), and
# `adaptive_max_pool3d` (its decomposition returns NotImplemented for windows that do not divide
# the input evenly).
DECOMPOSED = ("multi_margin_loss",)


def _multi_margin_loss(decomposition):
    # The decomposition returns shape [1] for one sample (1-d input, 0-d target) without
    # reduction, where the CPU and CUDA kernels return a 0-d loss.
    def multi_margin_loss(input, target, p=1, margin=1, weight=None, reduction=1):
        out = decomposition(input, target, p, margin, weight, reduction)
        if reduction == 0 and target.dim() == 0:
            out = out.reshape(())
        return out

    return multi_margin_loss


# Where a decomposition's result differs from the kernels' in form (not in values), the kernel
# registered wraps it.
_FIXUPS = {"multi_margin_loss": _multi_margin_loss}


def kernel(name: str):
    """The kernel registered for op `name` of DECOMPOSED: PyTorch's decomposition, fixed up
    where needed; None when this torch has no decomposition for it."""
    from torch._decomp import decomposition_table

    decomposition = decomposition_table.get(getattr(torch.ops.aten, name).default)
    if decomposition is None:
        return None
    fixup = _FIXUPS.get(name)
    return fixup(decomposition) if fixup else decomposition


def _on_first_call(name: str):
    """A kernel that looks the decomposition up at its first call: `torch._decomp` takes about
    a third of a second to import, which `import torch` (where this registers) must not pay."""
    found = []

    def decomposed(*args, **kwargs):
        if not found:
            fn = kernel(name)
            if fn is None:
                raise NotImplementedError(f"aten::{name} has no decomposition in this torch")
            found.append(fn)
        return found[0](*args, **kwargs)

    return decomposed


def register() -> None:
    """Registers the decompositions (once)."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name in DECOMPOSED:
        fn = _on_first_call(name)
        for key in ("AutogradPrivateUse1", "PrivateUse1"):
            lib.impl(name, fn, key)
    _lib = lib
