"""Policies: what happens on a hooked call, and how the hook table names them.

A policy is an ``njit`` function ``policy(ctx, idx, args, notfound)``:
``ctx`` is the address of the per-process context (pyvgpu.contract.layout.CTX),
``idx`` the hook entry index, ``args`` the call's arguments as a tuple and
``notfound`` the library's "function not found" code. It returns the
CUresult / nvmlReturn_t the application sees. Policies only call
intrinsics and each other; they never allocate and never touch Python objects.

The hook table (pyvgpu/contract/hooks.py) names each entry's policy as
``module.function`` inside ``pyvgpu.jit``: :func:`resolve` finds it. There is
no registry to keep in step with the table.
"""

from __future__ import annotations

import importlib

from numba import njit

from pyvgpu.jit.runtime.context import call_real


@njit
def forward(ctx, idx, args, notfound):
    """No policy: pass the call to the driver unchanged."""
    return call_real(ctx, idx, args, notfound)


def resolve(name: str):
    """The policy the hook table calls ``name`` ("memory.alloc.mem_alloc"): a numba dispatcher."""
    module, _, func = name.rpartition(".")
    if not module or not func:
        raise ValueError(f"hook table: policy {name!r} must be 'module.function' inside pyvgpu.jit")
    try:
        fn = getattr(importlib.import_module(f"pyvgpu.jit.{module}"), func)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"hook table: policy {name!r} does not exist ({e})") from None
    if not hasattr(fn, "py_func"):
        raise ValueError(f"hook table: policy {name!r} is not an @njit function")
    return fn
