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


def registry() -> dict:
    from pyvgpu.jit import compute as C
    from pyvgpu.jit import devices as D
    from pyvgpu.jit import memory as M

    return {
        "forward": forward,
        "cuda_init": D.cuda_init,
        "device_count": D.device_count,
        "nvml_count": D.nvml_count,
        "nvml_by_index": D.nvml_by_index,
        "nvml_by_key": D.nvml_by_key,
        "nvml_index": D.nvml_index,
        "nvml_processes": D.nvml_processes,
        "nvml_processes_v1": D.nvml_processes_v1,
        "nvml_process_details": D.nvml_process_details,
        "nvml_utilization": D.nvml_utilization,
        "launch_kernel": C.launch_kernel,
        "launch_kernel_ptsz": C.launch_kernel_ptsz,
        "launch_kernel_ex": C.launch_kernel_ex,
        "launch_kernel_ex_ptsz": C.launch_kernel_ex_ptsz,
        "launch_cooperative": C.launch_cooperative,
        "launch_cooperative_ptsz": C.launch_cooperative_ptsz,
        "launch_multi_device": C.launch_multi_device,
        "graph_launch": C.graph_launch,
        "graph_launch_ptsz": C.graph_launch_ptsz,
        "legacy32": M.legacy32,
        "mem_alloc": M.mem_alloc,
        "mem_alloc_managed": M.mem_alloc_managed,
        "mem_alloc_pitch": M.mem_alloc_pitch,
        "mem_free": M.mem_free,
        "mem_get_info": M.mem_get_info,
        "device_total_mem": M.device_total_mem,
        "mem_alloc_async": M.mem_alloc_async,
        "mem_alloc_from_pool_async": M.mem_alloc_from_pool_async,
        "mem_free_async": M.mem_free_async,
        "mem_pool_trim": M.mem_pool_trim,
        "mem_pool_destroy": M.mem_pool_destroy,
        "mem_create": M.mem_create,
        "release": M.release,
        "array_create": M.array_create,
        "array3d_create": M.array3d_create,
        "mipmapped_array_create": M.mipmapped_array_create,
        "nvml_memory_info": M.nvml_memory_info,
        "nvml_memory_info_v2": M.nvml_memory_info_v2,
        "ctx_retain": M.ctx_retain,
        "ctx_create": M.ctx_create,
        "ctx_create_v3": M.ctx_create_v3,
        "ctx_create_v4": M.ctx_create_v4,
        "module_load": M.module_load,
        "module_load_ex": M.module_load_ex,
        "library_load": M.library_load,
    }
