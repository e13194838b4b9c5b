"""Upsampling (nearest, nearest-exact, linear, bilinear, trilinear, bicubic, antialiased bilinear and
bicubic), reflection/replication
padding and grid sampling (`F.grid_sample` on 4-d and 5-d inputs) on pjrt against the CPU, in every eager
mode: values and input gradients (and the grid's), odd and fractional scales, align_corners,
bfloat16, PyTorch's errors, and a U-Net-style block that fuses into one region. Nothing may fall
back to the CPU."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_pjrt
from conftest import in_mode_without_fallbacks, seeded

TOL = {"rtol": 1e-5, "atol": 1e-5}


def check(fn, x, **tol):
    tol = {**TOL, **tol}
    results = []
    for device in ("cpu", "pjrt"):
        t = x.detach().to(device).requires_grad_()
        y = fn(t)
        y.backward(torch.randn(y.shape, generator=seeded(7)).to(device))
        results.append((y.detach().cpu(), t.grad.cpu()))
    (expected, expected_grad), (actual, actual_grad) = results
    torch.testing.assert_close(actual, expected, **tol)
    torch.testing.assert_close(actual_grad, expected_grad, **tol)


X1 = torch.randn(2, 3, 7, generator=seeded(0))
X2 = torch.randn(2, 3, 5, 6, generator=seeded(1))
X3 = torch.randn(1, 2, 3, 4, 5, generator=seeded(2))
XL = torch.randn(2, 3, 31, 20, generator=seeded(3))

RESAMPLE = {
    "nearest_2x": (X2, lambda x: F.interpolate(x, scale_factor=2, mode="nearest")),
    "nearest_size": (X2, lambda x: F.interpolate(x, size=(7, 4), mode="nearest")),
    "nearest_fraction": (X2, lambda x: F.interpolate(x, scale_factor=1.7, mode="nearest")),
    "nearest_1d": (X1, lambda x: F.interpolate(x, size=11, mode="nearest")),
    "nearest_3d": (X3, lambda x: F.interpolate(x, scale_factor=(2, 1, 0.6), mode="nearest")),
    "nearest_exact": (X2, lambda x: F.interpolate(x, size=(9, 4), mode="nearest-exact")),
    "linear_1d": (X1, lambda x: F.interpolate(x, size=12, mode="linear")),
    "bilinear": (X2, lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")),
    "bilinear_down": (X2, lambda x: F.interpolate(x, size=(3, 4), mode="bilinear")),
    "bilinear_corners": (X2, lambda x: F.interpolate(x, size=(8, 9), mode="bilinear", align_corners=True)),
    "bilinear_fraction": (X2, lambda x: F.interpolate(x, scale_factor=1.3, mode="bilinear",
                                                     recompute_scale_factor=False)),
    "trilinear": (X3, lambda x: F.interpolate(x, size=(5, 3, 7), mode="trilinear")),
    "bicubic": (X2, lambda x: F.interpolate(x, scale_factor=2, mode="bicubic")),
    "bicubic_down": (X2, lambda x: F.interpolate(x, size=(3, 4), mode="bicubic")),
    "bicubic_corners": (X2, lambda x: F.interpolate(x, size=(8, 11), mode="bicubic", align_corners=True)),
    # Antialiased (PIL-style) resizes: shrinking stretches the filter over every input pixel.
    "bilinear_antialias_down": (XL, lambda x: F.interpolate(x, size=(7, 5), mode="bilinear", antialias=True)),
    "bilinear_antialias_up": (X2, lambda x: F.interpolate(x, size=(9, 13), mode="bilinear", antialias=True)),
    "bilinear_antialias_corners": (XL, lambda x: F.interpolate(x, size=(5, 6), mode="bilinear", antialias=True,
                                                              align_corners=True)),
    "bilinear_antialias_fraction": (XL, lambda x: F.interpolate(x, scale_factor=0.37, mode="bilinear",
                                                               antialias=True)),
    "bicubic_antialias_down": (XL, lambda x: F.interpolate(x, size=(6, 9), mode="bicubic", antialias=True)),
    "bicubic_antialias_up": (X2, lambda x: F.interpolate(x, size=(8, 8), mode="bicubic", antialias=True)),
}


@pytest.mark.parametrize("name", list(RESAMPLE))
def test_upsampling_and_its_gradient(mode, name):
    x, fn = RESAMPLE[name]
    check(fn, x)


def test_bilinear_upsampling_of_bfloat16_rounds_once(mode):
    x = X2.bfloat16()
    y = F.interpolate(x.to("pjrt"), scale_factor=2, mode="bilinear")
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.cpu(), F.interpolate(x, scale_factor=2, mode="bilinear"))


PADS = {
    "reflect_1d": (X1, lambda x: F.pad(x, (3, 2), mode="reflect")),
    "reflect_2d": (X2, lambda x: F.pad(x, (1, 2, 4, 0), mode="reflect")),
    "reflect_3d": (X3, lambda x: F.pad(x, (1, 1, 2, 0, 1, 2), mode="reflect")),
    "replicate_1d": (X1, lambda x: F.pad(x, (4, 9), mode="replicate")),
    "replicate_2d": (X2, lambda x: F.pad(x, (2, 2, 6, 1), mode="replicate")),
    "replicate_3d": (X3, lambda x: F.pad(x, (0, 3, 1, 1, 2, 0), mode="replicate")),
    "reflect_unbatched": (X2[0], lambda x: F.pad(x, (2, 1, 1, 3), mode="reflect")),
    "reflection_module": (X2, nn.ReflectionPad2d(2)),
    "replication_module": (X2, nn.ReplicationPad2d((1, 0, 2, 3))),
}


@pytest.mark.parametrize("name", list(PADS))
def test_padding_and_its_gradient(mode, name):
    x, fn = PADS[name]
    check(fn, x)


def test_reflection_padding_wider_than_the_input_is_refused(pjrt):
    x = X2.to(pjrt)
    with pytest.raises(RuntimeError, match="Padding size should be less than the corresponding input dimension"):
        F.pad(x, (6, 0, 0, 0), mode="reflect")
    with pytest.raises(RuntimeError, match=r"expected a 4-D input .* but got a tensor of shape \[2, 3, 7\]"):
        torch.ops.aten.upsample_bilinear2d(X1.to(pjrt), [4, 4], False)
    # The engine is still usable.
    torch.testing.assert_close(F.pad(x, (1, 1, 1, 1), mode="reflect").cpu(),
                               F.pad(X2, (1, 1, 1, 1), mode="reflect"))


class UpBlock(nn.Module):
    """A U-Net decoder step: reflection-padded convolution, then bilinear upsampling."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(F.pad(x, (1, 1, 1, 1), mode="reflect")).relu()
        return F.interpolate(y, scale_factor=2, mode="bilinear") + F.interpolate(y, scale_factor=2)


