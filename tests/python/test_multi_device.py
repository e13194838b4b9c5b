"""Several pjrt devices in one process (RFC 0046): storages live on the device their tensor
names, ops run there, copies move buffers between devices, an op mixing devices raises
PyTorch's error, and collectives across the devices run as one replicated program. Each test
runs in a fresh process with four XLA CPU devices."""

import pytest

from conftest import assert_ok, run_python

FOUR_DEVICES = {"TORCH_PJRT_CLIENT_OPTIONS": "cpu_device_count=4"}


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_tensors_live_and_compute_on_the_device_they_name(mode):
    out = assert_ok(
        run_python(
            f"""
            import torch, torch_pjrt
            from torch_pjrt.comm import buffer_device
            torch_pjrt.set_eager_mode({mode!r})
            assert torch.pjrt.device_count() == 4
            torch.manual_seed(0)
            host = torch.randn(64, 32)
            weight = torch.randn(32, 16)
            expected = torch.relu(host @ weight).sum(0) * 2 + 1
            results = []
            for d in range(4):
                dev = f"pjrt:{{d}}"
                ones = torch.ones(4, device=dev)
                assert ones.device == torch.device(dev)
                assert buffer_device(ones) == d, (d, buffer_device(ones))
                x = host.to(dev)
                w = weight.to(dev)
                y = torch.relu(x @ w).sum(0) * 2 + 1
                assert y.device == torch.device(dev)
                assert buffer_device(x) == d and buffer_device(y) == d
                torch.testing.assert_close(y.cpu(), expected)
                # A CPU scalar tensor joins the op on its device.
                z = y + torch.tensor(3.0)
                assert buffer_device(z) == d
                torch.testing.assert_close(z.cpu(), expected + 3)
                results.append(y)
            # Ops queued on several devices before any read: each region runs on its own device.
            a = [torch.arange(8.0, device=f"pjrt:{{d}}") * (d + 1) for d in range(4)]
            b = [t.exp().sum() for t in a]
            for d in range(4):
                assert buffer_device(b[d]) == d
                torch.testing.assert_close(b[d].cpu(), (torch.arange(8.0) * (d + 1)).exp().sum())
            # Device to device: the buffer moves, values unchanged.
            torch_pjrt.reset_metrics()
            moved = results[0].to("pjrt:3")
            assert moved.device == torch.device("pjrt:3") and buffer_device(moved) == 3
            torch.testing.assert_close(moved.cpu(), expected)
            assert torch_pjrt.metrics()["device_to_device"] == 1
            # A view and another dtype cross devices too.
            view = x.t()[2:5]
            torch.testing.assert_close(view.to("pjrt:1").cpu(), host.t()[2:5])
            half = x.to("pjrt:2", torch.float64)
            assert buffer_device(half) == 2 and half.dtype == torch.float64
            torch.testing.assert_close(half.cpu(), host.double())
            # copy_ into a view of another device's tensor.
            target = torch.zeros(64, 32, device="pjrt:1")
            target[:, 3].copy_(x[:, 5])
            check = torch.zeros(64, 32)
            check[:, 3] = host[:, 5]
            torch.testing.assert_close(target.cpu(), check)
            assert buffer_device(target) == 1
            # Mixing devices raises PyTorch's error, and the engine runs on.
            for bad in (lambda: results[0] + results[1], lambda: results[2].mul_(moved),
                        lambda: torch.mm(x, weight.to("pjrt:0"))):
                try:
                    bad()
                except RuntimeError as e:
                    assert "Expected all tensors to be on the same device, but found at least "
                    "two devices" in str(e), e
                else:
                    raise AssertionError("mixing devices did not raise")
            torch.testing.assert_close((results[1] * 2).cpu(), expected * 2)
            torch.testing.assert_close(results[2].cpu(), expected)
            m = torch_pjrt.metrics()
            print("switch_cuts", m["device_switch_cuts"], "executions", m["executions"])
            """,
            env=FOUR_DEVICES,
        )
    )
    assert "switch_cuts" in out


def test_programs_are_compiled_once_and_run_on_every_device():
    # A portable executable serves every device: the same op on four devices compiles once.
    out = assert_ok(
        run_python(
            """
            import torch, torch_pjrt
            from torch_pjrt.comm import buffer_device
            xs = [torch.full((16,), float(d), device=f"pjrt:{d}") for d in range(4)]
            torch_pjrt.sync()
            torch_pjrt.reset_metrics()
            ys = [torch.sin(x) * 3 for x in xs]
            for d, y in enumerate(ys):
                assert buffer_device(y) == d
                torch.testing.assert_close(y.cpu(), torch.sin(torch.full((16,), float(d))) * 3)
            m = torch_pjrt.metrics()
            assert m["compilations"] == 2, m["compilations"]
            assert m["executions"] == 8, m["executions"]
            print("ok")
            """,
            env=FOUR_DEVICES,
        )
    )
    assert "ok" in out


