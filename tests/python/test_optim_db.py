"""PyTorch's `optim_db` (torch.testing._internal.common_optimizers, shipped in the wheel) on pjrt.

Every OptimizerInfo's configurations for the pjrt device (`optim_inputs_func`), each with the
single-tensor and the foreach implementation where the optimizer has one: three steps over
parameters of several shapes (a 0-d one included) with fixed gradients, in Strict and
DeferAndFuse, must leave the parameters and the optimizer state equal to the CPU's, with no op
sent to the CPU. SparseAdam (sparse gradients) is left out: pjrt has no sparse tensors.
"""

import pytest
import torch
from torch.testing._internal.common_optimizers import optim_db

import torch_pjrt

MODES = ("strict", "defer_and_fuse")
STEPS = 3
# Muon orthogonalizes its update with Newton-Schulz iterations in bfloat16: a fused region keeps
# its intermediates in float32 between ops (as inductor's fused kernels do), where eager rounds
# each op's result to bfloat16.
TOLERANCES = {"Muon": {"rtol": 1e-3, "atol": 1e-4}}


def _shapes(info):
    # Muon updates matrices only.
    if info.optim_cls.__name__ == "Muon":
        return [(4, 3), (5, 2)]
    return [(4, 3), (5,), (2, 3, 2), ()]


def _params(info, device):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(device).requires_grad_() for s in _shapes(info)]


def _grads(info, step, device):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g).to(device) for s in _shapes(info)]


def _steps(info, kwargs, device):
    """The parameters and every tensor of the optimizer's state after STEPS steps."""
    params = _params(info, device)
    opt = info.optim_cls(params, **kwargs)
    for step in range(STEPS):
        for p, grad in zip(params, _grads(info, step, device)):
            p.grad = grad
        if info.step_requires_closure:

            def closure():
                opt.zero_grad()
                loss = sum((p * p).sum() for p in params)
                loss.backward()
                return loss

            opt.step(closure)
        else:
            opt.step()
    state = [
        t.detach().cpu()
        for per_param in opt.state.values()
        for t in per_param.values()
        if isinstance(t, torch.Tensor)
    ]
    return [p.detach().cpu() for p in params], state


def _configs():
    for info in optim_db:
        if info.optim_cls.__name__ == "SparseAdam":
            continue
        impls = [False, True] if "foreach" in info.supported_impls else [None]
        for inp in info.optim_inputs_func(device="pjrt"):
            for foreach in impls:
                kwargs = dict(inp.kwargs)
                if foreach is not None:
                    kwargs["foreach"] = foreach
                impl = {None: "", False: ", single tensor", True: ", foreach"}[foreach]
                yield pytest.param(info, kwargs, id=f"{info.optim_cls.__name__}: {inp.desc}{impl}")


@pytest.mark.parametrize("info, kwargs", list(_configs()))
def test_optim_db_configurations_match_the_cpu(info, kwargs):
    expected_params, expected_state = _steps(info, kwargs, "cpu")
    tol = TOLERANCES.get(info.optim_cls.__name__, {"rtol": 1e-5, "atol": 1e-6})
    for mode in MODES:
        with torch_pjrt.eager_mode(mode):
            torch_pjrt.sync()
            torch_pjrt.reset_metrics()
            params, state = _steps(info, kwargs, "pjrt")
            torch_pjrt.sync()
            fallbacks = torch_pjrt.metrics()["fallback_ops"]
        assert fallbacks == {}, f"{mode}: ops that fell back to the CPU: {fallbacks}"
        for i, (got, want) in enumerate(zip(params, expected_params)):
            torch.testing.assert_close(got, want, **tol, msg=lambda m: f"{mode}: parameter {i}: {m}")
        assert len(state) == len(expected_state), f"{mode}: {len(state)} state tensors, CPU {len(expected_state)}"
        for i, (got, want) in enumerate(zip(state, expected_state)):
            torch.testing.assert_close(got, want, **tol, msg=lambda m: f"{mode}: state tensor {i}: {m}")