def test_a_unet_block_trains_in_one_region_per_step():
    def step(device):
        torch.manual_seed(0)
        block = UpBlock().to(device)
        x = X2.to(device)
        loss = block(x).square().mean()
        loss.backward()
        return loss.detach().cpu(), block.conv.weight.grad.cpu()

    expected = step("cpu")
    with in_mode_without_fallbacks("defer_and_fuse"):
        actual = step("pjrt")
        torch_pjrt.sync()
        metrics = torch_pjrt.metrics()
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, **TOL)
    assert metrics["regions"] == 1, metrics


def test_layouts_follow_pytorchs_memory_format_rules(mode):
    # clone keeps a dense input's strides; contiguous(memory_format=...) gives that format; and
    # upsampling a channels-last batch gives a channels-last batch, as on the CPU.
    cl = X2.contiguous(memory_format=torch.channels_last)
    p = cl.to("pjrt")
    assert p.clone().stride() == cl.clone().stride()
    t = X2[0].transpose(1, 2)
    assert t.to("pjrt").clone().stride() == t.clone().stride()
    c = X2.to("pjrt").contiguous(memory_format=torch.channels_last)
    assert c.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(c.cpu(), X2)
    up = F.interpolate(p, scale_factor=2, mode="bilinear")
    assert up.stride() == F.interpolate(cl, scale_factor=2, mode="bilinear").stride()
    torch.testing.assert_close(up.cpu(), F.interpolate(cl, scale_factor=2, mode="bilinear"), **TOL)


def test_uint8_bilinear_upsampling_takes_the_cpus_rounding(pjrt):
    image = torch.randint(0, 256, (1, 3, 6, 5), dtype=torch.uint8, generator=seeded(8))
    got = F.interpolate(image.to(pjrt), size=(9, 7), mode="bilinear")
    assert torch.equal(got.cpu(), F.interpolate(image, size=(9, 7), mode="bilinear"))
    # It is counted as a CPU fallback: the device has no uint8 fixed-point path.
    assert torch_pjrt.metrics()["fallback_ops"].get("aten::upsample_bilinear2d for Byte inputs", 0) >= 1


# ---- grid sampling -------------------------------------------------------------------------------

