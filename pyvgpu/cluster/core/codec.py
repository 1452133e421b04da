"""Annotation encodings, exactly HAMi's, decoded strictly: every error names the annotation and the field.

* Node registration (hami.io/node-nvidia-register): a JSON list of {"id", "index", "count", "devmem",
  "devcore", "type", "numa", "mode", "health"}. HAMi writes it with Go's encoding/json and `omitempty`
  on every field (pkg/device/devices.go DeviceInfo), so a zero index or numa, an empty mode and a false
  health are left out: a missing field reads as its zero value, and a missing "health" means unhealthy.
  Go matches keys case-insensitively and ignores unknown ones; so does this decoder. Before HAMi
  switched to JSON (pkg/device/devices.go DecodeNodeDevices) nodes wrote
  `id,count,devmem,devcore,type,numa,health[,index,mode]:` per device; that form is read too.
  A GPU in HAMi v2.10's dynamic MIG mode lists `migProfiles`: [{"name", "memoryMB", "core", "sliceCount",
  "placements": [{"start", "size"}]}] (pkg/device/devices.go MigProfile, MigPlacement), bounded here.
* MIG reservations (hami.io/vgpu-mig-allocations, HAMi v2.10 pkg/device/nvidia/mig_allocations.go):
  [{"containerIndex", "deviceIndex", "gpuUUID", "profile", "placement": {"start", "size"}}], plus "migUUID",
  "gpuInstanceID", "computeInstanceID" once the device plugin made the instance (all three or none).
* Pair scores (hami.io/node-nvidia-score): [{"uuid": ID, "score": {OTHER_ID: int}}].
* Allocations (hami.io/vgpu-devices-to-allocate, -allocated): `UUID,Type,UsedMem,UsedCores` per device,
  each device followed by `:` and each container by `;` (pkg/device/devices.go EncodeContainerDevices,
  EncodePodSingleDevice). A container without devices is an empty entry, so entries line up with the
  pod's containers (init containers first). The decoder also reads the separator-only form hand-written
  examples use (`A:B;C`): a final `;` (and a final `:` in a container) ends an entry, it does not start one.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.model import (
    ContainerDevice,
    DeviceInfo,
    Geometry,
    MigProfile,
    MigSlice,
    MigTemplate,
    PodDevices,
)

INT32_MAX = 2**31 - 1
# Kubernetes refuses an object whose annotations pass 256 KiB in all: a longer text cannot be a real one.
MAX_ANNOTATION = 262144
_MIG_SUFFIX = re.compile(r"^(?P<uuid>[^\[\]]+)\[(?P<geometry>\d+)-(?P<instance>\d+)\]$")

# --- node registration -----------------------------------------------------------------------------------

_REGISTER_FIELDS = ("id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health", "migtemplate",
                    "migprofiles")


def _int(value: Any, where: str, *, low: int = 0, high: int = INT32_MAX) -> int:
    # bool is an int in Python but not in JSON: Go refuses true for an int field, so do we.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClusterInputError(where, f"expected an integer, got {json.dumps(value)}")
    if not low <= value <= high:
        raise ClusterInputError(where, f"{value} is out of range ({low}..{high})")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ClusterInputError(where, f"expected a string, got {json.dumps(value)}")
    return value


def _fold(obj: dict, where: str, known: tuple[str, ...]) -> dict:
    """Keys matched case-insensitively, as Go's encoding/json does; unknown keys ignored; a key twice is an error."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        lk = k.lower()
        if lk in known:
            if lk in out:
                raise ClusterInputError(f"{where}.{lk}", "given twice (keys are case-insensitive)")
            out[lk] = v
    return out


def _geometries(value: Any, where: str) -> tuple[Geometry, ...]:
    if not isinstance(value, list):
        raise ClusterInputError(where, "expected a list of geometries (lists of MIG templates)")
    out = []
    for gi, geometry in enumerate(value):
        if not isinstance(geometry, list) or not geometry:
            raise ClusterInputError(f"{where}[{gi}]", "expected a non-empty list of MIG templates")
        templates = []
        for ti, t in enumerate(geometry):
            w = f"{where}[{gi}][{ti}]"
            if not isinstance(t, dict):
                raise ClusterInputError(w, "expected an object {name, core, memory, count}")
            t = _fold(t, w, ("name", "core", "memory", "count"))
            if "name" not in t or "memory" not in t or "count" not in t:
                raise ClusterInputError(w, "a MIG template needs name, memory and count")
            templates.append(MigTemplate(_str(t["name"], f"{w}.name"), _int(t.get("core", 0), f"{w}.core"),
                                         _int(t["memory"], f"{w}.memory"), _int(t["count"], f"{w}.count", low=1)))
        out.append(tuple(templates))
    return tuple(out)


