"""Per-node device configuration in HAMi's device-plugin ConfigMap (issue 30, item 13).

HAMi's device plugin reads `/config/config.json` (its chart mounts the device plugin's ConfigMap there) at
start: `{"nodeconfig": [{"name": NODE, ...}, ...]}`. The entries whose `name` is this node's name are
applied in order, a later one's fields over an earlier one's (HAMi v2.10,
pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go readFromConfigFile; the fields are NodeDefaultConfig,
pkg/device/nvidia/device.go). What pyvgpu reads of an entry:

    devicesplitcount     virtual devices per GPU: the registration's `count` and the device plugin's list
    devicememoryscaling  the registration's `devmem` is int(MiB x this), GPUs in MIG mode excepted
    devicecorescaling    the registration's `devcore` is int(100 x this), GPUs in MIG mode excepted
    filterdevices        {"uuid": [...], "index": [...]}: GPUs neither registered nor offered to the kubelet

Keys are read as Go's encoding/json reads them (any case; unknown keys, and the fields pyvgpu does not use
such as migstrategy or operatingmode, are ignored). Different on purpose: HAMi logs a file it cannot read
and carries on with its defaults; pyvgpu refuses to start, naming the file and the field, since a filter
that is silently dropped registers a GPU the administrator took out. A count, scaling or index that is
not a positive number is refused too (HAMi would register a count of 0).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from pyvgpu.errors import PyvgpuError

DEFAULT_PATH = Path("/config/config.json")  # where HAMi's device plugin reads it; the chart mounts it there
MAX_BYTES = 1 << 20  # a ConfigMap holds at most 1 MiB
MAX_SPLIT = 1000  # the CLI's --split bound


@dataclass(frozen=True)
class NodeConfig:
    """What the node's entries set; None: not set (the command line's value or the default stays)."""

    split: int | None = None
    memory_scaling: float | None = None
    core_scaling: float | None = None
    filter_uuids: frozenset[str] = frozenset()
    filter_indexes: frozenset[int] = frozenset()

    def filtered(self, uuid: str, index: int) -> bool:
        """Whether the GPU is taken out (HAMi's FilterDeviceToRegister: its UUID or its index is listed)."""
        return uuid in self.filter_uuids or index in self.filter_indexes


def _field(obj: dict, name: str):
    """obj[name] as Go's encoding/json finds it: an exact key first, else any key equal ignoring case."""
    if name in obj:
        return obj[name]
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == name:
            return v
    return None


def _positive(value, what: str, where: str, whole: bool) -> float | int:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if ok and whole and not (float(value).is_integer() and value <= MAX_SPLIT):
        ok = False
    if not ok:
        need = f"a whole number 1..{MAX_SPLIT}" if whole else "a positive number"
        raise PyvgpuError(f"{where}: {what} is {value!r}; give {need}, or leave it out")
    return int(value) if whole else float(value)


def parse(text: str, node: str, where: str = "the device plugin config") -> NodeConfig:
    """The settings of `node` in the JSON `text` (HAMi's device-plugin config.json)."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise PyvgpuError(f"{where}: not JSON ({e}); give HAMi's device-plugin config, "
                          '{"nodeconfig": [{"name": "NODE", ...}]}') from None
    if not isinstance(doc, dict):
        raise PyvgpuError(f'{where}: expected a JSON object, {{"nodeconfig": [...]}}')
    entries = _field(doc, "nodeconfig")
    if entries is None:
        return NodeConfig()
    if not isinstance(entries, list):
        raise PyvgpuError(f"{where}: nodeconfig must be a list of entries, one per node")
    got: dict = {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise PyvgpuError(f"{where}: nodeconfig[{i}] must be an object with a name")
        if _field(e, "name") != node:  # an exact match, as HAMi compares NODE_NAME
            continue
        at = f"{where}, nodeconfig[{i}] (node {node})"
        for key, attr, whole in (("devicesplitcount", "split", True), ("devicememoryscaling", "memory_scaling", False),
                                 ("devicecorescaling", "core_scaling", False)):
            value = _field(e, key)
            if value is not None:
                got[attr] = _positive(value, key, at, whole)
        flt = _field(e, "filterdevices")
        if flt is None:
            continue
        if not isinstance(flt, dict):
            raise PyvgpuError(f'{at}: filterdevices must be {{"uuid": [...], "index": [...]}}')
        uuids, indexes = _field(flt, "uuid") or [], _field(flt, "index") or []
        if not isinstance(uuids, list) or not all(isinstance(u, str) for u in uuids):
            raise PyvgpuError(f"{at}: filterdevices.uuid must be a list of GPU UUIDs")
        if not isinstance(indexes, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                    for x in indexes):
            raise PyvgpuError(f"{at}: filterdevices.index must be a list of GPU indexes (0, 1, ...)")
        if uuids or indexes:  # HAMi takes a filter only when it lists something, and then the whole of it
            got["filter_uuids"], got["filter_indexes"] = frozenset(uuids), frozenset(indexes)
    return NodeConfig(**got)


def load(path: Path, node: str) -> NodeConfig:
    """The node's settings in the file at `path`; nothing set when there is no such file (no ConfigMap)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return NodeConfig()
    except OSError as e:
        raise PyvgpuError(f"{path}: cannot read the device plugin config ({e.strerror})") from None
    if len(data) > MAX_BYTES:
        raise PyvgpuError(f"{path}: over {MAX_BYTES} bytes; a ConfigMap holds at most 1 MiB")
    return parse(data.decode("utf-8", errors="replace"), node, str(path))


def registered_memory(memory_mib: int, scaling: float | None) -> int:
    """The MiB a GPU registers (HAMi: int32(float64(MiB) * scaling) when the scaling is not 1)."""
    return memory_mib if scaling is None or scaling == 1 else int(memory_mib * scaling)


def registered_cores(scaling: float | None) -> int:
    """The cores a GPU registers (HAMi: int32(scaling * 100))."""
    return 100 if scaling is None else int(scaling * 100)
