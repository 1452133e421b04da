"""Limits: parsing sizes and per-device specs from options and the environment.

A size is an integer with an optional K/M/G/T suffix, binary, any case
("4G" = 4 GiB, "512m", "1048576"). Anything else is an error that names
where the value came from and what a valid one looks like, raised before
the program starts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pyvgpu.errors import PyvgpuError

MAX_DEVICES = 16
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+)\s*([kKmMgGtT]?)(?:[iI]?[bB])?\s*$")
_MAX = (1 << 63) - 1


def parse_size(text: str, where: str) -> int:
    """Bytes in ``text``; ``where`` names the source in errors (an option or variable)."""
    m = _SIZE.match(text or "")
    if not m:
        raise PyvgpuError(f"{where}: {text!r} is not a size; use an integer with an optional K, M, G or T "
                          "suffix (binary), e.g. 4G or 512M")
    value = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if value > _MAX:
        raise PyvgpuError(f"{where}: {text!r} is too large (the most is {_MAX} bytes)")
    if value == 0:
        raise PyvgpuError(f"{where}: {text!r} would refuse every allocation; give a positive size, or leave "
                          "the limit out for no limit")
    return value


def _device(text: str, where: str) -> int:
    if not text.strip().isdigit() or int(text) >= MAX_DEVICES:
        raise PyvgpuError(f"{where}: {text!r} is not a device index 0..{MAX_DEVICES - 1}")
    return int(text)


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


def parse_memory_option(text: str) -> MemoryLimits:
    """``--memory 4G`` (every device) or ``--memory 0=2G,1=6G``."""
    default, per = _parse_spec(text, f"--memory {text!r}", "size", "4G", "0=2G,1=6G", parse_size)
    return MemoryLimits(default, per)


def parse_percent(text: str, where: str) -> int:
    """A compute share: an integer percent 1..100 (a trailing % is allowed)."""
    t = (text or "").strip().removesuffix("%").strip()
    if not t.isdigit() or not 1 <= int(t) <= 100:
        raise PyvgpuError(f"{where}: {text!r} is not a compute share; give a whole percent from 1 to 100 "
                          "(100 = the whole device), or leave the limit out")
    return int(t)


def parse_sm_option(text: str) -> SmLimits:
    """``--sm 30`` (every device) or ``--sm 0=30,1=50``."""
    default, per = _parse_spec(text, f"--sm {text!r}", "percent", "30", "0=30,1=50", parse_percent)
    return SmLimits(default, per)


def sm_from_env(env: Mapping[str, str]) -> SmLimits:
    """HAMi's CUDA_DEVICE_SM_LIMIT and CUDA_DEVICE_SM_LIMIT_<i>; 0 there means no limit, as in HAMi."""
    out = SmLimits()
    base = "CUDA_DEVICE_SM_LIMIT"

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
        out["CUDA_DEVICE_SM_LIMIT"] = str(lim.default)
    for d, v in sorted(lim.per_device.items()):
        out[f"CUDA_DEVICE_SM_LIMIT_{d}"] = str(v)
    return out


SM_POLICIES = ("default", "force", "disable")


def sm_policy(env: Mapping[str, str]) -> int:
    """GPU_CORE_UTILIZATION_POLICY as 0 (default), 1 (force) or 2 (disable); unset or empty is default."""
    text = env.get("GPU_CORE_UTILIZATION_POLICY", "").strip().lower()
    if not text:
        return 0
    if text not in SM_POLICIES:
        raise PyvgpuError(f"GPU_CORE_UTILIZATION_POLICY={env['GPU_CORE_UTILIZATION_POLICY']!r} is not one of "
                          f"{', '.join(SM_POLICIES)}")
    return SM_POLICIES.index(text)


def memory_from_env(env: Mapping[str, str]) -> MemoryLimits:
    """HAMi's CUDA_DEVICE_MEMORY_LIMIT and CUDA_DEVICE_MEMORY_LIMIT_<i>."""
    lim = MemoryLimits()
    base = "CUDA_DEVICE_MEMORY_LIMIT"
    if env.get(base):
        lim.default = parse_size(env[base], base)
    for key, value in env.items():
        if key.startswith(base + "_") and value:
            lim.per_device[_device(key[len(base) + 1:], key)] = parse_size(value, key)
    return lim


def memory_to_env(lim: MemoryLimits) -> dict[str, str]:
    out = {}
    if lim.default is not None:
        out["CUDA_DEVICE_MEMORY_LIMIT"] = str(lim.default)
    for d, v in sorted(lim.per_device.items()):
        out[f"CUDA_DEVICE_MEMORY_LIMIT_{d}"] = str(v)
    return out


def human(n: int) -> str:
    """Bytes in the largest binary unit they reach: exact when whole ("4 GiB"), else to 2 decimals ("1.70 GiB")."""
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}" if n % div == 0 else f"{n / div:.2f} {unit}"
    return f"{n} B"


DEFAULT_SM_BATCH_MS = 10


def sm_batch_ns(env: Mapping[str, str]) -> int:
    """PYVGPU_SM_BATCH_MS: budget (ms of wall time) a held launch waits for, so launches leave together."""
    text = env.get("PYVGPU_SM_BATCH_MS", "").strip()
    if not text:
        return DEFAULT_SM_BATCH_MS * 1_000_000
    if not text.isdigit() or int(text) > 1000:
        raise PyvgpuError(f"PYVGPU_SM_BATCH_MS={text!r}: give whole milliseconds from 0 to 1000")
    return int(text) * 1_000_000
