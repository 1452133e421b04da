"""The ctypes binding of libpyvgpu_group.so: the group core in C, which the shim is built from too.

The limits grammar (sizes, shares, device indices, priorities, switches, ``--memory``/``--sm`` specs), the
environment contract's values (HAMi's variables and PYVGPU_*), the checks on files other users may touch,
and opening and checking a region or the turn file are done there, once, for the shim inside a program
and for `pyvgpu wrap`, `status`, `limits set`, the exporter and the node agent here: one implementation,
one message. This module loads the library and binds the grammar and the environment's values;
pyvgpu/native/groupfiles.py binds its files, regions and turn file. Both only convert arguments and turn a
refusal into a PyvgpuError; the library
has none of the shim's interposition or start-up work, so loading it costs a CLI process a dlopen.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

from pyvgpu.errors import PyvgpuError

TYPE_CHECKING = False  # not `typing`'s: a plain wrap imports this module, and paths are text on its way
if TYPE_CHECKING:
    from pathlib import Path

FILE_NAME = "libpyvgpu_group.so"
ABI = 2  # pv_group_api.c pyvgpu_g_abi
ERR_BYTES = 2048
MAX_DEVICES = 16

# pv_shim.h PV_SET_*
POLICY, BATCH_NS, TURNS, CLOCK, TRUST_SHARED, PRIORITY, SM_BORROW, MIN_MEMORY, GROUP_IDLE_NS = range(9)




_lib: ctypes.CDLL | None = None
_P = ctypes.POINTER
_TEXT = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p]  # text, its length, where
_ERR = [ctypes.c_char_p, ctypes.c_size_t]
_SIGNATURES = {
    "pyvgpu_g_check_ascii": [*_TEXT, ctypes.c_char_p, ctypes.c_char_p, *_ERR],
    "pyvgpu_g_repr": [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t],
    "pyvgpu_g_size": [*_TEXT, _P(ctypes.c_uint64), *_ERR],
    "pyvgpu_g_cap": [*_TEXT, ctypes.c_uint64, _P(ctypes.c_uint64), *_ERR],
    "pyvgpu_g_percent": [*_TEXT, _P(ctypes.c_uint32), *_ERR],
    "pyvgpu_g_device": [*_TEXT, _P(ctypes.c_int), *_ERR],
    "pyvgpu_g_priority": [*_TEXT, _P(ctypes.c_int), *_ERR],
    "pyvgpu_g_switch": [*_TEXT, _P(ctypes.c_int), *_ERR],
    "pyvgpu_g_spec": [*_TEXT, ctypes.c_int, ctypes.c_uint64, _P(ctypes.c_int64), _P(ctypes.c_uint64),
                      _P(ctypes.c_uint32), *_ERR],
    "pyvgpu_g_env_setting": [_P(ctypes.c_char_p), ctypes.c_int, _P(ctypes.c_int64), *_ERR],
    "pyvgpu_g_env_devices": [_P(ctypes.c_char_p), ctypes.c_int, _P(ctypes.c_int64), _P(ctypes.c_uint64),
                             _P(ctypes.c_uint32), *_ERR],
    "pyvgpu_g_env_region": [_P(ctypes.c_char_p), ctypes.c_char_p, ctypes.c_size_t],
    "pyvgpu_g_read_env": [_P(ctypes.c_char_p), _P(ctypes.c_uint64), _P(ctypes.c_uint32), _P(ctypes.c_int32),
                          _P(ctypes.c_uint64), *_ERR],
    "pyvgpu_g_private_dir": [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, *_ERR],
    "pyvgpu_g_runtime_dir": [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, *_ERR],
    "pyvgpu_g_open_shared": [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                             ctypes.c_int, *_ERR, _P(ctypes.c_int)],
    "pyvgpu_g_use_turns": [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, *_ERR, _P(ctypes.c_int)],
    "pyvgpu_g_read_turns": [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, *_ERR, _P(ctypes.c_int)],
    "pyvgpu_g_node_turns": [ctypes.c_char_p, ctypes.c_uint, *_ERR],
    "pyvgpu_g_setup_turns": [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_int, *_ERR],
    "pyvgpu_g_view_region": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, _P(ctypes.c_void_p), *_ERR,
                             _P(ctypes.c_int)],
    "pyvgpu_g_unmap": [ctypes.c_void_p, ctypes.c_uint64],
    "pyvgpu_g_watch_region": [ctypes.c_char_p, *_ERR],
    "pyvgpu_g_slots_locked": [ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32],
    "pyvgpu_g_gc_private": [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int],
    "pyvgpu_g_check_devices": [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint32, _P(ctypes.c_uint32), ctypes.c_char_p,
                               ctypes.c_char_p, *_ERR],
    "pyvgpu_g_check_setting": [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_char_p, *_ERR],
    "pyvgpu_g_check_bounds": [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint32, _P(ctypes.c_uint64), *_ERR],
    "pyvgpu_g_check_change": [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, _P(ctypes.c_uint64),
                              ctypes.c_uint32, ctypes.c_uint32, _P(ctypes.c_uint64), ctypes.c_char_p, *_ERR],
    "pyvgpu_g_set_device_limit": [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_uint64, _P(ctypes.c_uint64),
                                  _P(ctypes.c_uint64), *_ERR],
    "pyvgpu_g_set_setting": [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, _P(ctypes.c_uint32), *_ERR],
    "pyvgpu_g_machine_turns_problem": [ctypes.c_char_p, ctypes.c_int, *_ERR],
    "pyvgpu_g_check_limits": [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, _P(ctypes.c_uint64), ctypes.c_char_p,
                              *_ERR],
    "pyvgpu_g_map_shared": [ctypes.c_int, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, *_ERR],
    "pyvgpu_g_turn_path": [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                           _P(ctypes.c_int),
                           ctypes.c_char_p, ctypes.c_size_t, *_ERR],
    "pyvgpu_g_make_region": [ctypes.c_char_p, ctypes.c_void_p, _P(ctypes.c_uint64), _P(ctypes.c_uint32),
                             ctypes.c_uint, ctypes.c_int64, ctypes.c_int64, *_ERR],
}


def path() -> str:
    """The group library of this installation, beside the shim."""
    from pyvgpu.native import shim

    return os.path.join(shim.PACKAGE, FILE_NAME)


def lib() -> ctypes.CDLL:
    """The loaded library (once per process)."""
    global _lib
    if _lib is None:
        p = path()
        try:
            loaded = ctypes.CDLL(p, use_errno=True)
        except OSError as e:
            from pyvgpu.native import shim

            raise PyvgpuError(f"cannot load {p} ({e}); {shim.missing_fix()}") from None
        if loaded.pyvgpu_g_abi() != ABI:
            raise PyvgpuError(f"{p} is from another pyvgpu (interface {loaded.pyvgpu_g_abi()}, not {ABI}); "
                              "reinstall pyvgpu")
        for name, args in _SIGNATURES.items():
            getattr(loaded, name).argtypes = args
        loaded.pyvgpu_g_map_shared.restype = ctypes.c_uint64
        loaded.pyvgpu_g_env_region.restype = ctypes.c_size_t
        loaded.pyvgpu_g_unmap.restype = None
        loaded.pyvgpu_g_watch_region.restype = ctypes.c_uint64
        _lib = loaded
    return _lib


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


_CODE_POINT = r"\(U\+([0-9A-F]{4,6})\)"  # compiled at its first use (an error's)


def _named(message: str) -> str:
    """C shows a character outside ASCII by its code point; add its Unicode name, which C has no table of."""
    import re  # here: an error's message only, and a plain wrap imports this module
    import unicodedata

    def name(m: re.Match) -> str:
        return f"({unicodedata.name(chr(int(m.group(1), 16)), 'unnamed character')}, U+{m.group(1)})"

    return re.sub(_CODE_POINT, name, message, count=1)


def _call(fn: str, *args) -> None:
    err = ctypes.create_string_buffer(ERR_BYTES)
    if getattr(lib(), fn)(*args, err, ERR_BYTES):
        raise PyvgpuError(_named(err.value.decode("utf-8", "replace")))


def _text(text: str, where: str) -> tuple[bytes, int, bytes]:
    b = _b(text or "")
    return b, len(b), _b(where)


def check_ascii(text: str, where: str, what: str, example: str) -> None:
    _call("pyvgpu_g_check_ascii", *_text(text, where), _b(what), _b(example))


def size(text: str, where: str) -> int:
    out = ctypes.c_uint64()
    _call("pyvgpu_g_size", *_text(text, where), ctypes.byref(out))
    return out.value


def cap(text: str, where: str, floor: int) -> int:
    out = ctypes.c_uint64()
    _call("pyvgpu_g_cap", *_text(text, where), floor, ctypes.byref(out))
    return out.value


def percent(text: str, where: str) -> int:
    out = ctypes.c_uint32()
    _call("pyvgpu_g_percent", *_text(text, where), ctypes.byref(out))
    return out.value


def _int(fn: str, text: str, where: str) -> int:
    out = ctypes.c_int()
    _call(fn, *_text(text, where), ctypes.byref(out))
    return out.value


def device(text: str, where: str) -> int:
    return _int("pyvgpu_g_device", text, where)


def priority(text: str, where: str) -> int:
    return _int("pyvgpu_g_priority", text, where)


def switch(text: str, where: str) -> bool:
    return bool(_int("pyvgpu_g_switch", text, where))


def _devices(dflt: ctypes.c_int64, per, mask: ctypes.c_uint32) -> tuple[int | None, dict[int, int]]:
    return (None if dflt.value < 0 else dflt.value), {d: per[d] for d in range(MAX_DEVICES) if mask.value >> d & 1}


def spec(text: str, where: str, shares: bool, floor: int = 0, none: bool = False) -> tuple[int | None, dict[int, int]]:
    """``--memory``/``--sm``: (the value for every device or None, {device: value}); with ``none``, none/off/0
    is (0, {}): no limit on any device."""
    dflt, per, mask = ctypes.c_int64(), (ctypes.c_uint64 * MAX_DEVICES)(), ctypes.c_uint32()
    kind = int(shares) | (2 if none else 0)  # pv_shim.h PV_SPEC_NONE
    _call("pyvgpu_g_spec", *_text(text, where), kind, floor, ctypes.byref(dflt), per, ctypes.byref(mask))
    return _devices(dflt, per, mask)


def envp(env: Mapping[str, str]) -> ctypes.Array:
    """An environment as C's char *envp[]."""
    items = [_b(f"{k}={v}") for k, v in env.items()]
    return (ctypes.c_char_p * (len(items) + 1))(*items, None)


