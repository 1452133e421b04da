"""A GPU's entry in the turn file: found (or claimed) by the GPU's UUID, for the turns (turn.py ``entry``) and,
taking turns or not, for the controller's accounting of every group's charge there (``account``).

The entry is looked up on a launching thread: the controller, on the watcher thread, must not call the CUDA
driver, so it reads what ``account`` stored (``ctx.acct_entry``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pyvgpu.contract import abi
from pyvgpu.contract import layout as L
from pyvgpu.jit.compute.turnword import _NONE
from pyvgpu.jit.runtime.context import HELPER
from pyvgpu.jit.runtime.fields import CTX, SCHED_AT, TURN
from pyvgpu.jit.runtime.intrinsics import load_u64, stack_buffer
from pyvgpu.jit.state import events


@njit
def find_entry(ctx, sched, dev):
    """CUDA device dev's entry in the turn file mapped at sched (claimed if new), by the GPU's UUID; 1 when
    there is no file or every entry belongs to another GPU."""
    a = _NONE
    uuid = stack_buffer(16)  # CUuuid
    if sched != 0 and HELPER.cuDeviceGetUuid_v2(ctx, uuid, dev) == abi.CUDA_SUCCESS:
        key = np.uint64(0xCBF29CE484222325)
        for v in (load_u64(uuid), load_u64(uuid + 8)):
            key = (key ^ v) * np.uint64(0x100000001B3)
        key |= np.uint64(1)
        for i in range(SCHED_AT.N_ENTRIES):
            e = SCHED_AT.entry(sched, i)
            k = TURN.load_key(e)
            if k == 0:
                k = TURN.cas_key(e, 0, key)
                if k == 0:
                    k = key
            if k == key:
                a = np.uint64(e)
                break
        if a == _NONE:  # every entry belongs to another GPU: this one time-slices, said once per process
            events.record(CTX.get_region(ctx), L.EV_TURNS_FULL, dev, 0, 0, 0)
    return a


@njit
def account(ctx, dev):
    """Look up where the group's charges on CUDA device dev are added up with every other group's
    (``acct_entry``, read by the controller): the device's turn entry, or without turns (PYVGPU_SM_TURN=0)
    its entry in the turn file mapped for this alone. Without turns, once per device, at its first launch
    under a share (the controller must not call the CUDA driver)."""
    acct = CTX.get_acct(ctx)
    if CTX.get_acct_entry(ctx, dev) == 0 and acct != CTX.get_sched(ctx):  # with turns, ``entry`` sets it
        CTX.set_acct_entry(ctx, dev, find_entry(ctx, acct, dev))
