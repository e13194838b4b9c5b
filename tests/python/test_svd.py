"""The singular value decomposition on the device (`_linalg_svd`, RFC 0052) and what PyTorch
composes from it: `svd`, `svdvals`, `pinv`, `matrix_rank`, `cond`, the spectral and nuclear
norms, the legacy `torch.svd`, and `lstsq` with each LAPACK driver's results. Values and gradients against the CPU in every eager mode
(quantities that do not depend on the singular vectors' signs), orthonormal vectors for square,
tall, wide, batched and rank-deficient matrices, LAPACK's column-major layout, PyTorch's errors,
and nothing falling back to the CPU (the `mode` fixture checks)."""

import pytest
import torch

from conftest import assert_close, check_against_cpu as check, seeded

F32 = {"rtol": 1e-4, "atol": 1e-4}
F64 = {"rtol": 1e-9, "atol": 1e-9}


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=seeded(seed), dtype=dtype)


def distinct(*shape, seed=0, dtype=torch.float32):
    """Matrices with well-separated singular values (2, 3, 4, ...), whose singular vectors are
    unique up to sign, so gradients through them are well defined."""
    *batch, m, n = shape
    k = min(m, n)
    u = torch.linalg.qr(randn(*batch, m, k, seed=seed, dtype=dtype))[0]
    v = torch.linalg.qr(randn(*batch, n, k, seed=seed + 1, dtype=dtype))[0]
    s = torch.arange(k, 0, -1, dtype=dtype) + 1
    return u @ torch.diag_embed(s.expand(*batch, k)) @ v.mT


def rank_deficient(m, n, rank, seed=0, dtype=torch.float32):
    return randn(m, rank, seed=seed, dtype=dtype) @ randn(rank, n, seed=seed + 1, dtype=dtype)


SHAPES = [(4, 4), (6, 3), (3, 6), (2, 5, 4), (2, 3, 4, 5), (1, 1), (7, 1)]


def reconstruct(u, s, vh):
    k = s.shape[-1]
    return (u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :]


