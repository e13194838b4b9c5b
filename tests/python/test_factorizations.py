"""Matrix factorizations on the device and what composes from them: Cholesky (`cholesky`,
`cholesky_solve`, `cholesky_inverse`), LU with partial pivoting (`lu_factor`, `lu_solve`,
`lu_unpack`, `linalg.lu`, so `solve`, `inv`, `det`, `slogdet`, `logdet`, `matrix_power`), QR and
the symmetric eigendecomposition (`eigh`, `eigvalsh`), and `matrix_exp` (scaling and squaring). Values and gradients against the CPU in
every eager mode, LAPACK's `info` and PyTorch's errors, LAPACK's column-major result layout, and
nothing falling back to the CPU (the `mode` fixture checks). Complex matrices run on the CPU."""

import pytest
import torch
import torch_pjrt

from conftest import assert_close, check_against_cpu as check, seeded

F32 = {"rtol": 1e-4, "atol": 1e-4}


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=seeded(seed), dtype=dtype)


def spd(*batch, n=4, seed=0, dtype=torch.float32):
    """Well-conditioned symmetric positive-definite matrices."""
    a = randn(*batch, n, n, seed=seed, dtype=dtype)
    return a @ a.mT + n * torch.eye(n, dtype=dtype)


def general(*batch, n=4, seed=0, dtype=torch.float32):
    return randn(*batch, n, n, seed=seed, dtype=dtype) + 2 * torch.eye(n, dtype=dtype)


def on_pjrt(call, *inputs):
    return call(*[t.to("pjrt") for t in inputs])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "name, call, make",
    [
        ("cholesky", lambda a: torch.linalg.cholesky(a), lambda d: spd(3, dtype=d)),
        ("cholesky upper", lambda a: torch.linalg.cholesky(a, upper=True), lambda d: spd(2, dtype=d)),
        ("solve", lambda a: torch.linalg.solve(a, torch.ones(4, 2, dtype=a.dtype, device=a.device)),
         lambda d: general(3, dtype=d)),
        ("inv", torch.linalg.inv, lambda d: general(2, 1, dtype=d)),
        ("det", torch.linalg.det, lambda d: general(3, dtype=d)),
        ("logabsdet", lambda a: torch.linalg.slogdet(a)[1], lambda d: general(3, dtype=d)),
        ("matrix_power -2", lambda a: torch.linalg.matrix_power(a, -2), lambda d: general(dtype=d)),
        ("qr R", lambda a: torch.linalg.qr(a)[1].abs(), lambda d: randn(2, 5, 3, dtype=d)),
        ("eigvalsh", torch.linalg.eigvalsh, lambda d: spd(2, dtype=d)),
    ],
)
def test_values_and_gradients_match_the_cpu(mode, name, call, make, dtype):
    tol = F32 if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-9}
    check(call, (make(dtype),), **tol)


def test_factors_and_permutations_match_lapack(mode):
    a = randn(2, 5, 5)
    lu, pivots = on_pjrt(torch.linalg.lu_factor, a)
    expected_lu, expected_pivots = torch.linalg.lu_factor(a)
    assert_close(lu, expected_lu, **F32)
    assert_close(pivots, expected_pivots)
    for wide_or_tall in [randn(4, 6, seed=1), randn(6, 4, seed=2)]:
        for got, expected in zip(on_pjrt(torch.linalg.lu, wide_or_tall), torch.linalg.lu(wide_or_tall)):
            assert_close(got, expected, **F32)
    b = randn(2, 5, 3, seed=3)
    for adjoint in [False, True]:
        got = torch.linalg.lu_solve(lu, pivots, b.to("pjrt"), adjoint=adjoint)
        assert_close(got, torch.linalg.lu_solve(expected_lu, expected_pivots, b, adjoint=adjoint), **F32)
    got = torch.linalg.lu_solve(lu, pivots, b.mT.to("pjrt"), left=False)
    assert_close(got, torch.linalg.lu_solve(expected_lu, expected_pivots, b.mT, left=False), **F32)
    for got, expected in zip(torch.lu_unpack(lu, pivots), torch.lu_unpack(expected_lu, expected_pivots)):
        assert_close(got, expected, **F32)


