"""Limits: parsing sizes and per-device specs from options and the environment.

A size is an integer with an optional K/M/G/T suffix, binary, any case
("4G" = 4 GiB, "512m", "1048576"). Anything else is an error that names
where the value came from and what a valid one looks like, raised before
the program starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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
class MemoryLimits:
    """Per-device byte limits; ``default`` applies to devices not listed."""

    default: int | None = None
    per_device: dict[int, int] = field(default_factory=dict)

    def for_device(self, dev: int) -> int | None:
        return self.per_device.get(dev, self.default)

    def as_list(self) -> list[int]:
        """One entry per device slot of the region; 0 = no limit."""
        return [self.for_device(d) or 0 for d in range(MAX_DEVICES)]

    def __bool__(self) -> bool:
        return self.default is not None or bool(self.per_device)


def parse_memory_option(text: str) -> MemoryLimits:
    """``--memory 4G`` (every device) or ``--memory 0=2G,1=6G``."""
    where = f"--memory {text!r}"
    lim = MemoryLimits()
    parts = [p for p in (text or "").split(",")]
    if not text or any(not p.strip() for p in parts):
        raise PyvgpuError(f"{where}: give a size (4G) or device=size pairs (0=2G,1=6G)")
    for part in parts:
        if "=" in part:
            dev, size = part.split("=", 1)
            d = _device(dev, where)
            if d in lim.per_device:
                raise PyvgpuError(f"{where}: device {d} is given twice")
            lim.per_device[d] = parse_size(size, f"{where}, device {d}")
        else:
            if lim.default is not None or len(parts) > 1:
                raise PyvgpuError(f"{where}: a plain size mixed with device=size pairs; give either 4G or "
                                  "0=2G,1=6G")
            lim.default = parse_size(part, where)
    return lim


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
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def unenforced_sm_limit(env: Mapping[str, str]) -> str | None:
    """The compute-share variables that are set, which this version cannot enforce yet."""
    keys = sorted(k for k, v in env.items() if v and (k == "CUDA_DEVICE_SM_LIMIT" or
                                                      k.startswith("CUDA_DEVICE_SM_LIMIT_")))
    return ", ".join(f"{k}={env[k]}" for k in keys) or None


def sm_limit_problem(env: Mapping[str, str]) -> str | None:
    """An error for a requested compute share (fail closed), or None.

    With PYVGPU_ON_ERROR=open the caller warns and runs without it instead.
    """
    found = unenforced_sm_limit(env)
    if not found:
        return None
    return (f"{found} asks for a compute share, which this pyvgpu version does not enforce yet; unset it, or set "
            "PYVGPU_ON_ERROR=open to run with the memory limits only")