def grid_for(shape, seed):
    # Inside and outside [-1, 1], the corners, the centre, and far and non-finite coordinates.
    g = torch.rand(*shape, 2, generator=seeded(seed), dtype=torch.float64) * 3 - 1.5
    flat = g.view(-1, 2)
    edges = [[1.0, -1.0], [-1.0, -1.0], [0.0, 0.0], [0.999, -0.25], [1e4, -3e3],
             [float("nan"), 0.0], [float("inf"), 0.2], [-float("inf"), 0.5]]
    flat[: len(edges)] = torch.tensor(edges, dtype=torch.float64)
    return g


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_and_its_gradients(mode, interpolation, padding_mode, align_corners):
    kwargs = dict(mode=interpolation, padding_mode=padding_mode, align_corners=align_corners)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(2, 3, 5, 7, generator=seeded(30), dtype=dtype)
        grid = grid_for((2, 4, 6), 31).to(dtype)
        # Values everywhere, non-finite coordinates included.
        expected = F.grid_sample(x, grid, **kwargs)
        got = F.grid_sample(x.to("pjrt"), grid.to("pjrt"), **kwargs)
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4, equal_nan=True)
        # Gradients of the input and the grid at finite coordinates.
        finite = torch.rand(2, 4, 6, 2, generator=seeded(32), dtype=dtype) * 3 - 1.5
        finite[0, 0] = torch.tensor([[1.0, -1.0], [0.0, 0.0], [-1.0, 1.0], [0.5, 0.25], [2.0, -2.0], [1e4, 1.0]],
                                    dtype=dtype)
        results = []
        for device in ("cpu", "pjrt"):
            xs = x.detach().to(device).requires_grad_()
            gs = finite.detach().to(device).requires_grad_()
            out = F.grid_sample(xs, gs, **kwargs)
            out.backward(torch.randn(out.shape, generator=seeded(33), dtype=dtype).to(device))
            results.append([t.detach().cpu() for t in (out, xs.grad, gs.grad)])
        for a, e in zip(results[1], results[0]):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_volumetric_grid_sample_and_its_gradients(mode, interpolation, padding_mode, align_corners):
    kwargs = dict(mode=interpolation, padding_mode=padding_mode, align_corners=align_corners)
    x = torch.randn(2, 3, 4, 5, 6, generator=seeded(40), dtype=torch.float64)
    points = torch.rand(2, 3, 4, 2, 3, generator=seeded(41), dtype=torch.float64) * 2.4 - 1.2
    results = []
    for device in ("cpu", "pjrt"):
        xs = x.detach().to(device).requires_grad_()
        gs = points.detach().to(device).requires_grad_()
        out = F.grid_sample(xs, gs, **kwargs)
        out.backward(torch.randn(out.shape, generator=seeded(42), dtype=torch.float64).to(device))
        results.append([t.detach().cpu() for t in (out, xs.grad, gs.grad)])
    for a, e in zip(results[1], results[0]):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)
    with pytest.raises(RuntimeError, match="bicubic interpolation only supports 4D input"):
        F.grid_sample(x.to("pjrt"), points.to("pjrt"), mode="bicubic", align_corners=False)
    # Integer volumes are refused, as PyTorch's kernels refuse them.
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        F.grid_sample(x.long().to("pjrt"), points.long().to("pjrt"), align_corners=False)


def test_grid_sample_refuses_what_the_cpu_refuses(mode):
    x = torch.randn(1, 2, 4, 4)
    for device in ("cpu", "pjrt"):
        with pytest.raises(RuntimeError, match="same batch size"):
            F.grid_sample(x.to(device), torch.zeros(2, 3, 3, 2).to(device), align_corners=False)
        with pytest.raises(RuntimeError, match="same dtype|expected scalar type Float"):
            F.grid_sample(x.to(device), torch.zeros(1, 3, 3, 2, dtype=torch.float64).to(device),
                          align_corners=False)
    assert F.grid_sample(x.to("pjrt"), torch.zeros(1, 3, 3, 2).to("pjrt"), align_corners=False).shape \
        == (1, 2, 3, 3)


def test_a_spatial_transformer_step_runs_in_one_region():
    # affine_grid, then grid_sample, then a convolution: forward and backward on pjrt, against
    # the CPU, with the whole step in one region.
    def step(device, theta_init):
        torch.manual_seed(0)
        conv = nn.Conv2d(3, 4, 3, padding=1).to(device)
        theta = theta_init.clone().to(device).requires_grad_()
        x = torch.randn(2, 3, 8, 8, generator=seeded(34)).to(device)
        grid = F.affine_grid(theta, (2, 3, 8, 8), align_corners=False)
        y = conv(F.grid_sample(x, grid, align_corners=False))
        loss = y.square().mean()
        loss.backward()
        return loss.item(), theta.grad.cpu(), conv.weight.grad.cpu()

    # Off the pixel grid: where a coordinate lands exactly on a pixel, the grid's gradient
    # is one-sided, and a last-bit difference in affine_grid would pick the other side.
    theta = torch.tensor([[[0.93, 0.07, 0.031], [-0.11, 1.07, 0.013]]]).repeat(2, 1, 1)
    expected = step("cpu", theta)
    with in_mode_without_fallbacks("defer_and_fuse"):
        step("pjrt", theta)  # compile
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()
        got = step("pjrt", theta)
        regions = torch_pjrt.metrics()["regions"]
    assert got[0] == pytest.approx(expected[0], rel=1e-5)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[2], expected[2], rtol=1e-4, atol=1e-5)
    assert regions == 1, regions
