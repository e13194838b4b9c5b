"""torch.distributed on device "pjrt": the "pjrt" c10d backend under torchrun.

Workers live in tests/dist; each test launches real processes (2 or 4, one pjrt device each) and
compares with gloo on CPU tensors or with one process training on the whole batch."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "..", "dist")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
sys.path.insert(0, WORKERS)
from models import build, global_batches  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is needed",
)


def torchrun(nprocs, worker, *args, timeout=240):
    env = dict(os.environ)
    env.pop("TORCH_PJRT_DIST_CHECK", None)
    cmd = [TORCHRUN, "--standalone", f"--nproc-per-node={nprocs}", os.path.join(WORKERS, worker)]
    proc = subprocess.run(
        cmd + [str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def single_process(model_name, steps):
    """The reference: one process on the CPU, the whole global batch per step."""
    model, loss_fn = build(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for inputs, targets in global_batches(model_name, steps):
        opt.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().flatten() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "model_name,mode,nprocs",
    [
        ("mlp", "strict", 2),
        ("mlp", "defer_and_fuse", 2),
        ("mlp", "defer_and_fuse", 4),
        ("mlp", "debug", 2),
        ("tinygpt", "defer_and_fuse", 2),
        ("tinygpt", "strict", 4),
    ],
)
def test_ddp_matches_one_process_on_the_global_batch(tmp_path, model_name, mode, nprocs):
    steps = 4
    out = tmp_path / "ddp.json"
    torchrun(nprocs, "ddp_worker.py", model_name, mode, steps, out)
    got = json.loads(out.read_text())
    want_losses, want_params = single_process(model_name, steps)
    assert got["fallback_ops"] == {}
    # DDP's bucket all-reduces, one per step at least, and the loss's.
    assert got["collectives"] >= 2 * steps
    # DDP's own step timing reaches the device's timer (no "only CPU and CUDA" warning).
    assert all(v > 0 for v in got["ddp_times"].values()), got["ddp_times"]
    assert got["losses"] == pytest.approx(want_losses, abs=1e-5, rel=1e-5)
    for name, value in want_params.items():
        torch.testing.assert_close(torch.tensor(got["params"][name]), value, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode,nprocs", [("defer_and_fuse", 4), ("strict", 2), ("debug", 2)])
def test_every_collective_matches_gloo_on_cpu(tmp_path, mode, nprocs):
    torchrun(nprocs, "collectives_worker.py", mode, tmp_path)
    for rank in range(nprocs):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        failed = [r for r in results if not r[1]]
        assert not failed, f"rank {rank}: {failed}"
        names = {r[0] for r in results}
        assert {"all_to_all_single uneven", "all_to_all uneven", "scatter", "send/recv ring",
                "async all_reduce future", "coalesced all_reduce", "all_reduce AVG"} <= names
        # Subgroup (last, 0, 1) checks ran on its members only.
        member = rank in ({nprocs - 1, 0, 1} if nprocs >= 3 else {0, 1})
        assert ("subgroup all_reduce" in names) == member


def test_fsdp2_and_dtensor_match_one_process(tmp_path):
    out = tmp_path / "fsdp.json"
    torchrun(2, "fsdp_worker.py", "defer_and_fuse", 3, out)
    got = json.loads(out.read_text())
    assert got["backend_config"] == "pjrt:pjrt,cpu:gloo"  # init_process_group() via the mesh
    want_losses, _ = single_process("tinygpt", 3)
    assert got["losses"] == pytest.approx(want_losses, abs=1e-5, rel=1e-5)
    for name, err in got["dtensor_errors"].items():
        assert err < 1e-5, (name, err)
    assert got["fallback_ops"] == {}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(scenario, timeout_s, extra_env=None):
    """Both ranks of a two-rank job, launched directly: each one's exit code, output and the
    seconds it ran."""
    port = free_port()
    env = dict(os.environ, **(extra_env or {}))
    env.pop("TORCH_PJRT_DIST_CHECK", None) if not extra_env else None
    procs = []
    start = time.monotonic()
    for rank in range(2):
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(WORKERS, "failure_worker.py"), scenario, str(rank),
                 "2", str(port), str(timeout_s)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            )
        )
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        results.append((p.returncode, out + err, time.monotonic() - start))
    return results


def test_a_rank_that_raises_fails_the_others_naming_it():
    (code0, out0, secs0), (code1, out1, _) = run_pair("raise", timeout_s=60)
    assert code1 != 0 and "rank one gave up" in out1
    assert code0 != 0, out0
    assert "DistBackendError" in out0 and "rank 1 failed: RuntimeError: rank one gave up" in out0, out0
    assert "finished without an error" not in out0
    # Far sooner than the 60 s timeout: the failure is published, not waited out.
    assert secs0 < 45, secs0


def test_diverging_ranks_raise_on_every_rank_with_the_check():
    results = run_pair("diverge", timeout_s=60, extra_env={"TORCH_PJRT_DIST_CHECK": "dispatch"})
    for code, out, _ in results:
        assert code != 0, out
        assert "differs across ranks" in out, out
        assert "rank 0: #2 all_reduce Float[4] sum" in out, out
        assert "rank 1: #2 broadcast Float[5] root 0" in out, out


def test_a_rank_that_does_not_arrive_times_out_clearly():
    (code0, out0, secs0), (code1, out1, _) = run_pair("timeout", timeout_s=4)
    assert code0 != 0 and "did not complete" in out0 and "timeout (4 s)" in out0, out0
    # The late rank then finds the first gone (with the store it hosted) and says so.
    assert code1 != 0 and "did not complete" in out1, out1
    assert "rank 0 failed" in out1 or "has exited" in out1, out1


def test_bad_check_mode_is_refused(monkeypatch):
    import torch_pjrt.distributed as pd

    monkeypatch.setenv("TORCH_PJRT_DIST_CHECK", "sometimes")
    with pytest.raises(ValueError, match="expected one of off, dispatch"):
        pd.check_mode()
    monkeypatch.setenv("TORCH_PJRT_DIST_CHECK", "dispatch")
    assert pd.check_mode() == "dispatch"


def test_backend_is_registered_for_the_device():
    import torch.distributed as dist

    import torch_pjrt  # noqa: F401

    assert "pjrt" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["pjrt"] == "pjrt"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