def _only(env: Mapping[str, str], names: tuple[str, ...], prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """The variables of ``env`` a reader looks at (the rest need not be copied into C)."""
    return {k: v for k, v in env.items() if k in names or k.startswith(prefixes)} if prefixes else \
        {k: env[k] for k in names if k in env}


def _setting_var(which: int) -> str:
    from pyvgpu.contract import envspec

    return (envspec.GPU_CORE_UTILIZATION_POLICY, envspec.SM_BATCH_MS, envspec.SM_TURN, envspec.CLOCK,
            envspec.TRUST_SHARED, envspec.CUDA_TASK_PRIORITY, envspec.SM_BORROW, envspec.MIN_MEMORY,
            envspec.GROUP_IDLE_HOURS)[which].name


def env_setting(env: Mapping[str, str], which: int) -> int:
    """One setting (POLICY, BATCH_NS, ...) as the shim reads it from ``env``; -1 for an unset priority or switch."""
    out = ctypes.c_int64()
    _call("pyvgpu_g_env_setting", envp(_only(env, (_setting_var(which),))), which, ctypes.byref(out))
    return out.value


def env_devices(env: Mapping[str, str], shares: bool) -> tuple[int | None, dict[int, int]]:
    """CUDA_DEVICE_MEMORY_LIMIT[_i] (or CUDA_DEVICE_SM_LIMIT[_i] with shares): (every device's, {device: value})."""
    from pyvgpu.contract import envspec

    base = (envspec.CUDA_DEVICE_SM_LIMIT if shares else envspec.CUDA_DEVICE_MEMORY_LIMIT).name
    mine = _only(env, (base, envspec.MIN_MEMORY.name), (base + "_",))
    dflt, per, mask = ctypes.c_int64(), (ctypes.c_uint64 * MAX_DEVICES)(), ctypes.c_uint32()
    _call("pyvgpu_g_env_devices", envp(mine), int(shares), ctypes.byref(dflt), per, ctypes.byref(mask))
    return _devices(dflt, per, mask)


def env_region(env: Mapping[str, str]) -> Path | None:
    """The group's region an environment names (PYVGPU_REGION, else CUDA_DEVICE_MEMORY_SHARED_CACHE), or None."""
    out = ctypes.create_string_buffer(8192)
    size = lib().pyvgpu_g_env_region(envp(env), out, len(out))
    if size >= len(out):
        raise PyvgpuError(f"the region path in the environment is {size} bytes; give one shorter than {len(out)}")
    if not size:
        return None
    from pathlib import Path  # here: a plain wrap never asks

    return Path(out.raw[:size].decode("utf-8", "surrogateescape"))


def read_env(env: Mapping[str, str]) -> dict:
    """Everything the shim reads from ``env`` at its start, as it reads it (for tests and `doctor`)."""
    memory, sm = (ctypes.c_uint64 * MAX_DEVICES)(), (ctypes.c_uint32 * MAX_DEVICES)()
    settings, batch = (ctypes.c_int32 * 6)(), ctypes.c_uint64()
    _call("pyvgpu_g_read_env", envp(env), memory, sm, settings, ctypes.byref(batch))
    policy, turns, trust, prio, borrow, clock = list(settings)
    return {"memory": list(memory), "sm": list(sm), "policy": policy, "turns": bool(turns), "trust_shared":
            bool(trust), "priority": None if prio < 0 else prio, "sm_borrow": None if borrow < 0 else bool(borrow),
            "clock": clock, "batch_ns": batch.value}
