"""The ``torch.pjrt`` device module (registered with ``torch._register_device_module``)."""

from __future__ import annotations

import ctypes

import torch

from . import _native


def is_available() -> bool:
    """Whether the pjrt device can be used (starts the engine; never raises)."""
    try:
        _native.ensure_started()
        return True
    except Exception:
        return False


def is_initialized() -> bool:
    """Whether the engine (and PJRT) has started."""
    return _native.started()


def __getattr__(name: str):
    # `torch.utils.checkpoint` saves and restores a device's random state only when the device
    # module's `_initialized` is true (as `torch.cuda._initialized` is once CUDA is in use).
    # Without it, a checkpointed region's recomputation drew new dropout masks, so its gradients
    # did not match its forward pass.
    if name == "_initialized":
        return _native.started()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def device_count() -> int:
    """The number of devices of the PJRT client (0 when the device cannot start)."""
    try:
        engine = _native.ensure_started()
    except Exception:
        return 0
    count = ctypes.c_int32(0)
    _native.check(engine.tpjrt_device_count(ctypes.byref(count)))
    return int(count.value)


def _index(device) -> int:
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "pjrt":
            raise ValueError(f"expected a pjrt device, got {device}")
        return 0 if device.index is None else device.index
    raise TypeError(f"expected a pjrt device or an index, got {device!r}")


def current_device() -> int:
    native = _native.native()
    return 0 if native is None else int(native._current_device())


def set_device(device) -> None:
    index = _index(device)
    count = device_count()
    if not 0 <= index < max(count, 1):
        raise IndexError(f"pjrt device index {index} is out of range: there are {count} devices")
    native = _native.native()
    if native is not None:
        native._set_device(index)


def synchronize(device=None) -> None:
    """Flushes everything pending and waits for the device."""
    if not _native.started():
        return
    _native.check(_native.lib().tpjrt_sync())


def _is_in_bad_fork() -> bool:
    return False


# Random numbers: each pjrt device has its own generator (a seed and a count of draws), kept on
# the host; random ops draw their bits on the device from it (see csrc/random.cpp).


def _generator_module():
    native = _native.native()
    if native is None:
        raise RuntimeError("the pjrt device is not available: torch_pjrt._C could not be loaded")
    return native


def _device_index(device) -> int:
    return current_device() if device is None else _index(device)


