"""Builds `torch_pjrt._C`, the PrivateUse1 backend, against the installed PyTorch.

The per-op kernels are generated first (torch_pjrt/csrc/gen_kernels.py); the engine library
(libtorch_glue.so) is built by cargo and copied next to the package by `make python-build`.
"""

import os
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("torch_pjrt", "csrc")
GENERATED = os.path.join(CSRC, "generated")
ENGINE_INCLUDE = os.path.normpath(os.path.join(HERE, "..", "torch-glue", "include"))


def kineto_include():
    """Kineto's headers, which PyTorch ships beside its own (csrc/profiler.cpp includes them)."""
    from torch.utils.cpp_extension import include_paths

    return next((os.path.join(p, "kineto") for p in include_paths()
                 if os.path.isdir(os.path.join(p, "kineto"))), "")


KINETO_INCLUDE = kineto_include()


def generated_sources():
    sys.path.insert(0, os.path.join(HERE, CSRC))
    try:
        import gen_kernels
    finally:
        sys.path.pop(0)
    paths = gen_kernels.generate(os.path.join(HERE, GENERATED), shards=2)
    return [os.path.relpath(p, HERE) for p in paths]


os.chdir(HERE)
# `make python-build` installs the package metadata (editable, for the torch.backends entry
# point) with TORCH_PJRT_METADATA_ONLY=1 and builds the extension in place with ninja, so the
# extension is compiled once, incrementally, in python/build.
METADATA_ONLY = os.environ.get("TORCH_PJRT_METADATA_ONLY") == "1"
sources = [
    os.path.join(CSRC, "module.cpp"),
    os.path.join(CSRC, "backend.cpp"),
    os.path.join(CSRC, "random.cpp"),
    os.path.join(CSRC, "indexing.cpp"),
    os.path.join(CSRC, "optim.cpp"),
    os.path.join(CSRC, "growth.cpp"),
    # Composite kernels, one file per op family (RFC 0019).
    os.path.join(CSRC, "activation.cpp"),
    os.path.join(CSRC, "elementwise.cpp"),
    os.path.join(CSRC, "reduce.cpp"),
    os.path.join(CSRC, "linalg.cpp"),
    os.path.join(CSRC, "norm.cpp"),
    os.path.join(CSRC, "embedding.cpp"),
    os.path.join(CSRC, "conv.cpp"),
    os.path.join(CSRC, "creation.cpp"),
    os.path.join(CSRC, "padding.cpp"),
    os.path.join(CSRC, "resample.cpp"),
    os.path.join(CSRC, "rnn.cpp"),
    os.path.join(CSRC, "complex.cpp"),
    os.path.join(CSRC, "autocast.cpp"),
    os.path.join(CSRC, "graphs.cpp"),
    os.path.join(CSRC, "profiler.cpp"),
    os.path.join(CSRC, "distributed.cpp"),
    os.path.join(CSRC, "devices.cpp"),
]
if not METADATA_ONLY:
    sources += generated_sources()

def requirements():
    """The torch the extension was built against (its C++ ABI is that release's), and the PJRT
    plugin package of the CPU."""
    import torch

    return [f"torch=={torch.__version__.split('+')[0]}", "xla-cpu-pjrt"]


setup(
    name="torch-pjrt",
    install_requires=requirements(),
    version="0.1.0",
    description="PyTorch run eagerly on PJRT devices (device 'pjrt')",
    packages=["torch_pjrt"],
    package_data={"torch_pjrt": ["libtorch_glue.so"]},
    python_requires=">=3.10",
    ext_modules=[] if METADATA_ONLY else [
        CppExtension(
            name="torch_pjrt._C",
            sources=sources,
            include_dirs=[os.path.join(HERE, CSRC), ENGINE_INCLUDE, KINETO_INCLUDE],
            extra_compile_args=["-O2", "-g0", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    entry_points={
        "torch.backends": ["torch_pjrt = torch_pjrt:_autoload"],
        "torch_dynamo_backends": ["pjrt = torch_pjrt._compiled:pjrt_backend"],
    },
)
