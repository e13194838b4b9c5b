"""Registration through the torch.backends entry point, lazy start, and configuration errors."""

import importlib.metadata

from conftest import assert_ok, run_python


def test_entry_point_is_installed():
    names = [ep.value for ep in importlib.metadata.entry_points(group="torch.backends")]
    assert "torch_pjrt:_autoload" in names


def test_import_torch_registers_pjrt_without_starting_the_engine():
    out = assert_ok(
        run_python(
            """
            import sys, torch
            assert "torch_pjrt" in sys.modules, "the entry point did not load torch_pjrt"
            import torch_pjrt._native as native
            print(torch._C._get_privateuse1_backend_name(), native.started())
            print(hasattr(torch, "pjrt"), hasattr(torch.Tensor, "is_pjrt"))
            print(torch.accelerator.current_accelerator())
            x = torch.ones(2, device="pjrt")
            print(native.started(), x.device, x.is_pjrt)
            """
        )
    )
    assert out.split() == ["pjrt", "False", "True", "True", "pjrt", "True", "pjrt:0", "True"]


def test_misconfigured_plugin_fails_at_first_device_use_not_at_import():
    out = assert_ok(
        run_python(
            """
            import torch
            print("imported")
            print(torch.pjrt.is_available(), torch.pjrt.device_count())
            try:
                torch.zeros(3, device="pjrt")
            except RuntimeError as e:
                print("RuntimeError:", e)
            # the process is still usable
            print(torch.ones(2).sum().item())
            """,
            env={"TORCH_PJRT_PLUGIN": "/nonexistent/plugin.so"},
        )
    )
    lines = out.splitlines()
    assert lines[0] == "imported"
    assert lines[1] == "False 0"
    assert lines[2].startswith("RuntimeError:") and "/nonexistent/plugin.so" in lines[2]
    assert lines[3] == "2.0"


def test_both_mode_variables_set_is_an_error_naming_both():
    out = assert_ok(
        run_python(
            """
            import torch, torch_pjrt
            for attempt in range(2):
                try:
                    torch.ones(2, device="pjrt")
                    print("no error")
                except ValueError as e:
                    print("ValueError:", e)
            """,
            env={"TORCH_PJRT_DEFER_AND_FUSE": "1", "TORCH_PJRT_LAUNCH_BLOCKING": "1"},
        )
    )
    lines = out.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.startswith("ValueError:"), out
        assert "TORCH_PJRT_DEFER_AND_FUSE" in line and "TORCH_PJRT_LAUNCH_BLOCKING" in line


def test_device_module(pjrt):
    import torch

    assert torch.pjrt.is_available()
    assert torch.pjrt.is_initialized()
    assert torch.pjrt.device_count() >= 1
    assert torch.pjrt.current_device() == 0
    assert not torch.pjrt._is_in_bad_fork()
    torch.pjrt.synchronize()
    torch.accelerator.synchronize()
    assert torch.accelerator.device_count() == torch.pjrt.device_count()
    with torch.pjrt.device(0):
        assert torch.pjrt.current_device() == 0


def test_manual_seed_makes_random_ops_reproducible(pjrt):
    import warnings

    import torch

    state = torch.pjrt.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.pjrt.manual_seed(123)
        a = torch.randn(5, device=pjrt).cpu()
        torch.pjrt.manual_seed(123)
        b = torch.randn(5, device=pjrt).cpu()
        torch.pjrt.set_rng_state(state)
    torch.testing.assert_close(a, b)


def test_import_torch_pjrt_first_and_without_autoload():
    code = """
        import torch_pjrt, torch
        print(torch.ones(2, device="pjrt").sum().item())
        """
    assert assert_ok(run_python(code, timeout=60)).split() == ["2.0"]
    out = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout=60)
    assert assert_ok(out).split() == ["2.0"]


def test_missing_engine_library_fails_at_first_device_use():
    out = assert_ok(
        run_python(
            """
            import warnings
            import torch
            print("imported", torch.pjrt.is_available())
            try:
                torch.ones(2, device="pjrt")
            except RuntimeError as e:
                print("RuntimeError:", e)
            """,
            env={"TORCH_PJRT_ENGINE_LIBRARY": "/nonexistent/libtorch_glue.so"},
        )
    )
    lines = out.splitlines()
    assert lines[0] == "imported False"
    assert lines[1].startswith("RuntimeError:") and "/nonexistent/libtorch_glue.so" in lines[1]


def test_a_compile_option_known_to_read_stale_weights_is_refused_with_the_way_out():
    # XLA CPU's test-only XNNPACK mode keeps a product's packed weights while the weight's
    # buffer keeps its address: an in-place update would be read stale.
    out = assert_ok(
        run_python(
            """
            import torch
            try:
                torch.ones(2, device="pjrt")
            except ValueError as e:
                print("refused:", e)
            """,
            env={
                "TORCH_PJRT_COMPILE_OPTIONS": "xla_cpu_experimental_xnn_graph_fusion_mode="
                "XNN_GRAPH_FUSION_MODE_BYPASS_COST_MODEL"
            },
        )
    )
    assert out.startswith("refused: TORCH_PJRT_COMPILE_OPTIONS:"), out
    assert "stale" in out and "XNN_GRAPH_FUSION_MODE_GREEDY" in out, out
