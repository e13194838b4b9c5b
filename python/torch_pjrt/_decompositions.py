"""Long-tail ops run on pjrt as compositions of ATen ops that pjrt runs natively (RFC 0045).

An op listed here has no pjrt kernel and is rare enough that a Python kernel's cost per call
does not matter: registering a composition of native ops keeps it on the device (no CPU
fallback, no region cut in DeferAndFuse). Two sources:
- PyTorch's own decompositions (`torch._decomp`, imported at an op's first call), where PyTorch
  ships one that agrees with its kernels (`DECOMPOSED`): the formula is not written again;
- formulas of our own in this module (`OWN`), written from each op's documented semantics,
  where PyTorch's decomposition is missing (`_adaptive_avg_pool3d`, `_ctc_loss`,
  `_nested_tensor_from_mask_left_aligned`), wrong (`multilabel_margin_loss_forward`: it counts
  the entries after a row's first -1 as targets) or partial (`adaptive_max_pool3d`: it returns
  NotImplemented for windows that do not divide the input; this one runs on pjrt's native
  2-d adaptive max pool).

Each op is registered twice:
- at `AutogradPrivateUse1`, so autograd differentiates the composed ops: the op's own backward
  (often a second op with no pjrt kernel and no decomposition) is never called;
- at `PrivateUse1`, for calls that skip autograd (`torch.inference_mode`).

A third group (`DECOMPOSED_KERNELS`, `DECOMPOSED_OUT`) is PyTorch's decomposition in place of a
C++ composite kernel, chosen by RFC 0045's placement rule: registered at `PrivateUse1` only, as
the C++ kernel was, so their gradients stay PyTorch's derivative formulas.
"""

from __future__ import annotations

import math

import torch

_lib = None

aten = torch.ops.aten

# ATen overloads decomposed on pjrt by PyTorch's decompositions. A new entry needs a
# decomposition in `torch._decomp.decomposition_table` and a test against the CPU
# (tests/python/test_decompositions.py).
#
# Checked and left out (written in this module instead, see `OWN`): `multilabel_margin_loss_forward`
# (torch 2.13's decomposition counts the entries after a row's first -1 as targets, so it
# disagrees with the CPU kernel), and `adaptive_max_pool3d` (its decomposition returns
# NotImplemented for windows that do not divide the input evenly).
DECOMPOSED = ("multi_margin_loss",)

# ATen overloads whose pjrt kernel is PyTorch's decomposition, in place of a C++ composite: RFC
# 0045's placement measurements showed each decomposition agreeing with the CPU at a host cost
# close to the C++ kernel's (rare ops at most 3x in Strict, common ones at most 2x in either
# mode). Registered at `PrivateUse1` only, where the C++ kernel was: autograd keeps PyTorch's
# derivative formula (its backward ops have pjrt kernels), since differentiating the
# decomposition instead disagrees with the CPU's gradient at edge values (`sinc` at 0, `logit`
# outside [0, 1], `softshrink` at NaN, `_prelu_kernel_backward`'s own gradient at NaN). In-place
# overloads are listed with their functional ones; the `out=` overloads are in `DECOMPOSED_OUT`.
#
# Measured as moves but kept in C++, where the decomposition misses the kernel's checks:
# `index_fill` and `count_nonzero` (over every dim), whose C++ kernels send a uint16/32/64 input
# to the CPU so that it raises PyTorch's error (tests/python/test_unsigned.py); `heaviside`,
# whose decomposition computes a result for inputs of different dtypes, and `aminmax`, whose
# decomposition raises amin's IndexError for an empty input, where the CPU raises their own
# RuntimeError (tests/python/test_sampling_and_search.py); `frac` and `sinc`, whose C++ kernels
# send a complex input to the CPU in every form (which computes `sinc` and raises `frac`'s own
# error), where the decompositions raise `trunc`'s error or compute elsewhere
# (tests/python/test_complex.py).
DECOMPOSED_KERNELS = (
    "threshold",
    "threshold_",
    "hardshrink",
    "softshrink",
    "_prelu_kernel",
    "_prelu_kernel_backward",
    "logit",
    "logit_",
    "norm.ScalarOpt_dim",
    "norm.ScalarOpt_dim_dtype",
    "norm.Scalar",
    "norm.ScalarOpt_dtype",
    "std_mean.correction",
    "logaddexp2",
    "trace",
    "channel_shuffle",
    "_weight_norm_interface",
    "unfold_backward",
    "upsample_nearest1d",
    "_upsample_nearest_exact1d",
    "replication_pad1d",
)