# Bounds of what a registration or a pod may make the scheduler hold per MIG GPU (untrusted input; NVML's
# largest GPUs have 8 memory slices and a handful of profiles, with at most 8 placements each).
MAX_MIG_PROFILES = 32
MAX_MIG_PLACEMENTS = 64
MAX_MIG_SLICE = 64  # a placement's start and size, in memory slices
MAX_NAME = 64
MAX_MIG_ALLOCATIONS = 256  # reservations in one pod's annotation
MAX_MIG_ALLOCATIONS_TEXT = 65536  # characters of that annotation


def _name(value: Any, where: str) -> str:
    name = _str(value, where)
    if not name:
        raise ClusterInputError(where, "missing or empty")
    if len(name) > MAX_NAME:
        raise ClusterInputError(where, f"longer than {MAX_NAME} characters")
    return name


def _profiles(value: Any, where: str) -> tuple[MigProfile, ...]:
    if not isinstance(value, list):
        raise ClusterInputError(where, "expected a list of MIG profiles {name, memoryMB, core, sliceCount, "
                                       "placements}: check the node agent")
    if len(value) > MAX_MIG_PROFILES:
        raise ClusterInputError(where, f"{len(value)} MIG profiles, more than {MAX_MIG_PROFILES}: check the node agent")
    out: list[MigProfile] = []
    for pi, p in enumerate(value):
        w = f"{where}[{pi}]"
        if not isinstance(p, dict):
            raise ClusterInputError(w, "expected an object {name, memoryMB, core, sliceCount, placements}")
        p = _fold(p, w, ("name", "memorymb", "core", "slicecount", "placements"))
        name = _name(p.get("name", ""), f"{w}.name")
        if any(o.name == name for o in out):
            raise ClusterInputError(f"{w}.name", f"MIG profile {name!r} is listed twice")
        raw = p.get("placements") or []
        if not isinstance(raw, list):
            raise ClusterInputError(f"{w}.placements", "expected a list of {start, size}")
        if len(raw) > MAX_MIG_PLACEMENTS:
            raise ClusterInputError(f"{w}.placements", f"{len(raw)} placements, more than {MAX_MIG_PLACEMENTS}")
        places = []
        for k, pl in enumerate(raw):
            pw = f"{w}.placements[{k}]"
            if not isinstance(pl, dict):
                raise ClusterInputError(pw, "expected an object {start, size}")
            pl = _fold(pl, pw, ("start", "size"))
            # a placement of size 0 overlaps nothing: it would offer unbounded instances, so it is refused
            places.append((_int(pl.get("start", 0), f"{pw}.start", high=MAX_MIG_SLICE),
                           _int(pl.get("size", 0), f"{pw}.size", low=1, high=MAX_MIG_SLICE)))
        out.append(MigProfile(name, _int(p.get("memorymb", 0), f"{w}.memorymb"), _int(p.get("core", 0), f"{w}.core"),
                              _int(p.get("slicecount", 0), f"{w}.slicecount"), tuple(places)))
    return tuple(out)


def decode_register(text: str, where: str = keys.NODE_REGISTER) -> list[DeviceInfo]:
    """The GPUs a node registers. Raises ClusterInputError naming the device and field."""
    if not isinstance(text, str):
        raise ClusterInputError(where, f"expected a string, got {json.dumps(text)}")
    _bounded(text, where)
    stripped = text.strip()
    if not stripped.startswith(("[", "{")):
        return _decode_register_legacy(stripped, where)
    raw = _loads(stripped, where)
    if not isinstance(raw, list):
        raise ClusterInputError(where, "expected a JSON list of devices")
    devices: list[DeviceInfo] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ClusterInputError(w, "expected an object")
        d = _fold(item, w, _REGISTER_FIELDS)
        dev_id = _str(d.get("id", ""), f"{w}.id")
        if not dev_id:
            raise ClusterInputError(f"{w}.id", "missing or empty: every GPU needs its UUID")
        if dev_id in seen:
            raise ClusterInputError(f"{w}.id", f"{dev_id!r} is registered twice")
        seen.add(dev_id)
        mode = _str(d.get("mode", ""), f"{w}.mode") or keys.HAMI_CORE
        if mode not in keys.MODES:
            raise ClusterInputError(f"{w}.mode", f"{mode!r} is not one of {', '.join(keys.MODES)}")
        health = d.get("health", False)
        if not isinstance(health, bool):
            raise ClusterInputError(f"{w}.health", f"expected true or false, got {json.dumps(health)}")
        geometries = _geometries(d["migtemplate"], f"{w}.migtemplate") if d.get("migtemplate") else ()
        devices.append(DeviceInfo(
            id=dev_id,
            index=_int(d.get("index", 0), f"{w}.index"),
            count=_int(d.get("count", 0), f"{w}.count"),
            devmem=_int(d.get("devmem", 0), f"{w}.devmem"),
            devcore=_int(d.get("devcore", 0), f"{w}.devcore"),
            type=_str(d.get("type", ""), f"{w}.type"),
            numa=_int(d.get("numa", 0), f"{w}.numa", low=-1),
            mode=mode,
            health=health,
            mig_geometries=geometries,
            # HAMi v2.10's dynamic MIG profiles (JSON null, like a missing field, is none)
            mig_profiles=_profiles(d["migprofiles"], f"{w}.migprofiles") if d.get("migprofiles") is not None else (),
        ))
    return devices


