"""torch.fft, stft and istft on pjrt: the transforms compose into `_fft_c2c`, `_fft_r2c` and
`_fft_c2r`, which the engine lowers to `stablehlo.fft`. Values and gradients against the CPU in
Strict and DeferAndFuse, both precisions, every normalization and dims in any order; the
`strict_or_fused_mode` fixture asserts that nothing fell back to the CPU."""

import pytest
import torch

import torch_pjrt
from conftest import in_mode_without_fallbacks, seeded

TOL = {
    torch.float32: dict(rtol=1e-4, atol=1e-4),
    torch.complex64: dict(rtol=1e-4, atol=1e-4),
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.complex128: dict(rtol=1e-10, atol=1e-10),
}
REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def sample(dtype, *shape, seed=0):
    g = seeded(seed)
    if dtype.is_complex:
        parts = torch.randn(2, *shape, generator=g, dtype=torch.float64)
        return torch.complex(parts[0], parts[1]).to(dtype)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def same(got, expected):
    assert got.device.type == "pjrt"
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    torch.testing.assert_close(got.cpu(), expected, **TOL[expected.dtype])


def against_cpu(fn, x):
    same(fn(x.to("pjrt")), fn(x))


NORMS = [None, "forward", "ortho"]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("norm", NORMS)
def test_complex_transforms(strict_or_fused_mode, dtype, norm):
    x = sample(dtype, 3, 8, 5)
    for fn in [torch.fft.fft, torch.fft.ifft]:
        against_cpu(lambda t: fn(t, norm=norm), x)
        against_cpu(lambda t: fn(t, n=11, dim=1, norm=norm), x)  # zero-padded
        against_cpu(lambda t: fn(t, n=3, dim=0, norm=norm), x)  # cut
    for fn in [torch.fft.fft2, torch.fft.ifft2, torch.fft.fftn, torch.fft.ifftn]:
        against_cpu(lambda t: fn(t, norm=norm), x)
    against_cpu(lambda t: torch.fft.fftn(t, dim=(2, 0), norm=norm), x)
    against_cpu(lambda t: torch.fft.fftn(t, s=(4, 6), dim=(-1, 0), norm=norm), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm", NORMS)
def test_real_transforms(strict_or_fused_mode, dtype, norm):
    x = sample(dtype, 4, 6, 9)
    for fn in [torch.fft.fft, torch.fft.ifft, torch.fft.rfft, torch.fft.ihfft]:
        against_cpu(lambda t: fn(t, norm=norm), x)
        against_cpu(lambda t: fn(t, dim=0, norm=norm), x)
        against_cpu(lambda t: fn(t, n=10, dim=1, norm=norm), x)
    for fn in [torch.fft.rfft2, torch.fft.rfftn, torch.fft.fftn, torch.fft.ihfft2]:
        against_cpu(lambda t: fn(t, norm=norm), x)
    # The halved dim is the last one named, wherever it lies.
    against_cpu(lambda t: torch.fft.rfftn(t, dim=(2, 0), norm=norm), x)
    against_cpu(lambda t: torch.fft.rfftn(t, dim=(1, 2, 0), norm=norm), x)
    # Integers are transformed in the default float dtype.
    against_cpu(torch.fft.rfft, torch.arange(10))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("norm", NORMS)
def test_inverse_real_transforms(strict_or_fused_mode, dtype, norm):
    # Frequencies that are not Hermitian: both sides ignore the imaginary part of the zero (and
    # Nyquist) frequency the same way.
    x = sample(dtype, 4, 6, 5)
    for fn in [torch.fft.irfft, torch.fft.hfft]:
        against_cpu(lambda t: fn(t, norm=norm), x)
        against_cpu(lambda t: fn(t, n=9, norm=norm), x)  # odd length
        against_cpu(lambda t: fn(t, n=4, dim=1, norm=norm), x)  # fewer frequencies read
        against_cpu(lambda t: fn(t, n=16, dim=0, norm=norm), x)  # zero-padded frequencies
    for fn in [torch.fft.irfft2, torch.fft.irfftn, torch.fft.hfft2]:
        against_cpu(lambda t: fn(t, norm=norm), x)
    against_cpu(lambda t: torch.fft.irfftn(t, s=(7, 6), dim=(2, 0), norm=norm), x)


def test_more_than_three_dims_and_round_trips(strict_or_fused_mode):
    x = sample(torch.float64, 2, 3, 4, 5, 6)
    against_cpu(torch.fft.fftn, x.to(torch.complex128))
    against_cpu(torch.fft.ifftn, x.to(torch.complex128))
    against_cpu(torch.fft.rfftn, x)
    against_cpu(lambda t: torch.fft.irfftn(t, s=(2, 3, 4, 5, 6)), torch.fft.rfftn(x))
    p = x.to("pjrt")
    same(torch.fft.irfftn(torch.fft.rfftn(p), s=x.shape), x)
    same(torch.fft.ifft(torch.fft.fft(p)).real, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_helpers(strict_or_fused_mode, dtype):
    x = sample(dtype, 5, 8)
    against_cpu(torch.fft.fftshift, x)
    against_cpu(torch.fft.ifftshift, x)
    against_cpu(lambda t: torch.fft.fftshift(torch.fft.fft2(t), dim=(-2, -1)), x)
    freqs = torch.fft.fftfreq(8, d=0.5, dtype=dtype, device="pjrt")
    same(freqs, torch.fft.fftfreq(8, d=0.5, dtype=dtype))
    same(torch.fft.rfftfreq(9, dtype=dtype, device="pjrt"), torch.fft.rfftfreq(9, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stft_and_istft(strict_or_fused_mode, dtype):
    signal = sample(dtype, 2, 200)
    window = torch.hann_window(32, dtype=dtype)

    def stft(t, **kw):
        return torch.stft(t, 32, hop_length=8, window=window.to(t.device), return_complex=True, **kw)

    against_cpu(stft, signal)
    against_cpu(lambda t: stft(t, center=False), signal)
    against_cpu(lambda t: stft(t, normalized=True, onesided=False), signal)
    spec = stft(signal)
    against_cpu(lambda s: torch.istft(s, 32, hop_length=8, window=window.to(s.device), length=200), spec)
    p = signal.to("pjrt")
    same(torch.istft(stft(p), 32, hop_length=8, window=window.to("pjrt"), length=200), signal)


def grads(fn, x):
    results = []
    for device in ("cpu", "pjrt"):
        xd = x.detach().to(device).requires_grad_()
        y = fn(xd)
        y = torch.view_as_real(y.resolve_conj()) if y.is_complex() else y
        weight = torch.randn(y.shape, generator=seeded(5), dtype=y.dtype).to(device)
        (y * weight).sum().backward()
        results.append((y.detach().cpu(), xd.grad.cpu()))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, **TOL[want.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients(strict_or_fused_mode, dtype):
    x = sample(dtype, 3, 8)
    z = sample({torch.float32: torch.complex64, torch.float64: torch.complex128}[dtype], 3, 8)
    grads(torch.fft.fft, z)
    grads(lambda t: torch.fft.ifft(t, norm="ortho"), z)
    grads(torch.fft.fft2, z)
    grads(torch.fft.rfft, x)
    grads(lambda t: torch.fft.rfft2(t, norm="forward"), x)
    grads(torch.fft.irfft, z)
    grads(lambda t: torch.fft.irfftn(t, s=(3, 9)), z)
    grads(torch.fft.hfft, z)
    grads(torch.fft.ihfft, x)
    window = torch.hann_window(8, dtype=dtype)
    grads(lambda t: torch.stft(t, 8, hop_length=2, window=window.to(t.device), return_complex=True), x)
    spec = torch.stft(sample(dtype, 64), 8, hop_length=2, window=window, return_complex=True)
    grads(lambda s: torch.istft(s, 8, hop_length=2, window=window.to(s.device), length=64), spec)


def test_out_variants(strict_or_fused_mode):
    z = sample(torch.complex64, 4, 6)
    out = torch.empty(4, 6, dtype=torch.complex64, device="pjrt")
    result = torch.fft.fft(z.to("pjrt"), out=out)
    assert result is out
    same(out, torch.fft.fft(z))
    real_out = torch.empty(0, device="pjrt")
    torch.fft.irfft(z.to("pjrt"), out=real_out)
    same(real_out, torch.fft.irfft(z))
    half_out = torch.empty(4, 4, dtype=torch.complex64, device="pjrt")
    torch.fft.rfft(z.real.contiguous().to("pjrt"), out=half_out)
    same(half_out, torch.fft.rfft(z.real.contiguous()))


def test_fourier_mixing_runs_in_one_region():
    # FNet's token mixing: the real part of a 2-d transform over the sequence and hidden dims.
    x = sample(torch.float32, 2, 16, 32)
    with in_mode_without_fallbacks("defer_and_fuse"):
        y = torch.fft.fft(torch.fft.fft(x.to("pjrt"), dim=-1), dim=-2).real
        torch_pjrt.sync()
        m = torch_pjrt.metrics()
        assert m["regions"] == 1 and m["region_ops"] == 2, m["compiled_programs"]
        same(y, torch.fft.fft(torch.fft.fft(x, dim=-1), dim=-2).real)


def test_errors(pjrt):
    with pytest.raises(RuntimeError, match="Invalid number of data points"):
        torch.fft.fft(torch.ones(4, device=pjrt), n=0)
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.fft.fft(torch.ones(4, device=pjrt), dim=2)
    with pytest.raises(RuntimeError, match="unique"):
        torch.fft.fftn(torch.ones(4, 4, device=pjrt), dim=(0, 0))
    # Empty batches transform to empty results.
    empty = torch.ones(0, 8, dtype=torch.complex64, device=pjrt)
    assert torch.fft.fft(empty).shape == (0, 8)
    assert torch.fft.irfft(empty).shape == (0, 14)
    assert torch_pjrt.metrics()["fallback_ops"] == {}
