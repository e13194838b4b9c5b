"""torch-pjrt: PyTorch run eagerly on PJRT devices, as device ``"pjrt"``.

Installing the package is enough: PyTorch loads it through the ``torch.backends`` entry point at
``import torch``. The engine and PJRT start at the first use of the device.

    import torch, torch_pjrt
    x = torch.randn(4, 4).to("pjrt")
    with torch_pjrt.eager_mode("defer_and_fuse"):
        y = (x @ x).relu().sum()
    print(y.item(), torch_pjrt.metrics()["compilations"])
"""

from ._api import (
    EAGER_MODES,
    cache_stats,
    eager_mode,
    get_eager_mode,
    mark_dynamic,
    metrics,
    metrics_report,
    recompile_limit,
    reset_metrics,
    set_eager_mode,
    sync,
)
from . import comm
from ._registration import register as _register
from .distributed import register as _register_distributed

__all__ = [
    "EAGER_MODES",
    "cache_stats",
    "comm",
    "eager_mode",
    "get_eager_mode",
    "mark_dynamic",
    "metrics",
    "metrics_report",
    "recompile_limit",
    "reset_metrics",
    "set_eager_mode",
    "sync",
]

__version__ = "0.1.0"


def _autoload() -> None:
    """The ``torch.backends`` entry point: registers the device and the ``"pjrt"`` c10d backend;
    never starts PJRT."""
    _register()
    _register_distributed()


_autoload()
