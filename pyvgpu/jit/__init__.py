"""The callbacks' code: numba policies the shim calls on every hooked driver and NVML call, built from
llvmlite intrinsics, compiled ahead of time by pyvgpu/native/ into libpyvgpu_callbacks.so. Layered:

runtime/   intrinsics, typed accessors of the layouts, the per-process context, the clock
state/     the group's quota and event log in the region, the process's allocation table
devices/   what the program sees of the machine: CUDA and NVML devices, NVML handles, the memory view
memory/    the memory policies: allocation calls, stream-ordered pools, measured memory
compute/   the compute share: launches, budget, turns, drains, cost model, controller, gangs
vpmm/      VPMM's allocator core and its entry points, services of the hook table (the pool's Python side is
           pyvgpu/vpmm/)
policies.py  how the hook table names a policy ("memory.alloc.mem_alloc") and finds it here

May import: pyvgpu.contract; each layer only those listed before it, but memory/ and compute/ not each
other, and vpmm/ only runtime/ (tests/test_imports.py).
"""
