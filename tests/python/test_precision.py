"""Float32 product precision: `torch.set_float32_matmul_precision` and the scoped
`torch.pjrt.precision` reach each product's and convolution's `precision_config`, key programs
apart, and leave everything else as it was (RFC 0034)."""

import glob
import json
import os
import threading

import pytest
import torch

import torch_pjrt
from conftest import run_python

DUMP_PROBE = """
import json, torch, torch_pjrt
a, b = torch.randn(8, 16).to("pjrt"), torch.randn(16, 4).to("pjrt")
x, w = torch.randn(1, 2, 6, 6).to("pjrt"), torch.randn(3, 2, 3, 3).to("pjrt")
h, hb = a.to(torch.float64), b.to(torch.float64)
with torch.pjrt.precision("{mode}"):
    (a @ b).cpu()
    torch.nn.functional.conv2d(x, w).cpu()
    (h @ hb).cpu()
    torch.linalg.vector_norm(a).cpu()
"""


@pytest.mark.parametrize(
    "mode, expected", [("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")]
)
def test_the_setting_reaches_the_emitted_module(tmp_path, mode, expected):
    proc = run_python(DUMP_PROBE.format(mode=mode), env={"TORCH_PJRT_DUMP_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    modules = [open(p).read() for p in glob.glob(os.path.join(tmp_path, "*.mlir"))]

    def precisions(op, dtype):
        found = set()
        for text in modules:
            for line in text.splitlines():
                if op in line and f"tensor<{dtype}" in line.split("->")[-1]:
                    found.update(
                        word.split(">")[0]
                        for word in line.split("#stablehlo<precision ")[1:]
                    )
        return found

    # float32 products and convolutions follow the setting; float64 ones and the norm (not a
    # user's product) stay at full precision.
    assert precisions("stablehlo.dot_general", "8x4xf32") == {expected}
    assert precisions("stablehlo.convolution", "1x3x4x4xf32") == {expected}
    assert precisions("stablehlo.dot_general", "8x4xf64") == {"HIGHEST"}
    assert precisions("stablehlo.dot_general", "f32>") == {"HIGHEST"}


def test_the_precision_keys_programs_apart_and_the_default_keeps_its_programs():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    pa, pb = a.to("pjrt"), b.to("pjrt")
    with torch_pjrt.eager_mode("strict"):
        (pa @ pb).cpu()
        (pa + 1).cpu()
        torch_pjrt.sync()
        before = torch_pjrt.metrics()["compilations"]
        with torch.pjrt.precision("medium"):
            got = (pa @ pb).cpu()
            (pa + 1).cpu()  # not a product: the same program
            torch_pjrt.sync()
        after_medium = torch_pjrt.metrics()["compilations"]
        (pa @ pb).cpu()  # back to full precision: cached
        torch_pjrt.sync()
        after = torch_pjrt.metrics()["compilations"]
    assert after_medium - before == 1, "one new program: the product at 'medium'"
    assert after == after_medium
    # XLA's CPU compiler computes every precision in full float32.
    torch.testing.assert_close(got, a @ b)


def test_precision_scopes_nest_restore_and_follow_set_float32_matmul_precision():
    assert torch.get_float32_matmul_precision() == "highest"
    with torch.pjrt.precision("high"):
        assert torch.get_float32_matmul_precision() == "high"
        with torch.pjrt.precision("medium"):
            assert torch.get_float32_matmul_precision() == "medium"
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == "highest"

    @torch.pjrt.precision("medium")
    def inside():
        return torch.get_float32_matmul_precision()

    assert inside() == "medium" and torch.get_float32_matmul_precision() == "highest"
    # Process-wide: another thread (autograd's backward threads) sees it.
    seen = []
    with torch.pjrt.precision("high"):
        t = threading.Thread(target=lambda: seen.append(torch.get_float32_matmul_precision()))
        t.start()
        t.join()
    assert seen == ["high"]
    with pytest.raises(ValueError, match="expected one of 'highest', 'high', 'medium'"):
        torch.pjrt.precision("low")


def test_a_backward_pass_runs_its_products_at_the_scoped_precision(tmp_path):
    probe = """
    import torch, torch_pjrt
    lin = torch.nn.Linear(16, 4).to("pjrt")
    x = torch.randn(8, 16).to("pjrt")
    with torch.pjrt.precision("medium"):
        lin(x).sum().backward()
    lin.weight.grad.cpu()
    """
    proc = run_python(probe, env={"TORCH_PJRT_DUMP_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = "\n".join(open(p).read() for p in glob.glob(os.path.join(tmp_path, "*.mlir")))
    products = [l for l in text.splitlines() if "stablehlo.dot_general" in l]
    assert len(products) >= 2, "the forward and the gradients' products"
    assert all("precision DEFAULT" in l for l in products), products