# `out=` overloads of DECOMPOSED_KERNELS, through their own decompositions (PyTorch's
# `out_wrapper`: the functional result resized into `out`), at PrivateUse1 as well.
DECOMPOSED_OUT = (
    "threshold.out",
    "hardshrink.out",
    "softshrink.out",
    "logit.out",
    "norm.out",
    "norm.dtype_out",
    "logaddexp2.out",
    "upsample_nearest1d.out",
    "replication_pad1d.out",
)


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


# --- Formulas of our own -------------------------------------------------------------------
# Each is written from the op's documented semantics and checked against the CPU kernel
# (tests/python/test_decompositions.py), forward and backward; the backward is autograd's.


def _pool3d_planes(x):
    """`x` ([N,] C, D, H, W) as [B, D, H, W], and the leading dims to restore."""
    if x.dim() not in (4, 5):
        raise RuntimeError(f"adaptive 3-d pooling: expected a 4-d or 5-d input, got shape {tuple(x.shape)}")
    return x.reshape(-1, *x.shape[-3:]), x.shape[:-3]


def _depth_last(y, oh, ow):
    """[B, D, oh, ow] -> [B, oh*ow, D, 1]: the depth as the rows of a 2-d plane one column wide."""
    b, d = y.shape[0], y.shape[1]
    return y.permute(0, 2, 3, 1).reshape(b, oh * ow, d, 1)


def _depth_first(y, oh, ow):
    """[B, oh*ow, od, 1] -> [B, od, oh, ow] (the inverse of `_depth_last`)."""
    b, od = y.shape[0], y.shape[2]
    return y.reshape(b, oh, ow, od).permute(0, 3, 1, 2)