def test_qr_and_eigh_reconstruct_their_input(mode):
    for a in [randn(2, 5, 3), randn(3, 5)]:
        for qr_mode in ["reduced", "complete"]:
            q, r = on_pjrt(lambda t: torch.linalg.qr(t, mode=qr_mode), a)
            eq, er = torch.linalg.qr(a, mode=qr_mode)
            assert q.shape == eq.shape and r.shape == er.shape
            assert_close(q @ r, a, **F32)
            assert_close(q.mT @ q, torch.eye(q.shape[-1]).expand(q.mT.shape[:-1] + (q.shape[-1],)), **F32)
            assert_close(r, r.triu().cpu())
        assert on_pjrt(lambda t: torch.linalg.qr(t, mode="r"), a)[0].shape == (0,)
    s = spd(2)
    for uplo in ["L", "U"]:
        # Only the named triangle is read.
        lopsided = s.tril() if uplo == "L" else s.triu()
        w, v = on_pjrt(lambda t: torch.linalg.eigh(t, UPLO=uplo), lopsided)
        ew, _ = torch.linalg.eigh(s)
        assert_close(w, ew, **F32)
        assert_close(v @ torch.diag_embed(w) @ v.mT, s, rtol=1e-4, atol=1e-3)


def test_results_keep_lapacks_column_major_layout(mode):
    a = general(2)
    cases = [
        lambda t: torch.linalg.cholesky(t @ t.mT),
        lambda t: torch.linalg.lu_factor(t)[0],
        lambda t: torch.linalg.solve(t, t[..., :3]),
        lambda t: torch.linalg.solve(t, t[..., 0]),
        torch.linalg.inv,
        lambda t: torch.linalg.qr(t)[0],
        lambda t: torch.linalg.eigh(t @ t.mT)[1],
    ]
    for call in cases:
        assert call(a.to("pjrt")).stride() == call(a).stride()


def test_singular_and_indefinite_matrices_report_as_lapack(mode):
    # Exactly singular in any rounding (XLA contracts the elimination's update into fused
    # multiply-adds where LAPACK rounds the product first, so a singular matrix whose zero
    # pivot comes from cancellation may meet a pivot of 1e-7 instead).
    singular = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    assert_close(on_pjrt(torch.linalg.det, singular), torch.linalg.det(singular))
    sign, logabsdet = on_pjrt(torch.linalg.slogdet, singular)
    assert sign.item() == 0.0 and logabsdet.item() == float("-inf")
    assert_close(on_pjrt(torch.linalg.lu_factor_ex, singular)[2], torch.linalg.lu_factor_ex(singular)[2])
    assert on_pjrt(torch.linalg.inv_ex, singular)[1].item() == torch.linalg.inv_ex(singular)[1].item() == 3
    with pytest.raises(torch.linalg.LinAlgError, match="the input matrix is singular"):
        on_pjrt(torch.linalg.inv, singular)
    with pytest.raises(torch.linalg.LinAlgError, match="The solver failed because the input matrix is singular"):
        on_pjrt(lambda t: torch.linalg.solve(t, t[:, 0]), singular)
    indefinite = torch.stack([torch.eye(3), torch.tensor([[4.0, 2, 0], [2, 1, 0], [0, 0, 1]])])
    assert on_pjrt(torch.linalg.cholesky_ex, indefinite)[1].tolist() == [0, 2]
    with pytest.raises(torch.linalg.LinAlgError, match=r"\(Batch element 1\).*leading minor of order 2"):
        on_pjrt(torch.linalg.cholesky, indefinite)
    # The engine stays usable after the error.
    assert_close(on_pjrt(torch.linalg.cholesky, indefinite[0]), torch.eye(3))


