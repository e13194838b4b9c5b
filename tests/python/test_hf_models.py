"""Hugging Face architectures (tiny configs, random weights; examples/hf.py builds them) on pjrt
against the CPU: the eval() forward and one backward pass of the model's own loss in Strict and
DeferAndFuse, and a bfloat16 forward of the decoder language models. Nothing may fall back to the
CPU.

Each test moves a copy of the CPU model (tied weights stay tied) and runs forward and backward
before reading anything back, so DeferAndFuse fuses the whole step, bar what the model code reads
back itself. The no-grad forward is what the bfloat16 tests and examples/hf.py run."""

import copy
import functools
import os
import sys

import pytest
import torch

import torch_pjrt
from conftest import in_mode_without_fallbacks

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import hf  # noqa: E402

MODES = ["strict", "defer_and_fuse"]
# One layer of each stack: a second one runs the same ops and doubles the compile time.
LAYERS = 1
TOL = {"rtol": 2e-4, "atol": 2e-4}
# bfloat16 keeps 8 bits of mantissa: the two sides may round intermediate results differently by an
# ulp or two.
BF16_TOL = {"rtol": 2e-2, "atol": 1e-2}
DECODER_LMS = [name for name, arch in hf.ARCHS.items() if arch.decoder_lm]


@functools.cache
def _cpu_reference(name):
    """(model, inputs, outputs, gradients) on the CPU, computed once per architecture."""
    model, inputs = hf.build(name, layers=LAYERS)
    out = model(**inputs)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return model, inputs, {k: v.detach() for k, v in hf.tensors(out).items()}, grads


@functools.cache
def _cpu_bf16_reference(name):
    model, inputs, *_ = _cpu_reference(name)
    model = copy.deepcopy(model).to(torch.bfloat16)
    inputs = hf.to_device(inputs, "cpu", torch.bfloat16)
    return model, inputs, hf.forward(model, inputs)


def _compare(actual: dict, expected: dict, what: str, tol: dict):
    assert actual.keys() == expected.keys(), f"{what}: {sorted(actual)} vs {sorted(expected)}"
    for key, e in expected.items():
        torch.testing.assert_close(actual[key].cpu(), e, msg=lambda m: f"{what} {key}: {m}", **tol)


@pytest.fixture(params=MODES)
def mode(request):
    """One eager mode with fresh metrics; fails the test if any op fell back to the CPU."""
    with in_mode_without_fallbacks(request.param):
        yield request.param


@pytest.mark.parametrize("name", list(hf.ARCHS))
def test_forward_backward(name, mode):
    cpu_model, inputs, expected, expected_grads = _cpu_reference(name)
    model = copy.deepcopy(cpu_model).to("pjrt")
    out = model(**hf.to_device(inputs, "pjrt"))
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    _compare({k: v.detach() for k, v in hf.tensors(out).items()}, expected, f"{name} output", TOL)
    _compare(grads, expected_grads, f"{name} gradient of", TOL)


@pytest.mark.parametrize("name", DECODER_LMS)
def test_bf16_forward(name, mode):
    cpu_model, inputs, expected = _cpu_bf16_reference(name)
    model = copy.deepcopy(cpu_model).to("pjrt")
    actual = hf.forward(model, hf.to_device(inputs, "pjrt"))
    assert all(v.dtype == torch.bfloat16 for k, v in actual.items() if k != "loss" and v.is_floating_point())
    _compare(actual, expected, f"{name} bf16 output", BF16_TOL)


def test_tied_weights_stay_tied():
    """Module.to keeps a Parameter shared by two modules one Parameter, so its gradient sums both
    uses (as on the CPU)."""
    model, _ = hf.build("gpt2", layers=LAYERS)
    assert model.lm_head.weight is model.transformer.wte.weight
    model.to("pjrt")
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.weight.device.type == "pjrt"
    model.cpu()
    assert model.lm_head.weight is model.transformer.wte.weight
