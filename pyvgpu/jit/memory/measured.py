"""Memory no allocation call shows, measured with NVML: contexts and modules.

A context takes device memory no allocation call shows (hundreds of MiB;
docs/measurements.md, "Context and module memory"). It is measured: NVML's device-wide used before and after the
process's first primary context (or cuCtxCreate) on a device (pyvgpu/jit/devices/nvml.py).
The bytes are charged as kind "context" like any allocation: a context that
does not fit in the group's cap is released again and the call fails with
CUDA_ERROR_OUT_OF_MEMORY. They stay charged until the process ends.
Without NVML, contexts are not counted. Other processes allocating at the
same instant disturb the reading (docs/accounting.md).

Loading a module or library can take device memory (code, constants,
globals) too. It is measured the same way around the load; a load that does
not fit is unloaded again and fails with CUDA_ERROR_OUT_OF_MEMORY; unloading
credits it (pyvgpu/jit/memory/alloc.py ``release``). Since CUDA 12.2 modules load
lazily by default, so most of their memory appears at first launch, outside
any load call; those bytes are not counted.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.jit.devices import visible as D
from pyvgpu.jit.devices.nvml import device_used
from pyvgpu.jit.memory import ctxmsg
from pyvgpu.jit.runtime.context import HELPER, call_real, current_device, note_context
from pyvgpu.jit.runtime.fields import CTX, DEV, REGION
from pyvgpu.jit.runtime.intrinsics import load_u64
from pyvgpu.jit.state import ptrtable as T
from pyvgpu.jit.state import quota as Q

UNLOAD_MODULE, UNLOAD_LIBRARY = 0, 1


@njit
def measured_context(ctx, idx, args, notfound, dev, pctx, primary):
    """Create the context through the driver, charging what it took if this is our first on dev; a context
    made is noted for the launches (they need not ask the driver their device while there is one)."""
    rc = _make_context(ctx, idx, args, notfound, dev, pctx, primary)
    if rc == abi.CUDA_SUCCESS:
        note_context(ctx, dev)
    return rc


@njit
def _make_context(ctx, idx, args, notfound, dev, pctx, primary):
    if D.refused(ctx):
        return abi.CUDA_ERROR_NO_DEVICE  # CUDA sees devices outside the group (cuInit said why)
    if CTX.get_region(ctx) == 0 or dev < 0 or dev >= L.MAX_DEVICES or pctx == 0:
        return call_real(ctx, idx, args, notfound)
    if CTX.cas_ctx_charged(ctx, dev, 0, 1) != 0:  # measured already (or being measured by another thread)
        return call_real(ctx, idx, args, notfound)
    before = device_used(ctx, dev)
    rc = call_real(ctx, idx, args, notfound)
    if rc != abi.CUDA_SUCCESS:
        CTX.cas_ctx_charged(ctx, dev, 1, 0)
        return rc
    after = device_used(ctx, dev)
    if before < 0 or after <= before:
        return rc
    n = np.uint64(after - before)
    if Q.charge_or_refuse(ctx, dev, L.KIND_CONTEXT, n):
        CTX.set_ctx_charged(ctx, dev, n)
        return rc
    # it does not fit: give the context back and refuse, as for any allocation, and say why on stderr (a program
    # reports only "out of memory" at its first CUDA call)
    d = REGION.device(CTX.get_region(ctx), dev)
    ctxmsg.report(dev, n, DEV.load_limit(d), DEV.load_used(d))
    if primary:
        HELPER.cuDevicePrimaryCtxRelease_v2(ctx, dev)
    else:
        HELPER.cuCtxDestroy_v2(ctx, load_u64(pctx))
    CTX.set_ctx_charged(ctx, dev, 0)
    return abi.CUDA_ERROR_OUT_OF_MEMORY


@njit
def ctx_retain(ctx, idx, args, notfound):
    pctx, dev = args
    return measured_context(ctx, idx, args, notfound, dev, pctx, True)


@njit
def ctx_create(ctx, idx, args, notfound):
    pctx, flags, dev = args
    return measured_context(ctx, idx, args, notfound, dev, pctx, False)


@njit
def ctx_create_v3(ctx, idx, args, notfound):
    pctx, params, nparams, flags, dev = args
    return measured_context(ctx, idx, args, notfound, dev, pctx, False)


@njit
def ctx_create_v4(ctx, idx, args, notfound):
    pctx, params, flags, dev = args
    return measured_context(ctx, idx, args, notfound, dev, pctx, False)


@njit
def measured_load(ctx, idx, args, notfound, phandle, unload):
    if CTX.get_region(ctx) == 0 or phandle == 0:
        return call_real(ctx, idx, args, notfound)
    dev = current_device(ctx)
    if dev < 0:
        return call_real(ctx, idx, args, notfound)
    before = device_used(ctx, dev)
    rc = call_real(ctx, idx, args, notfound)
    if rc != abi.CUDA_SUCCESS or before < 0:
        return rc
    after = device_used(ctx, dev)
    if after <= before:
        return rc
    n = np.uint64(after - before)
    handle = load_u64(phandle)
    if not Q.charge_or_refuse(ctx, dev, L.KIND_MODULE, n):
        if unload == UNLOAD_MODULE:
            HELPER.cuModuleUnload(ctx, handle)
        else:
            HELPER.cuLibraryUnload(ctx, handle)
        return abi.CUDA_ERROR_OUT_OF_MEMORY
    if not T.insert(ctx, handle, T.pack(n, dev, T.T_MODULE)):
        Q.uncharge(ctx, dev, L.KIND_MODULE, n)  # untracked: better uncounted than never credited
        CTX.add_table_full(ctx, 1)
    return rc


@njit
def module_load(ctx, idx, args, notfound):
    pmod, image = args
    return measured_load(ctx, idx, args, notfound, pmod, UNLOAD_MODULE)


@njit
def module_load_ex(ctx, idx, args, notfound):
    pmod, image, nopt, opts, vals = args
    return measured_load(ctx, idx, args, notfound, pmod, UNLOAD_MODULE)


@njit
def library_load(ctx, idx, args, notfound):
    plib, code, jo, jv, nj, lo, lv, nl = args
    return measured_load(ctx, idx, args, notfound, plib, UNLOAD_LIBRARY)
