"""Loading of the two native libraries: the engine (`libtorch_glue.so`, through ctypes) and the
PrivateUse1 backend (`torch_pjrt._C`), which receives the engine's function table.

Loading never starts PJRT: the engine starts at the first device use, where configuration errors
(a missing plugin, conflicting environment variables) are raised as Python exceptions.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_ENGINE_FILE = "libtorch_glue.so"

# The exception classes the engine's status codes may name (`tpjrt_error_class`).
_ERROR_TYPES = {
    cls.__name__: cls for cls in (RuntimeError, ValueError, TypeError, NotImplementedError, IndexError)
}

_lock = threading.Lock()
_loaded = False
_lib: ctypes.CDLL | None = None
_C = None
_unavailable: str | None = None


def engine_library_path() -> str:
    """Where the engine library is read from (`TORCH_PJRT_ENGINE_LIBRARY` overrides it)."""
    return os.environ.get("TORCH_PJRT_ENGINE_LIBRARY") or os.path.join(_PACKAGE_DIR, _ENGINE_FILE)


# `size_t hook(char *buffer, uint64_t capacity)`: the user's Python line, for recompile reasons.
_LOCATION_HOOK_TYPE = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64)
_TORCH_DIR = None


def _is_library_frame(filename: str) -> bool:
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    return filename.startswith(_TORCH_DIR) or filename.startswith(_PACKAGE_DIR + os.sep)


def user_location(frame=None) -> str | None:
    """``file:line`` of the innermost frame outside torch and torch_pjrt (None if none); code run
    with ``python -c`` is ``<string>``."""
    import sys

    frame = frame or sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<frozen") and not _is_library_frame(os.path.abspath(filename)):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _location_hook(buffer, capacity):
    try:
        where = user_location()
        if not where:
            return 0
        data = where.encode("utf-8", "replace")[: int(capacity)]
        ctypes.memmove(buffer, data, len(data))
        return len(data)
    except Exception:  # never let an exception escape into the engine
        return 0


_location_hook_fn = _LOCATION_HOOK_TYPE(_location_hook)


def _declare(lib: ctypes.CDLL) -> None:
    c_int, c_u64, c_char_p = ctypes.c_int32, ctypes.c_uint64, ctypes.c_char_p
    signatures = {
        "tpjrt_api": (ctypes.c_void_p, []),
        "tpjrt_init": (c_int, [c_char_p]),
        "tpjrt_last_error": (c_char_p, []),
        "tpjrt_error_class": (c_char_p, [c_int]),
        "tpjrt_sync": (c_int, []),
        "tpjrt_graph_begin": (c_int, []),
        "tpjrt_empty_cache": (c_int, [ctypes.POINTER(c_u64)]),
        "tpjrt_reset_peak_memory": (c_int, []),
        "tpjrt_cache_stats_json": (c_int, [ctypes.c_char_p, c_u64, ctypes.POINTER(c_u64)]),
        "tpjrt_graph_end": (c_int, []),
        "tpjrt_wait_warm_up": (c_int, []),
        "tpjrt_wait_compile_upgrades": (c_int, [ctypes.c_int64, ctypes.POINTER(c_int)]),
        "tpjrt_upgrade_quick_programs": (c_int, [ctypes.POINTER(ctypes.c_int64)]),
        "tpjrt_prepare_exit": (c_int, []),
        "tpjrt_mode_push": (c_int, [c_int]),
        "tpjrt_mode_pop": (c_int, []),
        "tpjrt_mode_set": (c_int, [c_int]),
        "tpjrt_mode_get": (c_int, [ctypes.POINTER(c_int)]),
        "tpjrt_device_count": (c_int, [ctypes.POINTER(c_int)]),
        "tpjrt_metrics_json": (c_int, [ctypes.c_char_p, c_u64, ctypes.POINTER(c_u64)]),
        "tpjrt_reset_metrics": (c_int, []),
        "tpjrt_recompile_limit_push": (c_int, [c_u64, c_int]),
        "tpjrt_recompile_limit_pop": (c_int, []),
        "tpjrt_set_location_hook": (c_int, [_LOCATION_HOOK_TYPE]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def load() -> None:
    """Loads `_C` (which registers the pjrt kernels) and hands it the engine's function table.

    Never raises: a failure is remembered and raised at the first device use, so `import torch`
    keeps working with a broken installation.
    """
    global _loaded, _lib, _C, _unavailable
    with _lock:
        if _loaded:
            return
        _loaded = True
        try:
            from . import _C as native
        except ImportError as e:
            _unavailable = (
                f"the torch_pjrt C++ extension could not be loaded ({e}); rebuild it with "
                "`make python-build`"
            )
            warnings.warn(f"torch_pjrt: {_unavailable}", RuntimeWarning, stacklevel=2)
            return
        _C = native
        # Where the engine looks for a PJRT plugin package (xla-cpu-pjrt, jax-cuda*-pjrt,
        # libtpu) besides the usual places: this interpreter's own path, so an installed wheel
        # finds the plugin of its venv without the venv being activated.
        import os
        import sys

        os.environ.setdefault(
            "TORCH_PJRT_SITE_PACKAGES", os.pathsep.join(p for p in sys.path if os.path.isdir(p))
        )
        path = engine_library_path()
        try:
            lib = ctypes.CDLL(path)
            _declare(lib)
            table = lib.tpjrt_api()
            if not table:
                raise RuntimeError("tpjrt_api() returned no table")
            native._set_engine_api(table)
            lib.tpjrt_set_location_hook(_location_hook_fn)
            _lib = lib
            atexit.register(_at_exit, lib)
        except (OSError, AttributeError, RuntimeError) as e:
            _unavailable = (
                f"the torch-pjrt engine library {path} could not be loaded ({e}); rebuild it "
                "with `make python-build`"
            )
            native._set_engine_unavailable(_unavailable)


# Tensors of the exit-time backward passes below, kept to the end: freed on an autograd thread
# after the interpreter began finalizing, they would need the GIL there.
_settle_kept: list = []


def _settle_autograd_device_threads() -> None:
    """Waits until PyTorch's autograd thread of each pjrt device has let go of the backward
    passes it ran, by running an empty backward pass through it.

    Such a thread may hold the last reference to a finished backward pass, whose saved
    thread-local state holds a Python object (the `contextvars` context that
    `torch.autograd.backward` stashes); dropping it takes the GIL. When that thread is
    late and asks for the GIL while the interpreter is finalizing, Python ends the thread with
    `pthread_exit`, whose unwinding through PyTorch's noexcept destructors aborts the process
    ("terminate called without an active exception"; RFC 0033). A thread runs its backward
    passes in order, so once it ran this one it let go of the earlier ones; the engine's
    `run_backward` releases the GIL meanwhile, and is called directly so that this pass saves
    no Python object of its own.
    """
    import torch

    count = ctypes.c_int32(0)
    check(lib().tpjrt_device_count(ctypes.byref(count)))
    for index in range(count.value):
        device = torch.device("pjrt", index)
        leaf = torch.empty(0, device=device, requires_grad=True)
        grad = torch.empty(0, device=device)
        torch.autograd.Variable._execution_engine.run_backward(
            (leaf.view(0),), (grad,), False, False, (), True, True
        )
        _settle_kept.append(leaf)


def _at_exit(lib: ctypes.CDLL) -> None:
    if started():
        try:
            _settle_autograd_device_threads()
        except Exception:  # noqa: BLE001 - a stopped engine: nothing to settle, exit anyway
            pass
    # Neither the runtime's background warm-up nor a region's compile may be running when the
    # process tears the runtime down.
    lib.tpjrt_prepare_exit()


def native():
    """The `_C` module (None when it could not be loaded)."""
    load()
    return _C


def lib() -> ctypes.CDLL:
    """The engine library; raises RuntimeError when it is unavailable."""
    load()
    if _lib is None:
        raise RuntimeError(f"the pjrt device is not available: {_unavailable}")
    return _lib


def check(status: int) -> None:
    """Raises the engine's last error (of this thread) as the matching Python exception."""
    if status == 0:
        return
    engine = lib()
    raw = engine.tpjrt_last_error()
    message = raw.decode("utf-8", "replace") if raw else f"pjrt engine error (status {status})"
    raise _ERROR_TYPES.get(engine.tpjrt_error_class(status).decode(), RuntimeError)(message)


def ensure_started() -> ctypes.CDLL:
    """Starts the engine (and PJRT) if it is not running; configuration errors surface here."""
    engine = lib()
    check(engine.tpjrt_init(None))
    if _C is not None:
        _C._note_engine_started()
    return engine


def started() -> bool:
    return _C is not None and _lib is not None and bool(_C._engine_started())
