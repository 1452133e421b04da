"""Policies: what happens on a hooked call.

A policy is an ``njit`` function ``policy(ctx, idx, args, notfound)``:
``ctx`` is the address of the per-process context (pyvgpu.layout.CTX),
``idx`` the hook entry index, ``args`` the call's arguments as a tuple and
``notfound`` the library's "function not found" code. It returns the
CUresult / nvmlReturn_t the application sees. Policies only call
intrinsics; they never allocate and never touch Python objects.

The callback registry ``POLICIES`` maps the names used in the hook table
(pyvgpu/hooks.py) to these functions.
"""

from __future__ import annotations

from numba import njit

from pyvgpu.jit.intrinsics import atomic_add_u64, call_i32, load_u64
from pyvgpu.layout import CTX_OFF_CALLS, CTX_OFF_REAL


@njit(inline="always")
def count_call(ctx, idx):
    atomic_add_u64(ctx + CTX_OFF_CALLS + idx * 8, 1)


@njit(inline="always")
def call_real(ctx, idx, args, notfound):
    """Call the real driver function of entry ``idx``."""
    fn = load_u64(ctx + CTX_OFF_REAL + idx * 8)
    if fn == 0:
        return notfound
    return call_i32(fn, args)


@njit(inline="always")
def forward(ctx, idx, args, notfound):
    """No policy: pass the call to the driver unchanged."""
    return call_real(ctx, idx, args, notfound)


POLICIES = {"forward": forward}