def test_empty_matrices(mode):
    for call, a in [
        (torch.linalg.cholesky, torch.zeros(0, 3, 3)),
        (torch.linalg.det, torch.zeros(2, 0, 0)),
        (torch.linalg.inv, torch.zeros(0, 0)),
        (lambda t: torch.linalg.qr(t, mode="complete")[0], torch.zeros(3, 0)),
        (lambda t: torch.linalg.eigh(t)[0], torch.zeros(0, 0)),
        (lambda t: torch.linalg.lu(t)[2], torch.zeros(2, 0, 3)),
    ]:
        assert_close(on_pjrt(call, a), call(a))


def test_lu_without_pivoting_runs_on_the_device(mode):
    # The CPU refuses `pivot=False` (CUDA computes it); P A = L U with P the identity.
    a = general(3)
    p, l, u = on_pjrt(lambda t: torch.linalg.lu(t, pivot=False), a)
    assert p.shape == (0,)
    assert_close(l @ u, a, **F32)
    pivots = torch.linalg.lu_factor(a.to("pjrt"), pivot=False)[1]
    assert torch.equal(pivots.cpu(), torch.tensor([1, 2, 3, 4], dtype=torch.int32).expand(3, 4))


@pytest.mark.parametrize(
    "call, a, error, message",
    [
        (torch.linalg.cholesky, torch.zeros(2, 3), RuntimeError, "A must be batches of square matrices"),
        (torch.linalg.cholesky, torch.ones(3), RuntimeError, "at least 2 dimensions"),
        (torch.linalg.det, torch.ones(2, 2, dtype=torch.long), RuntimeError, "Expected a floating point or complex"),
        (torch.linalg.inv, torch.eye(2, dtype=torch.half), RuntimeError, "Low precision dtypes not supported"),
        (torch.linalg.cholesky, torch.eye(2, dtype=torch.bfloat16), NotImplementedError, "not implemented for 'BFloat16'"),
        (lambda t: torch.linalg.qr(t, mode="x"), torch.eye(2), RuntimeError, "unrecognized mode 'x'"),
        (lambda t: torch.linalg.eigh(t, UPLO="X"), torch.eye(2), RuntimeError, "UPLO argument to be 'L' or 'U'"),
        (lambda t: torch.linalg.solve(t, t.double()), torch.eye(2), RuntimeError, "to have the same dtype"),
        (lambda t: torch.linalg.lu_solve(t, torch.ones(2, dtype=torch.long, device=t.device), t), torch.eye(2),
         RuntimeError, "pivots should be a Tensor of scalar type torch.int32"),
    ],
)
def test_bad_input_raises_pytorchs_error(mode, call, a, error, message):
    with pytest.raises(error, match=message):
        call(a)
    with pytest.raises(error, match=message):
        on_pjrt(call, a)


def test_out_forms(mode):
    a = general(2)
    out = torch.empty(0, device="pjrt")
    torch.linalg.inv(a.to("pjrt"), out=out)
    assert_close(out, torch.linalg.inv(a), **F32)
    q, r = torch.empty(0, device="pjrt"), torch.empty(0, device="pjrt")
    torch.linalg.qr(a.to("pjrt"), out=(q, r))
    assert_close(q @ r, a, **F32)
    info = torch.empty(0, dtype=torch.int32, device="pjrt")
    factor = torch.empty(0, device="pjrt")
    torch.linalg.cholesky_ex(spd(2).to("pjrt"), out=(factor, info))
    assert_close(factor, torch.linalg.cholesky(spd(2)), **F32)


def test_a_solve_fuses_into_one_region():
    # `solve_ex` reads no `info` back (`solve` checks it on the host, as on every device), so
    # the factorization, the permutation, both triangular solves and the consumer are one region.
    a, b = general(4), randn(4, 4, 2, seed=5)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        torch_pjrt.sync()
        torch_pjrt.reset_metrics()
        x = torch.linalg.solve_ex(a.to("pjrt"), b.to("pjrt"))[0] * 2
        result = x.cpu()
        m = torch_pjrt.metrics()
    torch.testing.assert_close(result, torch.linalg.solve(a, b) * 2, **F32)
    assert m["fallback_ops"] == {}
    assert m["executions"] == 1, m["executions"]