def _adaptive_windows(size: int, out: int):
    """Adaptive pooling's windows along a dim of `size` pooled to `out`: window o spans
    [floor(o * size / out), ceil((o + 1) * size / out)). Returns, for k the longest window's
    length, the positions [out * k] each window reads (its last repeated past its end), a
    mask [out, k] of the positions inside it, and the windows' lengths."""
    starts = [o * size // out for o in range(out)]
    ends = [-(-(o + 1) * size // out) for o in range(out)]
    k = max(e - s for s, e in zip(starts, ends))
    positions = [min(s + j, e - 1) for s, e in zip(starts, ends) for j in range(k)]
    inside = [[s + j < e for j in range(k)] for s, e in zip(starts, ends)]
    return positions, inside, [e - s for s, e in zip(starts, ends)]


def _adaptive_avg_pool3d(self, output_size):
    # The CPU's sum over each box window divided by its three lengths, one dim at a time: each
    # window's positions gathered ([.., out, k] in place of the dim) and summed under its mask.
    # Summing by selection (not by products with a 0/1 window matrix) keeps a NaN or an
    # infinity in its own windows, as the CPU does.
    x, lead = _pool3d_planes(self)
    out = [int(s) for s in output_size]
    if min(out) <= 0:
        raise RuntimeError(f"adaptive_avg_pool3d: output_size must be positive, got {out}")
    counts = []
    for dim, o in zip((1, 2, 3), out):
        positions, inside, lengths = _adaptive_windows(x.shape[dim], o)
        k = len(inside[0])
        picked = x.index_select(dim, torch.tensor(positions, device=x.device))
        picked = picked.reshape(*x.shape[:dim], o, k, *x.shape[dim + 1 :])
        mask = torch.tensor(inside, device=x.device).reshape(o, k, *[1] * (3 - dim))
        x = torch.where(mask, picked, 0).sum(dim + 1)
        counts.append(torch.tensor(lengths, dtype=x.dtype, device=x.device).reshape(o, *[1] * (3 - dim)))
    for count in counts:
        x = x / count
    return x.reshape(*lead, *out)


def _adaptive_max_pool3d(self, output_size):
    # A window is a box (one interval per dim), so its maximum is the maximum over its depths of
    # the maxima over its (H, W) rectangle: pjrt's 2-d adaptive max pool over (H, W) for each
    # depth, then over (D, 1) with the pooled plane's positions as channels. The 2-d op takes
    # the windows [floor(i*in/out), ceil((i+1)*in/out)) whether they divide the input or not,
    # and picks maxima as the CPU does. The CPU's index is the flat d*H*W + h*W + w of the first
    # maximum in that order (the last NaN where there are NaNs): the first depth whose plane
    # maximum is the window's maximum, and within it the plane's own first maximum, which is
    # what the two 2-d steps pick.
    od, oh, ow = (int(s) for s in output_size)
    x, lead = _pool3d_planes(self)
    height, width = x.shape[-2:]
    v, hw = aten.adaptive_max_pool2d(x, [oh, ow])  # [B, D, oh, ow]; hw = h*W + w
    v, depth = aten.adaptive_max_pool2d(_depth_last(v, oh, ow), [od, 1])  # depth = d (one column)
    v = _depth_first(v, oh, ow)
    depth = _depth_first(depth, oh, ow)  # [B, od, oh, ow]
    index = depth * (height * width) + hw.gather(1, depth)
    return v.reshape(*lead, od, oh, ow), index.reshape(*lead, od, oh, ow)


def _multilabel_margin_loss_forward(self, target, reduction):
    # Row by row: the targets are the entries before the row's first -1; the loss is
    # sum over targets j and non-targets i of max(0, 1 - (x[j] - x[i])), over the row's length.
    # `is_target` marks the targets with 1 (in the input's dtype), as the kernel returns it for
    # its backward.
    dim = self.shape[-1] if self.dim() > 0 else 1
    x = self.reshape(-1, dim)
    y = target.reshape(x.shape[0], dim)
    listed = (y < 0).cumsum(1) == 0  # before the row's first -1
    label = torch.where(listed, y, 0)
    hits = torch.zeros_like(x).scatter_add(1, label, listed.to(x.dtype))
    is_target = hits > 0
    # z[n, j, i] = 1 - x[n, y[n, j]] + x[n, i], for listed j and non-target i
    z = 1 - x.gather(1, label).unsqueeze(2) + x.unsqueeze(1)
    counted = listed.unsqueeze(2) & ~is_target.unsqueeze(1)
    # relu: a margin of exactly 0 has no gradient, as in the kernel (`z > 0`)
    loss = torch.where(counted, torch.relu(z), 0).sum((1, 2)) / dim
    if reduction == 1:  # mean
        loss = loss.mean()
    elif reduction == 2:  # sum
        loss = loss.sum()
    elif target.dim() <= 1:
        loss = loss.reshape(())
    return loss, is_target.to(self.dtype).reshape(target.shape)


def _logsumexp(parts):
    """log(sum(exp(p))) over same-shaped tensors, elementwise: -inf where every one is -inf,
    with no NaN in its gradient there (torch.logsumexp's backward is NaN for an all -inf input,
    which the CTC recursion has at every state it cannot reach yet, and its 0 cotangent times
    NaN would reach log_probs)."""
    top = parts[0]
    for p in parts[1:]:
        top = torch.maximum(top, p)
    top = top.detach()  # a shift only: the value does not depend on it
    finite = top != -math.inf
    shift = torch.where(finite, top, 0)
    total = torch.exp(parts[0] - shift)
    for p in parts[1:]:
        total = total + torch.exp(p - shift)
    return torch.where(finite, shift + torch.log(torch.where(finite, total, 1)), -math.inf)


def _lengths(lengths, what):
    if isinstance(lengths, torch.Tensor):
        if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
            raise RuntimeError(f"ctc_loss: {what} must be integral, got {lengths.dtype}")
        lengths = lengths.tolist()
    return [int(n) for n in lengths]


def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    # The negative log-likelihood of each sample's target under the CTC alignment model, by the
    # forward (alpha) recursion in log space over time, vectorized over the batch and the states
    # of the extended target (a blank before, between and after the labels).
    input_lengths = _lengths(input_lengths, "input_lengths")
    target_lengths = _lengths(target_lengths, "target_lengths")
    if log_probs.dim() != 3:
        raise RuntimeError(f"ctc_loss: expected log_probs of shape [T, N, C], got {tuple(log_probs.shape)}")
    steps, batch, classes = log_probs.shape
    if len(input_lengths) != batch or len(target_lengths) != batch:
        raise RuntimeError(
            f"ctc_loss: expected {batch} input and target lengths, "
            f"got {len(input_lengths)} and {len(target_lengths)}"
        )
    if not 0 <= blank < classes:
        raise RuntimeError(f"ctc_loss: blank must be in label range [0, {classes}), got {blank}")
    for n, (t, s) in enumerate(zip(input_lengths, target_lengths)):
        if not 0 <= t <= steps:
            raise RuntimeError(f"ctc_loss: input_lengths[{n}] = {t} is not in [0, {steps}], log_probs' steps")
        if s < 0:
            raise RuntimeError(f"ctc_loss: target_lengths[{n}] = {s} is negative")
    device, dtype = log_probs.device, log_probs.dtype
    pad = torch.nn.functional.pad
    longest = max(target_lengths, default=0)
    states = 2 * longest + 1

    def constant(rows, dtype=torch.bool):
        """A tensor made on the host from the lengths, moved to the device."""
        return torch.tensor(rows, dtype=dtype).to(device)

    # Each sample's labels, padded to the longest with blanks: [N, longest].
    if targets.dim() == 1:  # concatenated
        starts = [sum(target_lengths[:n]) for n in range(batch)]
        at = [starts[n] + min(j, max(s - 1, 0)) for n, s in enumerate(target_lengths) for j in range(longest)]
        labels = targets.index_select(0, constant(at, torch.long)).reshape(batch, longest)
    else:
        if targets.shape[1] < longest:
            raise RuntimeError(
                f"ctc_loss: targets have {targets.shape[1]} columns, fewer than the longest target ({longest})"
            )
        labels = targets[:, :longest]
    within = constant([[j < s for j in range(longest)] for s in target_lengths]).reshape(batch, longest)
    labels = torch.where(within, labels.long(), blank)
    # The extended target: blank, label 1, blank, label 2, ..., blank: [N, states].
    blanks = torch.full((batch, longest + 1), blank, dtype=torch.long, device=device)
    paired = torch.stack([blanks[:, :longest], labels], 2).reshape(batch, 2 * longest)
    extended = torch.cat([paired, blanks[:, longest:]], 1)
    # A state may be entered from two states back when it is a label that differs from the
    # label before it (between two equal labels the blank cannot be skipped). Shifts along the
    # states are pads that crop as much on the other side: elementwise work, with a pad for
    # backward, which XLA compiles several times faster over the T steps than windows of
    # `unfold` (a gather) or slices.
    skip = (extended != blank) & (extended != pad(extended, (2, -2), value=blank))
    # The log-probabilities of each state's symbol at every step, one tensor per step (unbind's
    # backward stacks the steps' gradients in one op, where indexing each step would add a
    # gradient of the whole [T, N, states] per step).
    emit = log_probs.gather(2, extended.unsqueeze(0).expand(steps, batch, states)).unbind(0)

    used = [[s < 2 * n + 1 for s in range(states)] for n in target_lengths]
    alphas = []
    if steps:  # the first blank or the first label
        starts_at = constant([[u and s < 2 for s, u in enumerate(row)] for row in used]).reshape(batch, states)
        alphas.append(torch.where(starts_at, emit[0], -math.inf))
    for t in range(1, steps):
        alpha = alphas[-1]
        advance = pad(alpha, (1, -1), value=-math.inf)
        jump = torch.where(skip, pad(alpha, (2, -2), value=-math.inf), -math.inf)
        alphas.append(_logsumexp([alpha, advance, jump]) + emit[t])
    log_alpha = torch.stack(alphas, 1) if steps else log_probs.new_empty((batch, 0, states))

    # The likelihood: the final blank and the last label at the sample's last step.
    if steps:
        last = constant([max(t - 1, 0) for t in input_lengths], torch.long).reshape(batch, 1, 1)
        final = log_alpha.gather(1, last.expand(batch, 1, states)).squeeze(1)
        ends = constant([[2 * s, max(2 * s - 1, 0)] for s in target_lengths], torch.long).reshape(batch, 2)
        two = constant([[True, s > 0] for s in target_lengths]).reshape(batch, 2)
        likelihood = _logsumexp(torch.where(two, final.gather(1, ends), -math.inf).unbind(1))
    else:
        likelihood = torch.full((batch,), -math.inf, dtype=dtype, device=device)
    if 0 in input_lengths:  # no step: the empty target has probability 1, any other 0
        empty = constant([0.0 if s == 0 else -math.inf for s in target_lengths], dtype)
        likelihood = torch.where(constant([t == 0 for t in input_lengths]), empty, likelihood)
    nll = -likelihood

    # PyTorch's CTC kernels (CPU and CUDA) return as the gradient of log_probs that of the
    # logits under a log_softmax (Graves et al. 2006, eq. 16): the derivative plus
    # exp(log_probs) * grad at each sample's steps, a term log_softmax's backward cancels.
    # `spent` adds it: its value is 0 and its derivative exp(log_probs) within the steps.
    in_steps = constant([[t < n for n in input_lengths] for t in range(steps)]).reshape(steps, batch)
    mass = torch.where(in_steps.unsqueeze(2), torch.exp(log_probs), 0).sum((0, 2))
    spent = mass - mass.detach()
    impossible = nll == math.inf
    if zero_infinity:
        # An impossible target's loss is infinite and its gradient 0.
        spent = torch.where(impossible, 0, spent)
    else:
        # The kernels' gradient is NaN at an impossible target's steps: sqrt(s*s) at s = 0 has
        # value 0 and a NaN derivative (the other samples take the root of 1, so that the branch
        # `where` does not pick passes them a 0 derivative, not 0 * NaN).
        root = torch.sqrt(spent * spent + (~impossible).to(dtype))
        spent = torch.where(impossible, root, spent)
    nll = nll + spent

    # log_alpha is -inf past a sample's steps and past its states (where the CPU kernel leaves
    # it unwritten).
    alive = in_steps.t().unsqueeze(2) & constant(used).reshape(batch, 1, states)
    return nll, torch.where(alive, log_alpha, -math.inf)


def _nested_tensor_from_mask_left_aligned(t, mask):
    # True when each row of the mask (True: a token, False: padding) has no token after padding,
    # so that a nested tensor can take each row's first tokens.
    if mask.dtype != torch.bool:
        raise RuntimeError(f"Expected mask to be of type bool, but got {mask.dtype} instead.")
    if mask.dim() != 2:
        raise RuntimeError("Padding mask should be 2D")
    if t.dim() != 3:
        raise RuntimeError("Input should be a 3D tensor, N * L * D")
    if tuple(t.shape[:2]) != tuple(mask.shape):
        raise RuntimeError("Mask size should match input size")
    return not bool((mask[:, 1:] & ~mask[:, :-1]).any())


# ATen overloads ("name" or "name.overload") that run on pjrt through the formulas above.
OWN = {
    "_adaptive_avg_pool3d": _adaptive_avg_pool3d,
    "adaptive_max_pool3d": _adaptive_max_pool3d,
    "multilabel_margin_loss_forward": _multilabel_margin_loss_forward,
    "_ctc_loss": _ctc_loss,
    "_ctc_loss.Tensor": _ctc_loss,
    "_nested_tensor_from_mask_left_aligned": _nested_tensor_from_mask_left_aligned,
}


# Their `out=` overloads, each written through its functional overload above (at PrivateUse1
# only: autograd refuses `out=` arguments that need a gradient before it dispatches).
OUT_OVERLOADS = {
    "adaptive_max_pool3d.out": "adaptive_max_pool3d",
    "_adaptive_avg_pool3d.out": "_adaptive_avg_pool3d",
    "adaptive_avg_pool3d.out": "_adaptive_avg_pool3d",
    "multilabel_margin_loss_forward.output": "multilabel_margin_loss_forward",
    "_ctc_loss.out": "_ctc_loss",
    "_ctc_loss.Tensor_out": "_ctc_loss.Tensor",
}


def _overload(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _writing_out(name: str):
    """The kernel of `out=` overload `name`: its functional kernel's results resized and copied
    into the `out=` tensors."""
    functional = OWN[OUT_OVERLOADS[name]]
    outs = [a.name for a in _overload(name)._schema.arguments if a.is_out]

    def out_kernel(*args, **kwargs):
        targets = [kwargs.pop(n) for n in outs]
        results = functional(*args, **kwargs)
        results = results if isinstance(results, tuple) else (results,)
        for target, result in zip(targets, results):
            target.resize_(result.shape)
            target.copy_(result)
        return targets[0] if len(targets) == 1 else tuple(targets)

    return out_kernel


def kernel(name: str):
    """The kernel registered for op `name` of DECOMPOSED, DECOMPOSED_KERNELS, DECOMPOSED_OUT or
    OWN: PyTorch's decomposition, fixed up where needed (None when this torch has no
    decomposition for it), or this module's own."""
    if name in OWN:
        return OWN[name]
    from torch._decomp import decomposition_table

    decomposition = decomposition_table.get(_overload(name))
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
    """Registers the decompositions and this module's own kernels (once)."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name in DECOMPOSED:
        fn = _on_first_call(name)
        for key in ("AutogradPrivateUse1", "PrivateUse1"):
            lib.impl(name, fn, key)
    for name, fn in OWN.items():
        for key in ("AutogradPrivateUse1", "PrivateUse1"):
            lib.impl(name, fn, key)
    for name in OUT_OVERLOADS:
        lib.impl(name, _writing_out(name), "PrivateUse1")
    for name in (*DECOMPOSED_KERNELS, *DECOMPOSED_OUT):
        lib.impl(name, _on_first_call(name), "PrivateUse1")
    _lib = lib