def _loads(text: str, where: str) -> Any:
    """json.loads, every way it fails on text a pod or node creator wrote mapped to ClusterInputError: beside
    malformed JSON, nesting deeper than the interpreter's recursion limit (RecursionError) and an integer of
    more digits than int() converts (ValueError)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterInputError(where, f"not valid JSON ({e.msg} at character {e.pos})") from None
    except RecursionError:
        raise ClusterInputError(where, "JSON nested too deep to read: write a flat list of objects") from None
    except ValueError:
        raise ClusterInputError(where, "a JSON number too long to read (more digits than any count or "
                                       "size has): write it in at most a few digits") from None


def _bounded(text: str, where: str, limit: int = MAX_ANNOTATION) -> None:
    if len(text) > limit:
        raise ClusterInputError(where, f"longer than {limit} characters: not an annotation the API server keeps")


def _decode_register_legacy(text: str, where: str) -> list[DeviceInfo]:
    # id,count,devmem,devcore,type,numa,health[,index,mode] followed by ':' per device.
    if keys.DEVICE_SEP not in text:
        raise ClusterInputError(where, "neither a JSON list nor HAMi's older 'id,count,devmem,...:' form")
    devices = []
    for i, entry in enumerate(e for e in text.split(keys.DEVICE_SEP) if e):
        w = f"{where}[{i}]"
        f = entry.split(",")
        if len(f) not in (7, 9):
            raise ClusterInputError(w, f"expected 7 or 9 comma-separated fields, got {len(f)} in {entry!r}")
        names = ("count", "devmem", "devcore", "numa")
        nums = {}
        for name, s in zip(names, (f[1], f[2], f[3], f[5]), strict=True):
            try:
                nums[name] = _int(int(s), f"{w}.{name}", low=-1 if name == "numa" else 0)
            except ValueError:
                raise ClusterInputError(f"{w}.{name}", f"{s!r} is not an integer") from None
        if f[6].lower() not in ("true", "false", "1", "0", "t", "f"):
            raise ClusterInputError(f"{w}.health", f"{f[6]!r} is not a boolean")
        index, mode = 0, keys.HAMI_CORE
        if len(f) == 9:
            try:
                index = _int(int(f[7]), f"{w}.index")
            except ValueError:
                raise ClusterInputError(f"{w}.index", f"{f[7]!r} is not an integer") from None
            mode = f[8] or keys.HAMI_CORE
            if mode not in keys.MODES:
                raise ClusterInputError(f"{w}.mode", f"{mode!r} is not one of {', '.join(keys.MODES)}")
        if not f[0]:
            raise ClusterInputError(f"{w}.id", "empty: every GPU needs its UUID")
        devices.append(DeviceInfo(f[0], index, nums["count"], nums["devmem"], nums["devcore"], f[4], nums["numa"],
                                  mode, f[6].lower() in ("true", "1", "t")))
    return devices


def encode_register(devices: list[DeviceInfo]) -> str:
    """The JSON a node agent writes. Every field is written (HAMi leaves zero values out; both decode alike)."""
    out = []
    for d in devices:
        item: dict[str, Any] = {"id": d.id, "index": d.index, "count": d.count, "devmem": d.devmem,
                                "devcore": d.devcore, "type": d.type, "numa": d.numa, "mode": d.mode,
                                "health": d.health}
        if d.mig_geometries:
            item["migtemplate"] = [[{"name": t.name, "core": t.core, "memory": t.memory, "count": t.count}
                                    for t in g] for g in d.mig_geometries]
        if d.mig_profiles:
            item["migProfiles"] = [{"name": p.name, "memoryMB": p.memory, "core": p.core, "sliceCount": p.slices,
                                    "placements": [{"start": a, "size": b} for a, b in p.placements]}
                                   for p in d.mig_profiles]
        out.append(item)
    return json.dumps(out, separators=(",", ":"))


# --- pair scores -----------------------------------------------------------------------------------------


def decode_pair_scores(text: str, where: str = keys.NODE_PAIR_SCORE) -> dict[str, dict[str, int]]:
    """{uuid: {other_uuid: link score}} from the node's pair-score annotation."""
    if isinstance(text, str):
        _bounded(text, where)
    raw = _loads(text, where) if isinstance(text, str) else None
    if raw is None:  # JSON null: HAMi decodes it to no scores
        return {}
    if not isinstance(raw, list):
        raise ClusterInputError(where, 'expected a JSON list of {"uuid", "score"} objects')
    out: dict[str, dict[str, int]] = {}
    for i, item in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ClusterInputError(w, "expected an object")
        item = _fold(item, w, ("uuid", "score"))
        uuid = _str(item.get("uuid", ""), f"{w}.uuid")
        if not uuid:
            raise ClusterInputError(f"{w}.uuid", "missing or empty")
        scores = item.get("score") or {}
        if not isinstance(scores, dict):
            raise ClusterInputError(f"{w}.score", "expected an object {uuid: int}")
        # Go's int is 64-bit here (map[string]int).
        out[uuid] = {k: _int(v, f"{w}.score.{k}", low=-(2**63), high=2**63 - 1) for k, v in scores.items()}
    return out


