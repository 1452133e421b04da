"""What Allocate gave each container, recorded by the node agent for the exporter's labels.

A container's region is writable by the container (its processes account their allocations in it), so
nothing in it can say which pod or GPU a series belongs to: a container could rewrite its name or device
list and have its usage shown as another pod's. Allocate therefore writes, beside the container's
directory and outside every mount, a record that only the node agent writes:

    /run/pyvgpu/containers/UID_NAME.json    0600, the node agent's (root); containers/ is 0700 root

    {"version": 1, "pod": NAME, "namespace": NS, "pod_uid": UID, "container": NAME, "group": REGION NAME,
     "gpus": [{"uuid": "GPU-...", "index": 0},                       # a whole GPU (index: NVML's, or null)
              {"uuid": "GPU-...", "index": 1, "mig_uuid": "MIG-...", "gpu_instance": 7, "profile": "1g.10gb"}]}

one entry per group device, in the container's CUDA order. A MIG instance is named as dcgm-exporter names it:
its parent GPU's UUID and index, the GPU instance id (GPU_I_ID) and the profile (GPU_I_PROFILE).

The exporter reads a record only if it is a regular file of at most MAX_BYTES, owned by root or by the
exporter's own user, and writable by no one else; anything else is skipped (the container's series then
carry no pod or GPU labels), never trusted.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

from pyvgpu.cluster.node.gpus import GpuInfo
from pyvgpu.errors import PyvgpuError

VERSION = 1
SUFFIX = ".json"
MODE = 0o600
MAX_BYTES = 64 * 1024  # a record names at most a few GPUs: far below this


def path_of(container_dir: Path) -> Path:
    """The record of a container directory (containers/UID_NAME -> containers/UID_NAME.json)."""
    return container_dir.with_name(container_dir.name + SUFFIX)


def gpu_entries(uuids: list[str], inventory: list[GpuInfo]) -> list[dict]:
    """One entry per device UUID (a GPU's or a MIG instance's), from the node's inventory; a UUID the
    inventory lacks keeps its UUID with index null."""
    gpus = {g.uuid: g for g in inventory}
    migs = {m.uuid: (g, m) for g in inventory for m in g.migs}
    out: list[dict] = []
    for u in uuids:
        if u in gpus:
            out.append({"uuid": u, "index": gpus[u].index})
        elif u in migs:
            g, m = migs[u]
            out.append({"uuid": g.uuid, "index": g.index, "mig_uuid": u,
                        "gpu_instance": m.gi if m.gi >= 0 else None, "profile": m.profile})
        else:
            out.append({"uuid": u, "index": None})
    return out


def write(container_dir: Path, *, pod: str, namespace: str, pod_uid: str, container: str, group: str,
          gpus: list[dict]) -> Path:
    """Write the record of a container (atomically: a temporary file renamed into place)."""
    final = path_of(container_dir)
    body = json.dumps({"version": VERSION, "pod": pod, "namespace": namespace, "pod_uid": pod_uid,
                       "container": container, "group": group, "gpus": gpus}, sort_keys=True).encode()
    tmp = final.with_name(f".{final.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, MODE)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)
    try:
        os.rename(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def remove(container_dir: Path) -> None:
    path_of(container_dir).unlink(missing_ok=True)


def read(container_dir: Path) -> dict:
    """The record of a container directory, checked (PyvgpuError saying why it is not trusted or readable)."""
    path = path_of(container_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise PyvgpuError(f"no record {path.name} (Allocate writes one; a container allocated by an older "
                          "pyvgpu has none)") from None
    except OSError as e:
        raise PyvgpuError(f"record {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PyvgpuError(f"record {path} is not a regular file")
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            raise PyvgpuError(f"record {path} is not the node agent's (owner uid {st.st_uid}, mode "
                              f"{stat.S_IMODE(st.st_mode):o}); not trusted")
        if st.st_size > MAX_BYTES:
            raise PyvgpuError(f"record {path} is {st.st_size} bytes, more than a record ({MAX_BYTES})")
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        rec = json.loads(data)
    except ValueError:
        raise PyvgpuError(f"record {path} is not JSON") from None
    if not isinstance(rec, dict) or rec.get("version") != VERSION or not isinstance(rec.get("gpus"), list):
        raise PyvgpuError(f"record {path} is not a version-{VERSION} record")
    return rec
