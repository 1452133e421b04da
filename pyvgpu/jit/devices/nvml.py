"""NVML as the policies use it: initialised once per process, a handle per CUDA device.

The memory policies measure contexts and modules with NVML's device-wide
``used`` (pyvgpu/jit/memory/measured.py); the compute controller reads utilization
(pyvgpu/jit/compute/controller.py). Both need the NVML handle of a CUDA device, found
by PCI bus id so that it is right under CUDA_VISIBLE_DEVICES too, and cached
in the context: the controller runs on the watcher thread, which must not
call the CUDA driver itself.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.jit.runtime.context import HELPER, REAL
from pyvgpu.jit.runtime.fields import CTX, NVML_MEMORY
from pyvgpu.jit.runtime.intrinsics import load_u64, stack_buffer, stack_u64

NVML_UNTRIED, NVML_READY, NVML_UNAVAILABLE = 0, 1, 2
NO_HANDLE = np.uint64(1)  # ctx.sm_nvml value: NVML cannot see this device


@njit
def ready(ctx):
    """Initialise NVML once per process (whichever thread comes first); True if it is usable."""
    st = CTX.load_nvml_state(ctx)
    if st == NVML_UNTRIED:
        ok = HELPER.nvmlInit_v2(ctx) == abi.NVML_SUCCESS
        CTX.cas_nvml_state(ctx, NVML_UNTRIED, NVML_READY if ok else NVML_UNAVAILABLE)
        st = CTX.load_nvml_state(ctx)
    return st == NVML_READY


@njit
def handle(ctx, dev):
    """NVML's handle of CUDA device dev, cached in the context; NO_HANDLE when NVML cannot tell.

    Asks the CUDA driver the first time for each device: callers on the watcher thread read
    ``CTX.get_sm_nvml`` instead."""
    h = CTX.get_sm_nvml(ctx, dev)
    if h != 0:
        return h
    h = NO_HANDLE
    if ready(ctx):
        bus = stack_buffer(64)  # abi.NVML_BUS_ID_BYTES
        out = stack_u64()
        if (HELPER.cuDeviceGetPCIBusId(ctx, bus, abi.NVML_BUS_ID_BYTES - 1, dev) == abi.CUDA_SUCCESS
                and HELPER.nvmlDeviceGetHandleByPciBusId_v2(ctx, bus, out) == abi.NVML_SUCCESS
                and load_u64(out) > NO_HANDLE):
            h = load_u64(out)
    CTX.set_sm_nvml(ctx, dev, h)
    return h


@njit
def device_used(ctx, dev):
    """NVML's used bytes of CUDA device dev (the whole device, every process), or -1."""
    h = handle(ctx, dev)
    if h <= NO_HANDLE:
        return np.int64(-1)
    mem = stack_buffer(24)  # nvmlMemory_t
    if REAL.nvmlDeviceGetMemoryInfo(ctx, h, mem) != abi.NVML_SUCCESS:
        return np.int64(-1)
    return np.int64(NVML_MEMORY.get_used(mem))