def encode_pair_scores(scores: dict[str, dict[str, int]]) -> str:
    return json.dumps([{"uuid": u, "score": s} for u, s in scores.items()], separators=(",", ":"))


# --- allocations -----------------------------------------------------------------------------------------


def encode_container_devices(devices: tuple[ContainerDevice, ...] | list[ContainerDevice]) -> str:
    return "".join(f"{d.uuid},{d.type},{d.usedmem},{d.usedcores}{keys.DEVICE_SEP}" for d in devices)


def encode_pod_devices(pd: PodDevices) -> str:
    """`GPU-x,NVIDIA,8192,30:;` for one container with one GPU; a container without GPUs adds a bare `;`."""
    return "".join(encode_container_devices(c) + keys.CONTAINER_SEP for c in pd)


def decode_container_devices(text: str, where: str) -> tuple[ContainerDevice, ...]:
    if not text:
        return ()
    body = text[:-1] if text.endswith(keys.DEVICE_SEP) else text
    out = []
    for i, entry in enumerate(body.split(keys.DEVICE_SEP)):
        w = f"{where} device {i}"
        fields = entry.split(",")
        if len(fields) != 4:
            raise ClusterInputError(w, f"expected UUID,Type,UsedMem,UsedCores, got {entry!r}")
        uuid, typ, mem, cores = fields
        if not uuid:
            raise ClusterInputError(f"{w} UUID", f"empty in {entry!r}")
        if not typ:
            raise ClusterInputError(f"{w} Type", f"empty in {entry!r}")
        if uuid.count("[") or uuid.count("]"):
            split_mig_uuid(uuid, f"{w} UUID")  # validates the [geometry-instance] suffix
        out.append(ContainerDevice(uuid, typ, _decimal(mem, f"{w} UsedMem"), _decimal(cores, f"{w} UsedCores")))
    return tuple(out)


def _decimal(s: str, where: str) -> int:
    # Go's strconv.ParseInt(s, 10, 32): an optional sign and digits, nothing else. Usage is never negative.
    if not s.isascii() or not s.isdigit():
        raise ClusterInputError(where, f"{s!r} is not a non-negative integer")
    v = int(s)
    if v > INT32_MAX:
        raise ClusterInputError(where, f"{v} is out of range (0..{INT32_MAX})")
    return v


def decode_pod_devices(text: str, where: str = keys.POD_ALLOCATED) -> PodDevices:
    """Per container (init containers first), the GPUs it was given. Strict: errors name container and device."""
    if not isinstance(text, str):
        raise ClusterInputError(where, f"expected a string, got {json.dumps(text)}")
    if not text:
        return ()
    _bounded(text, where)
    body = text[:-1] if text.endswith(keys.CONTAINER_SEP) else text
    return tuple(decode_container_devices(c, f"{where}: container {i}")
                 for i, c in enumerate(body.split(keys.CONTAINER_SEP)))


