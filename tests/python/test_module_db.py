"""PyTorch's `module_db` (torch.testing._internal.common_modules, shipped in the wheel) on pjrt.

Every ModuleInfo's device-generic samples (at most `SAMPLES` of each), in training and eval mode: the module is built on the
CPU from a fixed seed and a copy moved to pjrt, and its outputs, the gradients of a fixed random
weighting of its floating outputs (parameters and inputs) and its buffers after the call
(BatchNorm's running statistics) must equal the CPU's, in Strict and DeferAndFuse. A module whose
CPU outputs change with the global seed (dropout in training mode) is run but not compared.

The ops a module's samples send to the CPU are asserted too (`EXPECTED_FALLBACKS`): a new
fallback fails its module, and an entry is removed once its op runs on the device.
"""

import os

import pytest
import torch
from torch.testing._internal.common_modules import module_db
from torch.utils._pytree import tree_flatten, tree_map

import torch_pjrt

MODES = ("strict", "defer_and_fuse")
# Samples per module and training flag, spread evenly over its list (CrossEntropyLoss has 105):
# `TORCH_PJRT_TEST_MODULE_SAMPLES=0` runs every one.
SAMPLES = int(os.environ.get("TORCH_PJRT_TEST_MODULE_SAMPLES", "12"))

# Modules whose samples cannot run on the CPU either (their samples' `_random_samples` are made
# in float64 whatever the dtype asked for).
CPU_UNSUPPORTED = {
    "nn.FractionalMaxPool2d": "the float32 samples pass float64 `_random_samples`: the CPU refuses them too",
    "nn.FractionalMaxPool3d": "the float32 samples pass float64 `_random_samples`: the CPU refuses them too",
}

# Ops that these modules' samples still run on the CPU (in every mode): none since the 3-d adaptive
# pools, MultiLabelMarginLoss, CTCLoss and the encoder's padding-mask check run on the device
# (torch_pjrt/_decompositions.py, RFC 0045).
EXPECTED_FALLBACKS: dict[str, set[str]] = {}


def _to(tree, device):
    def move(t):
        if not isinstance(t, torch.Tensor):
            return t
        moved = t.detach().to(device)
        return moved.requires_grad_() if t.requires_grad else moved

    return tree_map(move, tree)


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _run(info, sample, device, training, seed):
    """The module's outputs, the gradients of its parameters and inputs, and its buffers."""
    torch.manual_seed(0)
    module = info.module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs)
    module.train(training)
    if any(torch.nn.parameter.is_lazy(p) for p in module.parameters()):
        # Lazy modules draw their parameters at the first call: on the CPU for both runs.
        with torch.no_grad():
            module(*sample.forward_input.args, **sample.forward_input.kwargs)
    module = module.to(device)
    args, kwargs = _to((sample.forward_input.args, sample.forward_input.kwargs), device)
    torch.manual_seed(seed)
    out = module(*args, **kwargs)
    outs = _tensors(out)
    grads = []
    weighted = [t for t in outs if t.is_floating_point() and t.requires_grad]
    if weighted:
        g = torch.Generator().manual_seed(3)
        loss = sum((t * torch.rand(t.shape, generator=g).to(device)).sum() for t in weighted)
        leaves = [p for p in module.parameters() if p.requires_grad]
        leaves += [t for t in _tensors((args, kwargs)) if t.requires_grad]
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    cpu = lambda ts: [None if t is None else t.detach().cpu() for t in ts]  # noqa: E731
    return cpu(outs), cpu(grads), cpu(list(module.buffers()))


def _compare(got, expected, what, rtol, atol):
    assert len(got) == len(expected), f"{what}: {len(got)} tensors, the CPU gave {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        assert (g is None) == (e is None), f"{what} {i}: None on one side only"
        if e is not None:
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what} {i}: {m}")


def _samples(info):
    for training in (True, False):
        samples = [
            sample
            for sample in info.module_inputs_func(
                info, device="cpu", dtype=torch.float32, requires_grad=True, training=training
            )
            if sample.forward_input is not None
        ]
        if SAMPLES and len(samples) > SAMPLES:
            samples = [samples[i * len(samples) // SAMPLES] for i in range(SAMPLES)]
        for sample in samples:
            yield training, sample


@pytest.mark.parametrize("info", module_db, ids=lambda info: info.name)
def test_module_db_samples_match_the_cpu(info):
    if info.name in CPU_UNSUPPORTED:
        with pytest.raises(RuntimeError):
            for training, sample in _samples(info):
                _run(info, sample, "cpu", training, seed=1)
        return
    checked = 0
    for training, sample in _samples(info):
        expected = _run(info, sample, "cpu", training, seed=1)
        reseeded = _run(info, sample, "cpu", training, seed=2)
        draws = any(
            not torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(expected[0], reseeded[0])
        )
        for mode in MODES:
            with torch_pjrt.eager_mode(mode):
                torch_pjrt.sync()
                torch_pjrt.reset_metrics()
                got = _run(info, sample, "pjrt", training, seed=1)
                torch_pjrt.sync()
                fallbacks = set(torch_pjrt.metrics()["fallback_ops"])
            assert fallbacks <= EXPECTED_FALLBACKS.get(info.name, set()), (
                f"{mode}: ops that fell back to the CPU: {fallbacks}"
            )
            if draws:
                continue  # random in this mode: run, not compared
            where = f"{mode}, training={training}, {sample.desc or 'default'}"
            _compare(got[0], expected[0], f"{where}: output", rtol=1e-4, atol=1e-5)
            _compare(got[1], expected[1], f"{where}: gradient", rtol=1e-3, atol=1e-4)
            _compare(got[2], expected[2], f"{where}: buffer", rtol=1e-4, atol=1e-5)
            checked += 1
    assert checked > 0, "no sample was compared"
