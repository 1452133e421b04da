"""Which CPU this is, as one number: the key of a host-tuned callback library.

Code tuned for one CPU can fault with an illegal instruction on another, and
a home directory (with its cache) may be shared by machines with different
CPUs. So a tuned library is named and stamped with ``cpu_id()``, and the shim
loads it only on a CPU with the same id (shim/src/pv_load.c computes it the
same way, and tests/test_native.py checks that both agree).

The id hashes the lines of the first processor in /proc/cpuinfo that say what
the CPU can do (vendor, family, model, stepping, feature flags), never the
lines that change while it runs (MHz, bogomips) or between cores (ids). Each
such line counts as ``key=value\\n`` with both sides stripped, in file order;
the hash is 64-bit FNV-1a, with the lowest bit set so that 0 means "unknown".
"""

from __future__ import annotations

CPUINFO = "/proc/cpuinfo"
KEYS = frozenset({
    "vendor_id", "cpu family", "model", "model name", "stepping", "flags",  # x86
    "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "CPU revision", "Features",  # arm
})
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1


def fnv1a(data: bytes, h: int = _FNV_OFFSET) -> int:
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


def cpu_id_of(text: bytes) -> int:
    """The id of the CPU /proc/cpuinfo's ``text`` describes; 0 when it names none of KEYS."""
    h = _FNV_OFFSET
    seen = False
    for raw in text.split(b"\n"):
        line = raw.strip(b" \t\r")
        if not line:
            if seen:
                break  # the end of the first processor's block
            continue
        key, colon, value = line.partition(b":")
        key = key.strip(b" \t")
        if colon and key.decode("latin-1") in KEYS:
            h = fnv1a(key + b"=" + value.strip(b" \t") + b"\n", h)
            seen = True
    return h | 1 if seen else 0


def cpu_id() -> int:
    """This machine's id; 0 when /proc/cpuinfo cannot be read (no tuned library is then used)."""
    try:
        with open(CPUINFO, "rb") as f:
            return cpu_id_of(f.read(1 << 16))
    except OSError:
        return 0
