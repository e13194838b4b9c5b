"""Out-of-range integer indices on pjrt raise PyTorch's exception with PyTorch's message
(RFC 0012): at the op for indices whose values the host knows (still on the host, uploaded from
it, or made by fills, `arange` and copies of such values) and in Debug mode, at the next
materialization point for indices computed on the device; the engine stays usable afterwards."""

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from conftest import in_mode_without_fallbacks

MODES = ["strict", "debug", "defer_and_fuse"]

X = torch.arange(15.0).view(5, 3)
Y = torch.arange(120.0).view(4, 5, 6)


def _i(*values):
    return torch.tensor(values)


def _x(d):
    return X.clone().to(d)  # a copy: in-place cases must not change X on the CPU


def _y(d):
    return Y.clone().to(d)


# (name, function of (device, index)), each called with bad indices below.
CASES = [
    ("index", lambda d, i: _x(d)[i]),
    ("index_second", lambda d, i: _y(d)[_i(0).to(d), :, i]),
    ("index_put", lambda d, i: _x(d).index_put_((i,), torch.tensor(1.0).to(d))),
    ("index_put_accumulate",
     lambda d, i: _x(d).index_put_((i,), torch.tensor(1.0).to(d), accumulate=True)),
    ("setitem", lambda d, i: _x(d).__setitem__(i, 2.0)),
    ("index_select", lambda d, i: _x(d).index_select(0, i)),
    ("index_select_dim1", lambda d, i: _y(d).index_select(1, i)),
    ("index_select_dim2", lambda d, i: _y(d).index_select(2, i)),
    ("gather", lambda d, i: _x(d).gather(0, i.view(-1, 1))),
    ("gather_dim1", lambda d, i: _y(d).gather(1, i.view(1, -1, 1))),
    ("scatter", lambda d, i: _x(d).scatter_(0, i.view(-1, 1), 1.0)),
    ("scatter_src", lambda d, i: _x(d).scatter(0, i.view(-1, 1), torch.ones(2, 1).to(d))),
    ("scatter_add", lambda d, i: _x(d).scatter_add_(0, i.view(-1, 1), torch.ones(2, 1).to(d))),
    ("embedding", lambda d, i: F.embedding(i, _x(d))),
    ("embedding_module", lambda d, i: torch.nn.Embedding(5, 3).to(d)(i)),
    ("index_add", lambda d, i: _x(d).index_add_(0, i, torch.ones(2, 3).to(d))),
    ("index_add_dim1", lambda d, i: _x(d).index_add(1, i, torch.ones(5, 2).to(d))),
    ("cross_entropy", lambda d, i: F.cross_entropy(torch.ones(2, 5).to(d), i)),
    ("nll_loss2d",
     lambda d, i: F.nll_loss(torch.ones(2, 5, 1, 1).to(d), i.view(2, 1, 1))),
]
BAD = {"too_big": _i(1, 7), "too_negative": _i(1, -9), "minus_one": _i(-1, 2)}


def _cpu_error(fn, index):
    try:
        fn("cpu", index)
    except (IndexError, RuntimeError) as e:
        return type(e), str(e).splitlines()[0]
    return None


def _on_device(index, source):
    """`index` on pjrt: uploaded (the host knows its values) or computed on the device."""
    uploaded = index.to("pjrt")
    return uploaded if source == "uploaded" else uploaded * 1


def _pjrt_error(fn, index, materialize=True, source="computed"):
    try:
        out = fn("pjrt", _on_device(index, source))
        if materialize:
            if isinstance(out, torch.Tensor):
                out.cpu()
            torch_pjrt.sync()
    except (IndexError, RuntimeError) as e:
        return type(e), str(e).splitlines()[0]
    return None


@pytest.fixture(params=MODES)
def mode(request):
    with in_mode_without_fallbacks(request.param):
        yield request.param
        # Whatever a test left pending has been reported: the engine is clean and usable.
        torch_pjrt.sync()
        torch.testing.assert_close((X.to("pjrt") * 2).cpu(), X * 2)