def test_collectives_run_as_one_replicated_program():
    out = assert_ok(
        run_python(
            """
            import time
            import torch, torch_pjrt
            from torch_pjrt import comm
            from torch_pjrt.comm import buffer_device
            torch.manual_seed(0)
            hosts = [torch.randn(8, 6) for _ in range(4)]
            xs = [h.to(f"pjrt:{d}") * 1.0 for d, h in enumerate(hosts)]
            torch_pjrt.reset_metrics()
            sums = comm.all_reduce(xs)
            expected = sum(hosts)
            for d, s in enumerate(sums):
                assert s.device == torch.device(f"pjrt:{d}") and buffer_device(s) == d
                torch.testing.assert_close(s.cpu(), expected)
            m = torch_pjrt.metrics()
            assert m["device_collectives"] == 1 and m["device_collective_compiles"] == 1, m
            # The same collective again compiles nothing; its results feed later ops on each
            # device.
            again = comm.all_reduce(xs)
            torch.testing.assert_close((again[2] * 2).cpu(), expected * 2)
            m = torch_pjrt.metrics()
            assert m["device_collectives"] == 2 and m["device_collective_compiles"] == 1, m
            stacked = torch.stack(hosts)
            torch.testing.assert_close(comm.all_reduce(xs, "max")[1].cpu(), stacked.amax(0))
            torch.testing.assert_close(comm.all_reduce(xs, "min")[3].cpu(), stacked.amin(0))
            prod = comm.all_reduce(xs, torch.distributed.ReduceOp.PRODUCT)
            torch.testing.assert_close(prod[0].cpu(), stacked.prod(0))
            # A subset of devices, in any order.
            pair = comm.all_reduce([xs[3], xs[1]])
            assert buffer_device(pair[0]) == 3 and buffer_device(pair[1]) == 1
            torch.testing.assert_close(pair[1].cpu(), hosts[3] + hosts[1])
            gathered = comm.all_gather(xs, dim=1)
            for d, g in enumerate(gathered):
                assert buffer_device(g) == d
                torch.testing.assert_close(g.cpu(), torch.cat(hosts, 1))
            scattered = comm.reduce_scatter(xs, dim=0)
            for d, s in enumerate(scattered):
                assert buffer_device(s) == d
                torch.testing.assert_close(s.cpu(), expected[2 * d : 2 * d + 2])
            # Views and pending values are made whole first.
            with torch_pjrt.eager_mode("defer_and_fuse"):
                ts = [x.t() + 1 for x in xs]
                out = comm.all_reduce(ts)
                torch.testing.assert_close(out[0].cpu(), (expected + 4).t())
            for bad in ([xs[0], xs[0]], [xs[0], xs[1][:4]], [xs[0], hosts[1]], []):
                try:
                    comm.all_reduce(bad)
                except ValueError as e:
                    print("refused:", e)
                else:
                    raise AssertionError(bad)
            print("ok")
            """,
            env=FOUR_DEVICES,
        )
    )
    assert "ok" in out and out.count("refused:") == 4


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_data_parallel_training_across_the_devices_of_one_process(mode):
    # Each device trains a replica on a quarter of the batch; the gradients are averaged by
    # all_reduce across the devices: the replicas follow full-batch training on the CPU.
    out = assert_ok(
        run_python(
            f"""
            import copy
            import torch, torch_pjrt
            from torch_pjrt import comm
            from torch_pjrt.comm import buffer_device
            torch_pjrt.set_eager_mode({mode!r})
            torch.manual_seed(0)
            cpu_model = torch.nn.Sequential(
                torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
            data, target = torch.randn(32, 8), torch.randn(32, 1)
            replicas = [copy.deepcopy(cpu_model).to(f"pjrt:{{d}}") for d in range(4)]
            optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in replicas]
            cpu_optimizer = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
            shards = [(data[8 * d : 8 * d + 8].to(f"pjrt:{{d}}"),
                       target[8 * d : 8 * d + 8].to(f"pjrt:{{d}}")) for d in range(4)]
            torch_pjrt.reset_metrics()
            for step in range(3):
                for model, (x, y) in zip(replicas, shards):
                    model.zero_grad()
                    torch.nn.functional.mse_loss(model(x), y).backward()
                for params in zip(*(m.parameters() for m in replicas)):
                    for p, total in zip(params, comm.all_reduce([p.grad for p in params])):
                        p.grad.copy_(total / 4)
                for opt in optimizers:
                    opt.step()
                cpu_model.zero_grad()
                torch.nn.functional.mse_loss(cpu_model(data), target).backward()
                cpu_optimizer.step()
            for d, model in enumerate(replicas):
                for p, expected in zip(model.parameters(), cpu_model.parameters()):
                    assert buffer_device(p) == d
                    torch.testing.assert_close(p.detach().cpu(), expected.detach(),
                                               rtol=1e-5, atol=1e-6)
            m = torch_pjrt.metrics()
            assert m["device_collectives"] == 3 * 4, m["device_collectives"]
            # One program per parameter shape, compiled at the first step.
            assert m["device_collective_compiles"] == 4, m["device_collective_compiles"]
            print("ok")
            """,
            env=FOUR_DEVICES,
        )
    )
    assert "ok" in out


def test_a_compiled_graph_runs_on_the_device_of_its_inputs():
    # One recorded program serves every device: its replays run where their inputs are, and
    # their results are made and labelled there.
    out = assert_ok(
        run_python(
            """
            import torch, torch_pjrt
            from torch_pjrt.comm import buffer_device

            def f(x, w):
                return torch.relu(x @ w).sum(0) + 1

            compiled = torch.compile(f, backend="pjrt")
            torch.manual_seed(0)
            x, w = torch.randn(8, 4), torch.randn(4, 3)
            for d in (1, 2, 1, 3):
                for _ in range(3):
                    y = compiled(x.to(f"pjrt:{d}"), w.to(f"pjrt:{d}"))
                    assert y.device == torch.device(f"pjrt:{d}"), (d, y.device)
                    assert buffer_device(y) == d, (d, buffer_device(y))
                    torch.testing.assert_close(y.cpu(), f(x, w))
            m = torch_pjrt.metrics()
            # Dynamo traces a graph per device; the engine compiles one program for them all.
            assert m["compiled_graphs"] == 3, m["compiled_graphs"]
            assert m["compilations"] == 1, m["compilations"]
            assert m["compiled_graph_replays"] >= 4, m["compiled_graph_replays"]
            print("ok")
            """,
            env=FOUR_DEVICES,
        )
    )
    assert "ok" in out
