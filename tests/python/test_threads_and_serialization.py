"""Several Python threads at once; torch.save/torch.load/deepcopy round trips."""

import copy
import io
import threading

import torch

import torch_pjrt
from conftest import assert_close


def test_two_threads_at_once(pjrt):
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def worker(i):
        try:
            barrier.wait()
            x = torch.full((64,), float(i)).to(pjrt)
            total = 0.0
            for _ in range(40):
                x = x * 1.0 + 1
                total += x.sum().item()
            results[i] = (x.cpu(), total)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(2):
        x, total = results[i]
        torch.testing.assert_close(x, torch.full((64,), float(i + 40)))
        assert total == sum(64.0 * (i + k) for k in range(1, 41))


def test_threads_while_defer_and_fuse(pjrt):
    a = torch.randn(8, 8)
    pa = a.to(pjrt)
    out = {}

    def worker(i):
        out[i] = (pa * (i + 1)).relu().sum().item()

    with torch_pjrt.eager_mode("defer_and_fuse"):
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for i in range(4):
        assert abs(out[i] - (a * (i + 1)).relu().sum().item()) < 1e-3


def _roundtrip(obj, **load_kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kw)


def test_save_and_load_a_pjrt_tensor(pjrt):
    x = torch.randn(3, 5)
    loaded = _roundtrip(x.to(pjrt))
    assert loaded.device.type == "pjrt"
    assert_close(loaded, x)
    on_cpu = _roundtrip(x.to(pjrt), map_location="cpu")
    assert on_cpu.device.type == "cpu"
    torch.testing.assert_close(on_cpu, x)


def test_load_with_map_location_pjrt(pjrt):
    state = {"w": torch.randn(4, 2), "step": torch.tensor(7), "mask": torch.tensor([True, False])}
    loaded = _roundtrip(state, map_location="pjrt")
    for key, value in state.items():
        assert loaded[key].device.type == "pjrt"
        assert_close(loaded[key], value)


def test_model_state_dict_round_trip(pjrt):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    ref = copy.deepcopy(model)
    model.to(pjrt)
    restored = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    restored.load_state_dict(_roundtrip(model.state_dict(), map_location="cpu"))
    x = torch.randn(5, 4)
    torch.testing.assert_close(restored(x), ref(x))
    restored.to(pjrt).load_state_dict(_roundtrip(model.state_dict()))
    assert_close(restored(x.to(pjrt)), ref(x), rtol=1e-5, atol=1e-6)


def test_deepcopy(pjrt):
    x = torch.randn(4, 4)
    p = x.to(pjrt)
    q = copy.deepcopy(p)
    assert q.device.type == "pjrt"
    p.mul_(2)
    assert_close(q, x)
    model = torch.nn.Linear(3, 2).to(pjrt)
    clone = copy.deepcopy(model)
    assert_close(clone.weight.detach(), model.weight.detach().cpu())


def test_storage_copies(pjrt):
    x = torch.arange(6, dtype=torch.float32)
    p = x.to(pjrt)
    storage = p.untyped_storage()
    assert storage.device.type == "pjrt"
    assert storage.nbytes() == 24
    host = storage.cpu()
    assert bytes(host) == bytes(x.untyped_storage())
    other = torch.arange(6, dtype=torch.float32).to(pjrt)
    assert other.untyped_storage().data_ptr() != storage.data_ptr()