@pytest.mark.parametrize("source", ["uploaded", "computed"])
@pytest.mark.parametrize("bad", list(BAD), ids=list(BAD))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_errors_match_cpu(mode, case, bad, source):
    _, fn = case
    index = BAD[bad]
    expected = _cpu_error(fn, index)
    # Uploaded indices raise at the op itself, with nothing read afterwards.
    assert _pjrt_error(fn, index, materialize=source == "computed", source=source) == expected


def test_debug_raises_at_the_op():
    with torch_pjrt.eager_mode("debug"):
        with pytest.raises(RuntimeError, match="index 7 is out of bounds for dimension 0"):
            X.to("pjrt").gather(0, _i(7).view(1, 1).to("pjrt"))
        with pytest.raises(IndexError, match="index out of range in self"):
            F.embedding(_i(0, 5).to("pjrt"), X.to("pjrt"))
        torch_pjrt.sync()


def test_strict_and_deferred_raise_computed_indices_at_the_next_materialization():
    weight, bad = X.to("pjrt"), _on_device(_i(2, 5), "computed")
    for mode in ("strict", "defer_and_fuse"):
        with torch_pjrt.eager_mode(mode):
            torch_pjrt.sync()
            executions = torch_pjrt.metrics()["executions"]
            out = F.embedding(bad, weight) * 2  # no read of the indices: no sync here
            if mode == "defer_and_fuse":
                assert torch_pjrt.metrics()["executions"] == executions
            with pytest.raises(IndexError, match="index out of range in self"):
                out.cpu()
            # Reported once: later reads succeed.
            torch.testing.assert_close(out[0].cpu(), X[2] * 2)
            torch_pjrt.sync()


def test_host_indices_raise_at_once():
    x = X.to("pjrt")
    with torch_pjrt.eager_mode("defer_and_fuse"):
        with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 5"):
            x[_i(0, 9)]  # a CPU index tensor: checked on the host, before any device work
        with pytest.raises(IndexError, match="index -7 is out of bounds for dimension 1 with size 3"):
            x[_i(0), _i(-7)] = 1.0
        torch_pjrt.sync()


def test_valid_indices_pass(mode):
    x = Y.to("pjrt")
    i = _i(-1, 0, 3).to("pjrt")
    torch.testing.assert_close(x[i].cpu(), Y[_i(-1, 0, 3)])
    torch.testing.assert_close(x.gather(2, _i(5, 0).view(1, 1, 2).expand(4, 5, 2).to("pjrt")).cpu(),
                               Y.gather(2, _i(5, 0).view(1, 1, 2).expand(4, 5, 2)))
    # Targets equal to ignore_index are skipped, whatever their value.
    target = _i(1, -100, 4)
    logits = torch.randn(3, 5)
    torch.testing.assert_close(F.cross_entropy(logits.to("pjrt"), target.to("pjrt")).cpu(),
                               F.cross_entropy(logits, target))
    empty = torch.empty(0, dtype=torch.long)
    assert X.to("pjrt").index_select(0, empty.to("pjrt")).cpu().shape == (0, 3)


def test_first_bad_index_is_reported(mode):
    # Several bad indices: the first in row-major order is named, as on the CPU.
    index = _i(0, 6, -2, 11).view(2, 2)
    fn = CASES[[c[0] for c in CASES].index("gather")][1]
    for source in ("uploaded", "computed"):
        assert _pjrt_error(lambda d, i: _x(d).gather(0, i), index, source=source) == \
            _cpu_error(lambda d, i: _x(d).gather(0, i), index)
        assert _pjrt_error(fn, _i(9, 8), source=source) == _cpu_error(fn, _i(9, 8))


