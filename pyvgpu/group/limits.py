"""Limits: sizes and per-device specs from options and the environment, read by the group core in C.

Every value is parsed by shim/src/pv_grammar.c and pv_env.c through pyvgpu/native/grouplib.py, the functions
the shim reads the same variables with inside a program: one grammar, one set of messages. This module
gives them Python's types (MemoryLimits, SmLimits) and formats values back (human, *_to_env).

The size grammar (docs/manual.md, "Sizes"), one for options and HAMi's variables:

* a number of bytes, or a number and a binary unit: ``K``/``Ki``/``KiB`` = 2^10,
  ``M``/``Mi``/``MiB`` = 2^20, ``G``/``Gi``/``GiB`` = 2^30, ``T``/``Ti``/``TiB`` = 2^40,
  any case. ``4G`` = ``4Gi`` = 4 GiB, ``8192m`` = 8 GiB (what HAMi's device
  plugin writes), ``1073741824`` = 1 GiB.
* decimals are accepted and the result is rounded down to a whole byte
  (``4.5G`` = 4831838208, ``0.1K`` = 102).
* ``KB``/``MB``/``GB``/``TB`` are refused: Kubernetes and disk makers read them as
  powers of 10, HAMi and nvidia-smi as powers of 2, and a cap that is 7% off
  is a crash at 3 a.m. The error says what to write instead.
* only ASCII: ``４G`` or ``²`` are refused with the character named.

A memory cap below MIN_MEMORY (64 MiB; PYVGPU_MIN_MEMORY lowers it) is refused:
a CUDA context alone takes hundreds of MiB (docs/measurements.md, "Context and module memory"),
and such a cap is nearly always a unit mistake (``4096`` meant as MiB is 4 KiB).
Anything else wrong is an error that names where the value came from and what
a valid one looks like, raised before the program starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pyvgpu.contract import envspec, layout
from pyvgpu.contract.record import field, record  # not dataclasses: a plain wrap imports this
from pyvgpu.native import grouplib

MAX_DEVICES = 16
MIN_MEMORY = 64 << 20  # pv_env.c PV_MIN_MEMORY


def not_ascii(text: str, where: str, what: str, example: str) -> None:
    """Raise if ``text`` holds a character outside ASCII, naming it (``４``, ``²`` look like digits but are not)."""
    grouplib.check_ascii(text, where, what, example)


def parse_size(text: str, where: str) -> int:
    """Bytes in ``text`` (the grammar above); ``where`` names the source in errors (an option or variable)."""
    return grouplib.size(text, where)


def min_memory(env: Mapping[str, str] | None = None) -> int:
    """The smallest memory cap accepted: MIN_MEMORY, or PYVGPU_MIN_MEMORY (for simulated drivers, like the tests')."""
    name = envspec.MIN_MEMORY.name
    return grouplib.env_setting({name: (os.environ if env is None else env).get(name, "")}, grouplib.MIN_MEMORY)


def parse_cap(text: str, where: str, env: Mapping[str, str] | None = None) -> int:
    """A memory cap: a size (parse_size) no smaller than min_memory()."""
    grouplib.size(text, where)
    return grouplib.cap(text, where, min_memory(env))


@record
class DeviceValues:
    """Per-device values (bytes, or percent); ``default`` applies to devices not listed."""

    default: int | None = None
    per_device: dict[int, int] = field(default_factory=dict)

    def for_device(self, dev: int) -> int | None:
        return self.per_device.get(dev, self.default)

    def as_list(self) -> list[int]:
        """One entry per device slot of the region; 0 = no limit."""
        return [self.for_device(d) or 0 for d in range(MAX_DEVICES)]

    def __bool__(self) -> bool:
        return self.default is not None or bool(self.per_device)


class MemoryLimits(DeviceValues):
    """Per-device byte limits."""


class SmLimits(DeviceValues):
    """Per-device compute shares in percent (1-100; 100 = the whole device, no limit)."""


def parse_memory_option(text: str, env: Mapping[str, str] | None = None, none: bool = False) -> MemoryLimits:
    """``--memory 4G`` (every device) or ``--memory 0=2G,1=6G``; each cap at least min_memory(env). With
    ``none`` (`limits set`), none, off or 0 removes the cap (a default of 0)."""
    return MemoryLimits(*grouplib.spec(text, f"--memory {text!r}", shares=False, floor=min_memory(env), none=none))


def parse_percent(text: str, where: str) -> int:
    """A compute share: an integer percent 1..100 (a trailing % is allowed)."""
    return grouplib.percent(text, where)


def parse_sm_option(text: str, none: bool = False) -> SmLimits:
    """``--sm 30`` (every device) or ``--sm 0=30,1=50``; with ``none`` as parse_memory_option."""
    return SmLimits(*grouplib.spec(text, f"--sm {text!r}", shares=True, none=none))


def sm_from_env(env: Mapping[str, str]) -> SmLimits:
    """HAMi's CUDA_DEVICE_SM_LIMIT and CUDA_DEVICE_SM_LIMIT_<i>; 0 there means no limit, as in HAMi."""
    return SmLimits(*grouplib.env_devices(env, shares=True))


def sm_to_env(lim: SmLimits) -> dict[str, str]:
    out = {}
    if lim.default is not None:
        out[envspec.CUDA_DEVICE_SM_LIMIT.name] = str(lim.default)
    for d, v in sorted(lim.per_device.items()):
        out[envspec.CUDA_DEVICE_SM_LIMIT.device(d)] = str(v)
    return out


SM_POLICIES = layout.SM_POLICIES  # GPU_CORE_UTILIZATION_POLICY values, in the region's encoding


def sm_policy(env: Mapping[str, str]) -> int:
    """GPU_CORE_UTILIZATION_POLICY as 0 (default), 1 (force) or 2 (disable); unset or empty is default."""
    return grouplib.env_setting(env, grouplib.POLICY)


# Group priorities, in HAMi's numbers (its CUDA_TASK_PRIORITY and nvidia.com/priority: 0 is high, 1 low and
# the default): a high-priority group takes the GPU's turn first and is never held below its share.
PRIORITIES = ("high", "low")


def parse_priority(text: str, where: str) -> int:
    """``high`` or ``low``, or HAMi's 0 (high) and 1 (low)."""
    return grouplib.priority(text, where)


def priority_from_env(env: Mapping[str, str]) -> int | None:
    """HAMi's CUDA_TASK_PRIORITY (0 high, 1 low), or None when unset."""
    got = grouplib.env_setting(env, grouplib.PRIORITY)
    return None if got < 0 else got


def priority_to_env(priority: int) -> dict[str, str]:
    return {envspec.CUDA_TASK_PRIORITY.name: str(priority)}


def parse_switch(text: str, where: str) -> bool:
    """on/off (also 1/0, true/false, yes/no)."""
    return grouplib.switch(text, where)


def sm_borrow_from_env(env: Mapping[str, str]) -> bool | None:
    """PYVGPU_SM_BORROW: whether the group may borrow idle GPU time beyond its share; None when unset."""
    got = grouplib.env_setting(env, grouplib.SM_BORROW)
    return None if got < 0 else bool(got)


def memory_from_env(env: Mapping[str, str]) -> MemoryLimits:
    """HAMi's CUDA_DEVICE_MEMORY_LIMIT and CUDA_DEVICE_MEMORY_LIMIT_<i>."""
    return MemoryLimits(*grouplib.env_devices(env, shares=False))


def memory_to_env(lim: MemoryLimits) -> dict[str, str]:
    out = {}
    if lim.default is not None:
        out[envspec.CUDA_DEVICE_MEMORY_LIMIT.name] = str(lim.default)
    for d, v in sorted(lim.per_device.items()):
        out[envspec.CUDA_DEVICE_MEMORY_LIMIT.device(d)] = str(v)
    return out


def human(n: int) -> str:
    """Bytes in the largest binary unit they reach: exact when whole ("4 GiB"), else to 2 decimals ("1.70 GiB")."""
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}" if n % div == 0 else f"{n / div:.2f} {unit}"
    return f"{n} B"


CLOCK_MODES = ("auto", "tsc", "system")


def clock_mode(env: Mapping[str, str]) -> str:
    """PYVGPU_CLOCK: the clock of a launch under a share (pyvgpu/jit/runtime/clock.py). ``auto`` (the default): the
    TSC, anchored to CLOCK_MONOTONIC, where the kernel keeps that clock on the TSC; ``tsc``: the TSC anyway
    (x86-64); ``system``: CLOCK_MONOTONIC at every launch."""
    return CLOCK_MODES[grouplib.env_setting(env, grouplib.CLOCK)]


def sm_batch_ns(env: Mapping[str, str]) -> int:
    """PYVGPU_SM_BATCH_MS: budget (ms of wall time) a held launch waits for, so launches leave together."""
    return grouplib.env_setting(env, grouplib.BATCH_NS)