def manual_seed(seed: int) -> None:
    """Seeds the current device's generator."""
    _generator_module()._manual_seed(current_device(), int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


def manual_seed_all(seed: int) -> None:
    """Seeds every device's generator (``torch.manual_seed`` calls this)."""
    native = _generator_module()
    for index in range(max(device_count_without_start(), 1)):
        native._manual_seed(index, int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


def seed() -> None:
    """Seeds the current device's generator with a nondeterministic number."""
    _generator_module()._seed(current_device())


def seed_all() -> None:
    native = _generator_module()
    for index in range(max(device_count_without_start(), 1)):
        native._seed(index)


def initial_seed() -> int:
    return int(_generator_module()._initial_seed(current_device()))


def get_rng_state(device="pjrt") -> torch.Tensor:
    """The generator state of ``device``: a 16-byte ``torch.ByteTensor`` (seed, draws)."""
    state = _generator_module()._get_rng_state(_device_index(device))
    return torch.frombuffer(bytearray(state), dtype=torch.uint8).clone()


def set_rng_state(new_state: torch.Tensor, device="pjrt") -> None:
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError(
            f"expected a torch.ByteTensor from torch.pjrt.get_rng_state(), got {new_state!r}"
        )
    data = bytes(new_state.detach().cpu().contiguous().numpy().tobytes())
    _generator_module()._set_rng_state(_device_index(device), data)


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(max(device_count_without_start(), 1))]


def set_rng_state_all(new_states) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


def device_count_without_start() -> int:
    """The device count if the engine runs, else 1 (seeding must not start the engine)."""
    return device_count() if _native.started() else 1


def memory_allocated(device=None) -> int:
    """Bytes of the engine's live device buffers (its own accounting: plugins' allocator
    statistics are optional)."""
    if not _native.started():
        return 0
    from . import _api

    return int(_api.metrics()["live_device_bytes"])


def max_memory_allocated(device=None) -> int:
    """The peak of :func:`memory_allocated`, counting each execution's scratch, since the engine
    started or ``torch_pjrt.reset_metrics()``."""
    if not _native.started():
        return 0
    from . import _api

    return int(_api.metrics()["peak_device_bytes"])


def memory_reserved(device=None) -> int:
    """Bytes the device holds for pjrt: the engine keeps no allocator cache of its own (a freed
    buffer goes back to the plugin at once), so this is :func:`memory_allocated`."""
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def memory_stats(device=None) -> dict:
    """CUDA's `memory_stats` keys that the engine's accounting can give: allocated and reserved
    bytes (current and peak) and the live buffer count."""
    live, peak = memory_allocated(device), max_memory_allocated(device)
    storages = 0
    if _native.started():
        from . import _api

        storages = int(_api.metrics()["live_storages"])
    stats = {}
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        stats[f"{kind}.all.current"] = live
        stats[f"{kind}.all.peak"] = peak
    stats["active.all.current"] = storages
    stats["num_alloc_retries"] = 0
    stats["num_ooms"] = 0
    return stats


def reset_peak_memory_stats(device=None) -> None:
    """Restarts :func:`max_memory_allocated` from the bytes live now (the other metrics keep
    counting)."""
    if _native.started():
        _native.check(_native.lib().tpjrt_reset_peak_memory())


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Drops the executables compiled in this process (a later use loads them from the disk
    tiers, or compiles them again). Device buffers are freed when their tensors are: there is
    no allocator cache to empty."""
    if _native.started():
        _native.check(_native.lib().tpjrt_empty_cache(None))


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of the device's memory. On the CPU plugin the device's memory is the
    host's: MemAvailable and MemTotal of /proc/meminfo. Other plugins do not report it through
    PJRT's C API yet."""
    import os

    plugin = os.environ.get("TORCH_PJRT_PLUGIN", "cpu")
    if plugin in ("", "cpu") or plugin.endswith("xla_cpu_pjrt.so"):
        fields = {}
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                fields[name] = int(rest.split()[0]) * 1024
        return fields["MemAvailable"], fields["MemTotal"]
    raise RuntimeError(
        f"torch.pjrt.mem_get_info: the {plugin!r} plugin does not report free device memory "
        "through the PJRT C API; use torch.pjrt.memory_allocated() for what pjrt holds"
    )


def get_amp_supported_dtype() -> list:
    return [torch.float16, torch.bfloat16]


def _lazy_init() -> None:
    _native.ensure_started()


class device:
    """Context manager that makes ``device`` the current pjrt device (as ``torch.cuda.device``)."""

    def __init__(self, device):
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            set_device(self.idx)
        return self

    def __exit__(self, *exc) -> bool:
        if self.idx >= 0 and self.idx != self.prev_idx:
            set_device(self.prev_idx)
        return False


PRECISIONS = ("highest", "high", "medium")
_extra_pass_warned = False


def _warn_if_extra_passes(mode: str) -> None:
    """On a TPU plugin float32 products are bfloat16 passes: "high" takes three, "highest"
    six. Said once per process."""
    global _extra_pass_warned
    import os
    import warnings

    plugin = os.environ.get("TORCH_PJRT_PLUGIN", "cpu").lower()
    if mode != "medium" and "tpu" in plugin and not _extra_pass_warned:
        _extra_pass_warned = True
        passes = 6 if mode == "highest" else 3
        warnings.warn(
            f"torch.pjrt.precision({mode!r}): on a TPU a float32 product at this precision "
            f"takes {passes} bfloat16 passes; 'medium' takes one",
            RuntimeWarning,
            stacklevel=3,
        )


class precision:
    """Sets the precision of float32 matrix products and convolutions on pjrt for the enclosed
    code: ``"highest"`` (full float32, PyTorch's default), ``"high"`` (TF32, or three bfloat16
    passes) or ``"medium"`` (one bfloat16 pass; TF32 on GPUs). It is
    ``torch.set_float32_matmul_precision`` scoped: process-wide like the eager modes (autograd's
    threads see it), nestable, restored on exit. The precision is part of each product's
    program key; XLA's CPU compiler computes every mode in full float32 (RFC 0034)."""

    def __init__(self, mode: str):
        if mode not in PRECISIONS:
            raise ValueError(
                f"unknown precision {mode!r}: expected one of "
                + ", ".join(repr(p) for p in PRECISIONS)
            )
        self.mode = mode
        self._saved: list[str] = []

    def __enter__(self) -> "precision":
        self._saved.append(torch.get_float32_matmul_precision())
        torch.set_float32_matmul_precision(self.mode)
        _warn_if_extra_passes(self.mode)
        return self

    def __exit__(self, *exc) -> bool:
        torch.set_float32_matmul_precision(self._saved.pop())
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with precision(self.mode):
                return fn(*args, **kwargs)

        return wrapped


# ----- streams and events ------------------------------------------------------------------
#
# One ordered execution queue serves every stream of a device: work on any stream runs after
# everything launched before it, so `wait_stream`/`wait_event` hold by construction, and an
# event completes when the device has finished everything launched before it was recorded
# (PJRT completion events), which is what `query`, `synchronize` and `elapsed_time` measure.


# PyTorch's stream and event methods take exactly `torch.Stream`/`torch.Event` arguments (not
# subclasses), so these make plain ones on the pjrt device.


class Stream:
    """A new pjrt stream: a ``torch.Stream`` on the pjrt device (``query``, ``synchronize``,
    ``wait_event``, ``wait_stream``, ``record_event``, and ``with stream:``)."""

    def __new__(cls, device=None, priority: int = 0) -> torch.Stream:
        index = current_device() if device is None else _index(device)
        return torch.Stream(device=torch.device("pjrt", index), priority=priority)


class Event:
    """A pjrt event: a ``torch.Event`` on the pjrt device (``record``, ``wait``, ``query``,
    ``synchronize`` and ``elapsed_time``: milliseconds between two events' completions on the
    device)."""

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> torch.Event:
        return torch.Event(
            device=torch.device("pjrt", current_device()),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )


def current_stream(device=None) -> torch.Stream:
    """The calling thread's current pjrt stream."""
    index = current_device() if device is None else _index(device)
    return torch.accelerator.current_stream(torch.device("pjrt", index))


def default_stream(device=None) -> torch.Stream:
    """The default pjrt stream (id 0)."""
    current = current_stream(device)
    return torch.Stream(
        stream_id=0, device_index=current.device_index, device_type=current.device_type
    )


def set_stream(stream_: torch.Stream) -> None:
    """Makes ``stream_`` the calling thread's current stream."""
    torch.accelerator.set_stream(stream_)


class stream:
    """Context manager that makes ``stream_`` current for the enclosed code (as
    ``torch.cuda.stream``); ``None`` leaves the current stream."""

    def __init__(self, stream_):
        self.stream = stream_
        self._previous = None

    def __enter__(self):
        if self.stream is not None:
            self._previous = current_stream(self.stream.device)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc) -> bool:
        if self._previous is not None:
            set_stream(self._previous)
        return False