def test_checks_do_not_recompile_a_training_loop():
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Flatten(), torch.nn.Linear(32, 11))
    model.to("pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    with torch_pjrt.eager_mode("defer_and_fuse"):
        for step in range(6):
            x = torch.randint(0, 11, (4, 4), generator=g).to("pjrt")
            y = torch.randint(0, 11, (4,), generator=g).to("pjrt")
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            if step == 2:
                compilations = torch_pjrt.metrics()["compilations"]
        assert torch_pjrt.metrics()["compilations"] == compilations


def _checks():
    m = torch_pjrt.metrics()
    return m["host_index_checks"], m["device_index_checks"], m["executions"]


def test_indices_made_by_fills_raise_at_the_op(strict_or_fused_mode):
    # PyTorch's test_trivial_fancy_out_of_bounds: the indices are a fill, then a setitem.
    def run(d):
        a = torch.zeros(5, device=d)
        ind = torch.ones(20, dtype=torch.int64, device=d)
        ind[-1] = 10
        errors = []
        for call in (lambda: a[ind], lambda: a.__setitem__(ind, 1.0)):
            try:
                call()
            except IndexError as e:
                errors.append(str(e))
        return a, ind, errors

    _, _, expected = run("cpu")
    host, device, executions = _checks()
    a, ind, errors = run("pjrt")
    assert errors == expected and len(errors) == 2
    after = _checks()
    # Decided at capture from the values the host followed: no device check, and in
    # DeferAndFuse nothing has run yet.
    assert after[0] - host == 2 and after[1] == device
    if strict_or_fused_mode == "defer_and_fuse":
        assert after[2] == executions
    # The failed setitem wrote nothing, and the engine goes on.
    torch.testing.assert_close(a.cpu(), torch.zeros(5))
    ind[-1] = 4
    torch.testing.assert_close(a[ind].cpu(), torch.zeros(20))


def test_arange_and_copied_indices_raise_at_the_op(strict_or_fused_mode):
    x = torch.arange(5.0, device="pjrt")
    with pytest.raises(IndexError, match="^index 5 is out of bounds for dimension 0 with size 5$"):
        x[torch.arange(6, device="pjrt")]
    # A cast and a strided copy of uploaded values are followed too.
    index = torch.zeros(2, 3, dtype=torch.int64, device="pjrt")
    index[:, 1] = torch.tensor([1, -6], dtype=torch.int32, device="pjrt")
    with pytest.raises(RuntimeError, match="^index -6 is out of bounds for dimension 0 with size 5$"):
        x.gather(0, index.t().reshape(-1).int().long())
    torch_pjrt.sync()


def test_known_valid_indices_need_no_device_check(pjrt):
    x = torch.arange(10.0, device=pjrt)
    index = torch.tensor([1, -3], device=pjrt)
    x[index].cpu()  # compiles the op
    host, device, _ = _checks()
    direct = torch_pjrt.metrics()["direct_ops"]
    for _ in range(3):
        y = x[index]
    torch.testing.assert_close(y.cpu(), torch.tensor([1.0, 7.0]))
    after = _checks()
    assert after[0] - host == 3 and after[1] == device
    # Strict runs a warm indexing op with no check by its direct path.
    assert torch_pjrt.metrics()["direct_ops"] - direct >= 3


def test_indices_the_host_cannot_follow_are_checked_on_the_device(strict_or_fused_mode):
    x = torch.arange(5.0, device="pjrt")
    changed = torch.tensor([1, 2], device="pjrt")
    changed.add_(5)  # arithmetic on the device: the host no longer knows the values
    large = torch.full((5000,), 9, dtype=torch.int64).to("pjrt")  # too large to keep
    for index, bad in ((changed, 6), (large, 9)):
        host, device, _ = _checks()
        out = x[index]
        assert _checks()[:2] == (host, device + 1)
        with pytest.raises(IndexError, match=f"^index {bad} is out of bounds for dimension 0 with size 5$"):
            out.cpu()
