"""Limits: parsing sizes and per-device specs from options and the environment.

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
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pyvgpu import envspec, layout
from pyvgpu.errors import PyvgpuError

MAX_DEVICES = 16
_SHIFT = {"": 0, "b": 0, "k": 10, "ki": 10, "kib": 10, "m": 20, "mi": 20, "mib": 20, "g": 30, "gi": 30, "gib": 30,
          "t": 40, "ti": 40, "tib": 40}
_DECIMAL_UNITS = {"kb": 1, "mb": 2, "gb": 3, "tb": 4}  # refused: ambiguous
# at most 30 digits before and after the point: more is no size (and int() of thousands of digits raises)
_SIZE = re.compile(r"(?P<num>[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})\s*(?P<unit>[A-Za-z]{0,3})")
_MAX = (1 << 63) - 1
MIN_MEMORY = 64 << 20
SIZE_HELP = ("a number of bytes, or a number with a binary unit K, M, G or T (also Ki, Mi, Gi, Ti), "
             "e.g. 4G, 4.5G or 512Mi")


def not_ascii(text: str, where: str, what: str, example: str) -> None:
    """Raise if ``text`` holds a character outside ASCII, naming it (``４``, ``²`` look like digits but are not)."""
    for ch in text:
        if not ch.isascii():
            import unicodedata

            name = unicodedata.name(ch, "unnamed character")
            raise PyvgpuError(f"{where}: {text!r} has the character {ch!r} ({name}, U+{ord(ch):04X}); write "
                              f"{what} with ASCII digits and letters only, e.g. {example}")


def _ascii_int(text: str) -> int | None:
    """The integer in ``text`` if it is only ASCII digits (and surrounding spaces), else None."""
    t = text.strip()
    return int(t) if t and len(t) <= 30 and t.isascii() and t.isdigit() else None


def _scaled(num: str, shift: int) -> int:
    """``num`` (digits, maybe with a point) times 2**shift, rounded down to a whole byte, exactly.
    Whole numbers need no Fraction (whose import is a tenth of `pyvgpu wrap`'s start)."""
    if "." not in num:
        return int(num) << shift
    from fractions import Fraction

    return int(Fraction(num) * (1 << shift))


def parse_size(text: str, where: str) -> int:
    """Bytes in ``text`` (the grammar above); ``where`` names the source in errors (an option or variable)."""
    text = text or ""
    not_ascii(text, where, "sizes", "4G")
    m = _SIZE.fullmatch(text.strip())
    unit = m.group("unit").lower() if m else ""
    if m and unit in _DECIMAL_UNITS:
        num, letter = m.group("num"), unit[0].upper()
        from fractions import Fraction

        decimal = int(Fraction(num) * 10 ** (3 * _DECIMAL_UNITS[unit]))
        raise PyvgpuError(f"{where}: {text!r} is ambiguous (Kubernetes reads {letter}B as powers of 10, HAMi and "
                          f"nvidia-smi as powers of 2); write {num}{letter} or {num}{letter}i for binary units, as "
                          f"pyvgpu reads them, or {decimal} (bytes) for decimal ones")
    if not m or unit not in _SHIFT:
        raise PyvgpuError(f"{where}: {text!r} is not a size; give {SIZE_HELP}")
    value = _scaled(m.group("num"), _SHIFT[unit])
    if value > _MAX:
        raise PyvgpuError(f"{where}: {text!r} is too large (the most is {_MAX} bytes)")
    if value == 0:
        raise PyvgpuError(f"{where}: {text!r} would refuse every allocation; give a positive size, or leave "
                          "the limit out for no limit")
    return value


def min_memory(env: Mapping[str, str] | None = None) -> int:
    """The smallest memory cap accepted: MIN_MEMORY, or PYVGPU_MIN_MEMORY (for simulated drivers, like the tests')."""
    text = (os.environ if env is None else env).get(envspec.MIN_MEMORY.name, "").strip()
    return parse_size(text, envspec.MIN_MEMORY.name) if text else MIN_MEMORY


def parse_cap(text: str, where: str, env: Mapping[str, str] | None = None) -> int:
    """A memory cap: a size (parse_size) no smaller than min_memory()."""
    value = parse_size(text, where)
    floor = min_memory(env)
    if value < floor:
        bare = _ascii_int(text) is not None
        hint = (f"; a bare number is bytes: did you mean {text.strip()}M or {text.strip()}Mi?" if bare else
                "; give a larger cap")
        raise PyvgpuError(f"{where}: {human(value)} is below the smallest memory cap, {human(floor)}: a CUDA context "
                          f"alone takes more (PyTorch's took 524 MiB on an H100), so the program would fail at its "
                          f"first CUDA call{hint}")
    return value


def _device(text: str, where: str) -> int:
    not_ascii(text, where, "device indices", "0=2G,1=6G")
    d = _ascii_int(text)
    if d is None or d >= MAX_DEVICES:
        raise PyvgpuError(f"{where}: {text!r} is not a device index 0..{MAX_DEVICES - 1}")
    return d


@dataclass
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


def _parse_spec(text: str, where: str, what: str, one: str, pairs: str,
                parse_one: Callable[[str, str], int]) -> tuple[int | None, dict[int, int]]:
    """``V`` for every device or ``0=V,1=W``; ``parse_one(text, where)`` checks one value."""
    parts = [p for p in (text or "").split(",")]
    if not text or any(not p.strip() for p in parts):
        raise PyvgpuError(f"{where}: give a {what} ({one}) or device={what} pairs ({pairs})")
    default: int | None = None
    per: dict[int, int] = {}
    for part in parts:
        if "=" in part:
            dev, value = part.split("=", 1)
            d = _device(dev, where)
            if d in per:
                raise PyvgpuError(f"{where}: device {d} is given twice")
            per[d] = parse_one(value, f"{where}, device {d}")
        else:
            if default is not None or len(parts) > 1:
                raise PyvgpuError(f"{where}: a plain {what} mixed with device={what} pairs; give either {one} or "
                                  f"{pairs}")
            default = parse_one(part, where)
    return default, per


def parse_memory_option(text: str, env: Mapping[str, str] | None = None) -> MemoryLimits:
    """``--memory 4G`` (every device) or ``--memory 0=2G,1=6G``; each cap at least min_memory(env)."""
    default, per = _parse_spec(text, f"--memory {text!r}", "size", "4G", "0=2G,1=6G",
                               lambda t, where: parse_cap(t, where, env))
    return MemoryLimits(default, per)


def parse_percent(text: str, where: str) -> int:
    """A compute share: an integer percent 1..100 (a trailing % is allowed)."""
    not_ascii(text or "", where, "a compute share", "30")
    pct = _ascii_int((text or "").strip().removesuffix("%"))
    if pct is None or not 1 <= pct <= 100:
        raise PyvgpuError(f"{where}: {text!r} is not a compute share; give a whole percent from 1 to 100 "
                          "(100 = the whole device), or leave the limit out")
    return pct


def parse_sm_option(text: str) -> SmLimits:
    """``--sm 30`` (every device) or ``--sm 0=30,1=50``."""
    default, per = _parse_spec(text, f"--sm {text!r}", "percent", "30", "0=30,1=50", parse_percent)
    return SmLimits(default, per)


def sm_from_env(env: Mapping[str, str]) -> SmLimits:
    """HAMi's CUDA_DEVICE_SM_LIMIT and CUDA_DEVICE_SM_LIMIT_<i>; 0 there means no limit, as in HAMi."""
    out = SmLimits()
    base = envspec.CUDA_DEVICE_SM_LIMIT.name

    def value(text: str, where: str) -> int | None:
        if text.strip() == "0":
            return None
        return parse_percent(text, where)

    if env.get(base):
        out.default = value(env[base], base)
    for key, v in env.items():
        if key.startswith(base + "_") and v:
            d = _device(key[len(base) + 1:], key)
            pct = value(v, key)
            if pct is not None:
                out.per_device[d] = pct
    return out


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
    text = env.get(envspec.GPU_CORE_UTILIZATION_POLICY.name, "").strip().lower()
    if not text:
        return 0
    if text not in SM_POLICIES:
        given = env[envspec.GPU_CORE_UTILIZATION_POLICY.name]
        raise PyvgpuError(f"GPU_CORE_UTILIZATION_POLICY={given!r} is not one of "
                          f"{', '.join(SM_POLICIES)}")
    return SM_POLICIES.index(text)


# Group priorities, in HAMi's numbers (its CUDA_TASK_PRIORITY and nvidia.com/priority: 0 is high, 1 low and
# the default): a high-priority group takes the GPU's turn first and is never held below its share.
PRIORITIES = ("high", "low")


def parse_priority(text: str, where: str) -> int:
    """``high`` or ``low``, or HAMi's 0 (high) and 1 (low)."""
    not_ascii(text or "", where, "a priority", "high")
    t = (text or "").strip().lower()
    if t in ("high", "0"):
        return 0
    if t in ("low", "1"):
        return 1
    raise PyvgpuError(f"{where}: {text!r} is not a priority; give high (HAMi's 0) or low (HAMi's 1, the default)")


def priority_from_env(env: Mapping[str, str]) -> int | None:
    """HAMi's CUDA_TASK_PRIORITY (0 high, 1 low), or None when unset."""
    text = env.get(envspec.CUDA_TASK_PRIORITY.name, "")
    return parse_priority(text, envspec.CUDA_TASK_PRIORITY.name) if text.strip() else None


def priority_to_env(priority: int) -> dict[str, str]:
    return {envspec.CUDA_TASK_PRIORITY.name: str(priority)}


def parse_switch(text: str, where: str) -> bool:
    """on/off (also 1/0, true/false, yes/no)."""
    t = (text or "").strip().lower()
    if t in ("on", "1", "true", "yes"):
        return True
    if t in ("off", "0", "false", "no"):
        return False
    raise PyvgpuError(f"{where}: {text!r} is neither on nor off; give on (or 1) or off (or 0)")


def sm_borrow_from_env(env: Mapping[str, str]) -> bool | None:
    """PYVGPU_SM_BORROW: whether the group may borrow idle GPU time beyond its share; None when unset."""
    text = env.get(envspec.SM_BORROW.name, "")
    return parse_switch(text, envspec.SM_BORROW.name) if text.strip() else None


def memory_from_env(env: Mapping[str, str]) -> MemoryLimits:
    """HAMi's CUDA_DEVICE_MEMORY_LIMIT and CUDA_DEVICE_MEMORY_LIMIT_<i>."""
    lim = MemoryLimits()
    base = envspec.CUDA_DEVICE_MEMORY_LIMIT.name
    if env.get(base):
        lim.default = parse_cap(env[base], base, env)
    for key, value in env.items():
        if key.startswith(base + "_") and value:
            lim.per_device[_device(key[len(base) + 1:], key)] = parse_cap(value, key, env)
    return lim


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


DEFAULT_SM_BATCH_MS = 10


CLOCK_MODES = ("auto", "tsc", "system")


def clock_mode(env: Mapping[str, str]) -> str:
    """PYVGPU_CLOCK: the clock of a launch under a share (pyvgpu/jit/clock.py). ``auto`` (the default): the
    TSC, anchored to CLOCK_MONOTONIC, where the kernel keeps that clock on the TSC; ``tsc``: the TSC anyway
    (x86-64); ``system``: CLOCK_MONOTONIC at every launch."""
    text = env.get(envspec.CLOCK.name, "").strip()
    if text.lower() not in ("", *CLOCK_MODES):
        raise PyvgpuError(f"PYVGPU_CLOCK={text!r} is not one of auto (the TSC where the kernel's clock runs on it, "
                          "the default), tsc, system")
    return text.lower() or "auto"


def sm_batch_ns(env: Mapping[str, str]) -> int:
    """PYVGPU_SM_BATCH_MS: budget (ms of wall time) a held launch waits for, so launches leave together."""
    text = env.get(envspec.SM_BATCH_MS.name, "").strip()
    if not text:
        return DEFAULT_SM_BATCH_MS * 1_000_000
    ms = _ascii_int(text)
    if ms is None or ms > 1000:
        raise PyvgpuError(f"PYVGPU_SM_BATCH_MS={text!r}: give whole milliseconds from 0 to 1000")
    return ms * 1_000_000