def test_complex_matrices_run_on_the_cpu():
    a = torch.randn(3, 3, dtype=torch.complex64, generator=seeded(4))
    torch_pjrt.reset_metrics()
    assert_close(torch.linalg.det(a.to("pjrt")), torch.linalg.det(a), **F32)
    assert "aten::_linalg_det" in torch_pjrt.metrics()["fallback_ops"]


def test_legacy_triangular_solve(mode):
    a = torch.randn(2, 4, 4, generator=seeded(6)).triu() + 3 * torch.eye(4)
    b = randn(3, 1, 4, 2, seed=7)
    for upper in [True, False]:
        for transpose in [False, True]:
            got = on_pjrt(lambda x, y: torch.triangular_solve(x, y, upper=upper, transpose=transpose), b, a)
            expected = torch.triangular_solve(b, a, upper=upper, transpose=transpose)
            for g, e in zip(got, expected):
                assert g.stride() == e.stride()
                assert_close(g, e, **F32)


def test_packed_qr_and_its_reflectors(mode):
    a = randn(2, 5, 3, seed=8)
    packed, tau = on_pjrt(torch.geqrf, a)
    expected_packed, expected_tau = torch.geqrf(a)
    assert packed.stride() == expected_packed.stride()
    assert_close(packed, expected_packed, **F32)
    assert_close(tau, expected_tau, **F32)
    assert_close(torch.linalg.householder_product(packed, tau), torch.linalg.householder_product(expected_packed, expected_tau), **F32)
    c = randn(2, 5, 2, seed=9)
    for left, transpose, other in [(True, False, c), (True, True, c), (False, False, c.mT), (False, True, c.mT)]:
        got = torch.ormqr(packed, tau, other.to("pjrt"), left=left, transpose=transpose)
        assert_close(got, torch.ormqr(expected_packed, expected_tau, other, left=left, transpose=transpose), **F32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matrix_exp_scales_and_squares(mode, dtype):
    # Norms below theta_13 (no squaring), well above it, and a batch whose matrices need
    # different numbers of squarings.
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    for shape, scale in [((3, 3), 1.0), ((2, 4, 4), 0.1), ((5, 5), 6.0), ((6, 6), 1e-3)]:
        a = randn(*shape, seed=int(scale * 10) + len(shape), dtype=torch.float64) * scale
        batch = torch.stack([a.reshape(-1, *shape[-2:])[0], a.reshape(-1, *shape[-2:])[0] * 0.01])
        for x in [a, batch]:
            expected = torch.linalg.matrix_exp(x)
            got = on_pjrt(torch.linalg.matrix_exp, x.to(dtype))
            torch.testing.assert_close(got.cpu().double(), expected, **tol)
    check(torch.linalg.matrix_exp, (randn(2, 3, 3, seed=4, dtype=dtype),), **(F32 if dtype == torch.float32 else {}))
    assert on_pjrt(torch.linalg.matrix_exp, torch.zeros(2, 0, 0)).shape == (2, 0, 0)
    assert_close(on_pjrt(torch.linalg.matrix_exp, torch.full((1, 1), 0.5)), torch.full((1, 1), 0.5).exp())
    # bfloat16 computes in float32 and rounds once (the CPU's bfloat16 kernel overflows here).
    half = randn(3, 3, seed=9).bfloat16()
    assert_close(on_pjrt(torch.linalg.matrix_exp, half), torch.linalg.matrix_exp(half.float()).bfloat16())
    with pytest.raises(RuntimeError, match="A must be batches of square matrices"):
        on_pjrt(torch.linalg.matrix_exp, torch.zeros(2, 3))