def assert_orthonormal_columns(q, tol):
    eye = torch.eye(q.shape[-1], dtype=q.dtype).expand(*q.shape[:-2], -1, -1)
    torch.testing.assert_close((q.mT @ q).cpu(), eye, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("full_matrices", [False, True])
def test_factors_are_an_svd_of_the_input(mode, shape, full_matrices, dtype):
    tol = F32 if dtype == torch.float32 else F64
    a = randn(*shape, dtype=dtype)
    u, s, vh = torch.linalg.svd(a.to("pjrt"), full_matrices=full_matrices)
    eu, es, evh = torch.linalg.svd(a, full_matrices=full_matrices)
    assert (u.shape, s.shape, vh.shape) == (eu.shape, es.shape, evh.shape)
    assert (u.stride(), s.stride(), vh.stride()) == (eu.stride(), es.stride(), evh.stride())
    assert_close(s, es, **tol)
    assert_close(reconstruct(u, s, vh), a, **tol)
    assert_orthonormal_columns(u, tol)
    assert_orthonormal_columns(vh.mT, tol)
    # Each singular vector is LAPACK's up to sign.
    k = s.shape[-1]
    assert_close(u[..., :k].abs(), eu[..., :k].abs(), **tol)
    assert_close(vh[..., :k, :].abs(), evh[..., :k, :].abs(), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "name, call, make",
    [
        ("svdvals", torch.linalg.svdvals, lambda d: distinct(2, 5, 3, dtype=d)),
        ("svdvals wide", torch.linalg.svdvals, lambda d: distinct(3, 6, dtype=d)),
        # Sign-free functions of the vectors: what PyTorch's own OpInfo checks.
        ("U abs", lambda a: torch.linalg.svd(a, full_matrices=False)[0].abs(), lambda d: distinct(5, 3, dtype=d)),
        ("Vh abs", lambda a: torch.linalg.svd(a, full_matrices=False)[2].abs(), lambda d: distinct(3, 5, dtype=d)),
        ("U Vh", lambda a: (lambda u, s, vh: u @ vh)(*torch.linalg.svd(a, full_matrices=False)),
         lambda d: distinct(2, 4, 4, dtype=d)),
        ("pinv", torch.linalg.pinv, lambda d: distinct(5, 3, dtype=d)),
        ("pinv wide", torch.linalg.pinv, lambda d: distinct(2, 3, 4, dtype=d)),
        ("spectral norm", lambda a: torch.linalg.matrix_norm(a, ord=2), lambda d: distinct(2, 4, 3, dtype=d)),
        ("nuclear norm", lambda a: torch.linalg.matrix_norm(a, ord="nuc"), lambda d: distinct(4, 3, dtype=d)),
        ("cond", torch.linalg.cond, lambda d: distinct(4, 4, dtype=d)),
        ("legacy svd V abs", lambda a: torch.svd(a)[2].abs(), lambda d: distinct(5, 4, dtype=d)),
    ],
)
def test_values_and_gradients_match_the_cpu(mode, name, call, make, dtype):
    check(call, (make(dtype),), **(F32 if dtype == torch.float32 else F64))


def test_rank_deficient_matrices_keep_orthonormal_vectors(mode):
    for a in [rank_deficient(5, 4, 2), rank_deficient(4, 4, 1, seed=3), rank_deficient(3, 6, 2, seed=5),
              torch.zeros(3, 3)]:
        u, s, vh = torch.linalg.svd(a.to("pjrt"), full_matrices=True)
        assert_close(s, torch.linalg.svdvals(a), **F32)
        assert_orthonormal_columns(u, F32)
        assert_orthonormal_columns(vh.mT, F32)
        assert_close(reconstruct(u, s, vh), a, **F32)
        assert torch.linalg.matrix_rank(a.to("pjrt")).item() == torch.linalg.matrix_rank(a).item()
        assert_close(torch.linalg.pinv(a.to("pjrt")), torch.linalg.pinv(a), **F32)


def test_values_only_and_empty_results(mode):
    a = randn(3, 4, 2)
    u, s, vh = torch._linalg_svd(a.to("pjrt"), compute_uv=False)
    assert u.shape == vh.shape == (0,)
    assert_close(s, torch.linalg.svdvals(a), **F32)
    legacy_u, legacy_s, legacy_v = torch.svd(a.to("pjrt"), compute_uv=False)
    assert legacy_u.shape == (3, 4, 4) and legacy_v.shape == (3, 2, 2)
    assert_close(legacy_s, s.cpu(), **F32)
    for empty in [torch.zeros(0, 3), torch.zeros(2, 3, 0), torch.zeros(0, 0)]:
        for full_matrices in [False, True]:
            got = torch.linalg.svd(empty.to("pjrt"), full_matrices=full_matrices)
            for g, e in zip(got, torch.linalg.svd(empty, full_matrices=full_matrices)):
                assert_close(g, e)


def test_out_forms(mode):
    a = randn(4, 3)
    u, s, vh = (torch.empty(0, device="pjrt") for _ in range(3))
    torch.linalg.svd(a.to("pjrt"), full_matrices=False, out=(u, s, vh))
    assert_close(reconstruct(u, s, vh), a, **F32)
    values = torch.empty(0, device="pjrt")
    torch.linalg.svdvals(a.to("pjrt"), out=values)
    assert_close(values, torch.linalg.svdvals(a), **F32)


@pytest.mark.parametrize(
    "call, a, error, message",
    [
        (torch.linalg.svd, torch.ones(3), RuntimeError, "at least 2 dimensions"),
        (torch.linalg.svd, torch.ones(2, 2, dtype=torch.long), RuntimeError, "Expected a floating point or complex"),
        (lambda t: torch.linalg.svd(t, driver="gesvd"), torch.eye(2), RuntimeError, "only supported on CUDA"),
        (torch.linalg.svdvals, torch.eye(2, dtype=torch.bfloat16), NotImplementedError, "not implemented for 'BFloat16'"),
    ],
)
def test_bad_input_raises_pytorchs_error(mode, call, a, error, message):
    with pytest.raises(error, match=message):
        call(a)
    with pytest.raises(error, match=message):
        call(a.to("pjrt"))
    # The engine stays usable after the error.
    assert_close(torch.linalg.svdvals(torch.eye(2, device="pjrt")), torch.ones(2))


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
def test_lstsq_returns_what_each_lapack_driver_returns(mode, driver):
    cases = [
        (randn(5, 3), randn(5, 2, seed=1)),
        (randn(3, 5), randn(3, 2, seed=1)),
        (randn(4, 4, dtype=torch.float64), randn(4, 2, seed=1, dtype=torch.float64)),
        (randn(2, 5, 3), randn(1, 5, 2, seed=1)),
        (randn(1, 5, 3), randn(3, 5, 2, seed=1)),
        (randn(5, 3), randn(5, seed=1)),
    ]
    if driver != "gels":
        # `gels` assumes full rank; the others return the minimum-norm solution and the rank.
        cases.append((rank_deficient(6, 4, 2), randn(6, 3, seed=1)))
    for a, b in cases:
        got = torch.linalg.lstsq(a.to("pjrt"), b.to("pjrt"), driver=driver)
        expected = torch.linalg.lstsq(a, b, driver=driver)
        for name, g, e in zip(["solution", "residuals", "rank", "singular_values"], got, expected):
            assert (g.shape, g.dtype, g.stride()) == (e.shape, e.dtype, e.stride()), name
            assert_close(g, e, **(F32 if a.dtype == torch.float32 else F64))


def test_lstsq_gradients_match_the_cpu(mode):
    check(lambda a, b: torch.linalg.lstsq(a, b).solution, (distinct(5, 3), randn(5, 2, seed=1)), grads_of=(0, 1),
          **F32)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda a, b: torch.linalg.lstsq(a, b, driver="lu"), "should be one of \\(gels, gelsy, gelsd, gelss\\)"),
        (lambda a, b: torch.linalg.lstsq(a, b[:3]), "input.size\\(-2\\) should match other.size\\(-2\\)"),
        (lambda a, b: torch.linalg.lstsq(a, b.double()), "Expected input and other to have the same dtype"),
        (lambda a, b: torch.linalg.lstsq(a, b.expand(2, 5, 2)), "input.dim\\(\\) must be greater or equal to other.dim\\(\\)"),
    ],
)
def test_lstsq_bad_input_raises_pytorchs_error(mode, call, message):
    a, b = randn(5, 3), randn(5, 2, seed=1)
    with pytest.raises(RuntimeError, match=message):
        call(a, b)
    with pytest.raises(RuntimeError, match=message):
        call(a.to("pjrt"), b.to("pjrt"))
