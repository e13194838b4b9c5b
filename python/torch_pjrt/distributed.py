"""``torch.distributed`` on device ``"pjrt"``: the c10d backend ``"pjrt"`` (RFC 0037).

Importing ``torch_pjrt`` registers it for the ``pjrt`` device (and for CPU tensors of a group
created with it), so ``dist.init_process_group("pjrt")``, ``init_process_group()`` (the
accelerator's default), ``"cpu:gloo,pjrt:pjrt"``, ``new_group``, ``init_device_mesh("pjrt", …)``,
DDP, FSDP2 and DTensor reach it. Each collective materializes its pjrt inputs, runs on a gloo
backend over host memory (the XLA CPU plugin cannot join other processes in one program) and
writes the results back: a collective is a materialization point, so where regions are cut
around it depends on the op stream alone, and every rank runs the same programs.

``TORCH_PJRT_DIST_CHECK=off|dispatch`` (``dispatch`` by default in the Debug eager mode, ``off``
otherwise): with ``dispatch`` every collective is compared across ranks before it runs (kind,
shapes, dtype, reduction, root), and a rank that issues a different one makes every rank raise
an error listing what each issued. A rank that dies of an uncaught exception publishes it in the
store, so the others' pending collectives fail naming it instead of waiting out the timeout.
"""

from __future__ import annotations

import os
import sys
import threading

# No top-level `import torch`: `import torch_pjrt` may come first, and importing torch then
# reaches this package's autoload while it is still being imported.

CHECK_MODES = ("off", "dispatch")

_lock = threading.Lock()
# (store, group rank) of every pjrt group of this process: where a failure is published. Held
# strongly: the Python wrapper of a store that only C++ keeps would be gone when needed.
_stores: list[tuple[object, int]] = []
_hook_installed = False


def check_mode() -> str:
    """The cross-rank check for new groups: ``TORCH_PJRT_DIST_CHECK``, else ``dispatch`` in the
    Debug eager mode and ``off`` in the others."""
    value = os.environ.get("TORCH_PJRT_DIST_CHECK", "").strip().lower()
    if value:
        if value not in CHECK_MODES:
            raise ValueError(
                f"TORCH_PJRT_DIST_CHECK={value!r} is not a check mode: expected one of "
                f"{', '.join(CHECK_MODES)}"
            )
        return value
    from . import _api

    return "dispatch" if _api.get_eager_mode() == "debug" else "off"


def _create_backend(options, _backend_options=None):
    """The creator c10d calls for each group using ``"pjrt"`` (extended API: the group's name
    comes with it, for messages)."""
    import torch.distributed as dist

    from . import _native

    native = _native.native()
    if native is None:
        raise RuntimeError(
            "torch_pjrt's extension is not loaded, so the pjrt c10d backend cannot start: "
            "build it with `make python-build`."
        )
    store = options.store
    rank, size = options.group_rank, options.group_size
    timeout = options.timeout
    host = dist.ProcessGroupGloo(dist.PrefixStore("pjrt_host/", store), rank, size, timeout)
    group = str(options.group_id) or "default"
    timeout_ms = int(timeout.total_seconds() * 1000)
    backend = native._HostStagedBackend(
        store, rank, size, timeout_ms, host, group, check_mode() == "dispatch"
    )
    _remember_store(store, rank)
    return backend


def _remember_store(store, rank: int) -> None:
    global _hook_installed
    with _lock:
        _stores.append((store, rank))
        if not _hook_installed:
            previous = sys.excepthook

            def publish_then_report(kind, value, traceback):
                publish_failure(f"{kind.__name__}: {value}")
                previous(kind, value, traceback)

            sys.excepthook = publish_then_report
            _hook_installed = True


def publish_failure(message: str) -> None:
    """Tells the other ranks of every pjrt group that this process is failing, so their pending
    collectives raise naming it (called by the uncaught-exception hook; callable directly by a
    launcher that catches the exception itself)."""
    with _lock:
        entries = list(_stores)
    for store, rank in entries:
        try:
            store.set(f"pjrt_failed/{rank}", message[:2000])
        except Exception:  # noqa: BLE001 - the store may already be gone; nothing to tell then
            pass


def counters() -> dict:
    """``collectives`` run, ``collective_bytes`` staged between device and host, and
    ``collective_seconds`` spent in them (staging included), for ``torch_pjrt.metrics()``."""
    from . import _native

    native = _native.native()
    if native is None:
        return {}
    runs, staged, seconds = native._collective_counters()
    return {"collectives": runs, "collective_bytes": staged, "collective_seconds": seconds}


def reset_counters() -> None:
    from . import _native

    native = _native.native()
    if native is not None:
        native._reset_collective_counters()


_registered = False


def register() -> None:
    """Registers the ``"pjrt"`` c10d backend (once; a no-op without ``torch.distributed``)."""
    global _registered
    if _registered:
        return
    import torch

    # Inside torch's own import (its device-backend autoload) torch.distributed may not be
    # there yet: the call made once torch is imported registers it then.
    dist = getattr(torch, "distributed", None)
    if dist is None or not hasattr(dist, "Backend") or not dist.is_available():
        return

    if "pjrt" not in dist.Backend.backend_list:
        dist.Backend.register_backend(
            "pjrt", _create_backend, extended_api=True, devices=["pjrt", "cpu"]
        )
    _add_cpu_to_accelerator_default(dist)
    _registered = True


def _add_cpu_to_accelerator_default(dist) -> None:
    """``init_process_group()`` without a backend configures only the accelerator's device, so
    on pjrt a CPU tensor's collective would find no backend; with pjrt as the accelerator the
    default becomes ``cpu:gloo,pjrt:pjrt``."""
    config_class = dist.distributed_c10d.BackendConfig
    if getattr(config_class, "_pjrt_adds_cpu", False) or not dist.is_gloo_available():
        return
    original_init = config_class.__init__

    def init(self, backend):
        original_init(self, backend)
        if (
            str(backend) == dist.Backend.UNDEFINED
            and self.device_backend_map.get("pjrt") == "pjrt"
            and "cpu" not in self.device_backend_map
        ):
            self.device_backend_map["cpu"] = dist.Backend(dist.Backend.GLOO)

    config_class.__init__ = init
    config_class._pjrt_adds_cpu = True