def split_mig_uuid(uuid: str, where: str = "UUID") -> tuple[str, int | None, int | None]:
    """`GPU-x[1-3]` -> ("GPU-x", 1, 3): a MIG instance (geometry 1, instance 3); a plain UUID -> (uuid, None, None).

    The suffix is HAMi's (pkg/device/nvidia/device.go AddResourceUsage, pkg/device/devices.go
    ExtractMigTemplatesFromUUID).
    """
    if "[" not in uuid and "]" not in uuid:
        return uuid, None, None
    m = _MIG_SUFFIX.match(uuid)
    if not m:
        raise ClusterInputError(where, f"{uuid!r}: a MIG entry is UUID[geometry-instance], e.g. GPU-x[0-3]")
    return m["uuid"], int(m["geometry"]), int(m["instance"])


# --- MIG reservations ------------------------------------------------------------------------------------

MigAllocation = tuple[int, int, str, MigSlice]  # (container index, device index, GPU UUID, the instance)


def decode_mig_allocations(text: object, where: str = keys.POD_MIG_ALLOCATIONS) -> tuple[MigAllocation, ...]:
    """A pod's MIG reservations, checked as HAMi's DecodeMigAllocations checks them (every field there, the
    runtime identity whole or absent, one reservation per container and device), and bounded."""
    if not isinstance(text, str):
        raise ClusterInputError(where, f"expected a string, got {json.dumps(text)}")
    if not text:
        return ()
    _bounded(text, where, MAX_MIG_ALLOCATIONS_TEXT)
    raw = _loads(text, where)
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ClusterInputError(where, "expected a JSON list of MIG reservations")
    if len(raw) > MAX_MIG_ALLOCATIONS:
        raise ClusterInputError(where, f"{len(raw)} reservations, more than {MAX_MIG_ALLOCATIONS}")
    out: list[MigAllocation] = []
    seen: set[tuple[int, int]] = set()
    for i, item in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ClusterInputError(w, "expected an object")
        a = _fold(item, w, ("containerindex", "deviceindex", "gpuuuid", "profile", "placement", "miguuid",
                            "gpuinstanceid", "computeinstanceid"))
        c = _int(a.get("containerindex", 0), f"{w}.containerIndex", low=-INT32_MAX)
        dv = _int(a.get("deviceindex", 0), f"{w}.deviceIndex", low=-INT32_MAX)
        uuid, profile = _str(a.get("gpuuuid", ""), f"{w}.gpuUUID"), _str(a.get("profile", ""), f"{w}.profile")
        pl = a.get("placement") or {}
        if not isinstance(pl, dict):
            raise ClusterInputError(f"{w}.placement", "expected an object {start, size}")
        pl = _fold(pl, f"{w}.placement", ("start", "size"))
        start = _int(pl.get("start", 0), f"{w}.placement.start", high=2**32 - 1)
        size = _int(pl.get("size", 0), f"{w}.placement.size", high=2**32 - 1)
        if c < 0 or dv < 0 or not uuid or not profile or size == 0:
            raise ClusterInputError(w, "incomplete: a reservation needs containerIndex, deviceIndex, gpuUUID, "
                                       "profile and a placement of size 1 or more")
        if len(uuid) > 256 or len(profile) > MAX_NAME:
            raise ClusterInputError(w, "gpuUUID or profile is too long")
        runtime = [a.get("miguuid") not in (None, ""), a.get("gpuinstanceid") is not None,
                   a.get("computeinstanceid") is not None]
        if any(runtime) and not all(runtime):
            raise ClusterInputError(w, "partial runtime identity: migUUID, gpuInstanceID and computeInstanceID "
                                       "come together or not at all")
        if all(runtime):
            _str(a["miguuid"], f"{w}.migUUID")
            _int(a["gpuinstanceid"], f"{w}.gpuInstanceID", high=2**32 - 1)
            _int(a["computeinstanceid"], f"{w}.computeInstanceID", high=2**32 - 1)
        if (c, dv) in seen:
            raise ClusterInputError(w, f"container {c} device {dv} twice")
        seen.add((c, dv))
        out.append((c, dv, uuid, MigSlice(profile, start, size)))
    return tuple(out)


def encode_mig_allocations(pd: PodDevices) -> str | None:
    """The reservations of a pod's dynamic-MIG entries (ContainerDevice.mig), None when it has none."""
    out = [{"containerIndex": ci, "deviceIndex": di, "gpuUUID": d.uuid, "profile": d.mig.profile,
            "placement": {"start": d.mig.start, "size": d.mig.size}}
           for ci, ctr in enumerate(pd) for di, d in enumerate(ctr) if d.mig is not None]
    return json.dumps(out, separators=(",", ":")) if out else None
