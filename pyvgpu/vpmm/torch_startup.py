"""The startup hook's work in a wrapped Python program: VPMM as PyTorch's allocator.

The callbacks need no Python: the shim loads them itself at the program's
first CUDA or NVML call (shim/src/pv_load.c, pv_attach.c), whatever the
program. What needs Python is making VPMM, pyvgpu's pool, PyTorch's
allocator (`pyvgpu wrap --allocator vpmm`): `pyvgpu wrap` then puts the
startup hook (pyvgpu/_boot/sitecustomize.py) on PYTHONPATH, and it calls
``startup()`` before user code runs.
"""

from __future__ import annotations

import os

from pyvgpu.contract import envspec

ALLOCATORS = ("default", "vpmm")


def torch_allocator_hook() -> None:
    """PYVGPU_ALLOCATOR=vpmm: make VPMM PyTorch's allocator as soon as `import torch` completes,
    before the program can allocate. Nothing is imported until then."""
    import importlib.abc
    import importlib.util
    import sys

    class TorchHook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                from pyvgpu.vpmm import pytorch as vpmm_torch

                vpmm_torch.enable()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, TorchHook())


def startup() -> None:
    """The startup hook: PYVGPU_ALLOCATOR=vpmm makes VPMM PyTorch's allocator."""
    if os.environ.get(envspec.ALLOCATOR.name) == "vpmm":
        torch_allocator_hook()
