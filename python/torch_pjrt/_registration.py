"""Registration with PyTorch: the backend name, the device module, the generated tensor/module/
storage methods, the kernels (loading `_C`) and printing. Runs from the `torch.backends` entry
point during `import torch`, so nothing here may raise or start PJRT."""

from __future__ import annotations

import threading
import warnings

_lock = threading.RLock()  # re-entered when `import torch` below runs the entry point
_done = False


def _patch_printing() -> None:
    """Makes `print`/`repr` of a pjrt tensor copy it to the host once.

    PyTorch's formatter indexes a non-CPU tensor element by element (one device read per element)
    unless the device is in its list of lazy devices; this does for pjrt what that list does.
    """
    import torch._tensor_str as tensor_str

    original = tensor_str._tensor_str
    if getattr(original, "_torch_pjrt", False):
        return

    def _tensor_str(self, indent):
        if self.device.type == "pjrt":
            self = self.to("cpu")
        return original(self, indent)

    _tensor_str._torch_pjrt = True
    _tensor_str.__wrapped__ = original
    tensor_str._tensor_str = _tensor_str


def register() -> None:
    global _done
    with _lock:
        if _done:
            return
        _done = True
        import torch

        from . import _compiled, _decompositions, _device_module, _native, _transformer

        try:
            if torch._C._get_privateuse1_backend_name() != "pjrt":
                torch.utils.rename_privateuse1_backend("pjrt")
        except RuntimeError as e:
            warnings.warn(
                f"torch_pjrt: cannot register the 'pjrt' device: {e}", RuntimeWarning, stacklevel=2
            )
            return
        if not hasattr(torch, "pjrt"):
            torch._register_device_module("pjrt", _device_module)
        if not hasattr(torch.Tensor, "is_pjrt"):
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
            )
        _native.load()
        _decompositions.register()
        _transformer.register()
        _patch_printing()
        _compiled.register()
