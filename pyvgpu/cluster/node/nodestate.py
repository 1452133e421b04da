"""The node's shared state on disk, and who owns it: every ownership and mode decision is here.

The node agent (root, in the DaemonSet) owns one state directory, `/run/pyvgpu` by default (tmpfs on most
distributions: the files are mapped and written on every CUDA allocation, and none of it should outlive
a reboot):

    /run/pyvgpu/                         0755 root   the state root
    /run/pyvgpu/turns                    0666 root   the turn file (pyvgpu.group.turnfile): every container with a
                                                     compute share takes turns in it, so all of them write it
    /run/pyvgpu/containers/              0700 root   no host user but root lists or enters it
    /run/pyvgpu/containers/UID_NAME/     0755 root   one per container (pod UID, container name); mounted
                                                     into that container only; its processes cannot create,
                                                     rename or remove files in it (unless they run as root)
    /run/pyvgpu/containers/UID_NAME/vgpu.region      the container's region (pyvgpu.group.region), created by the
                                                     device plugin's Allocate with the container's limits
    /run/pyvgpu/containers/UID_NAME.json  0600 root  what Allocate gave the container (pod, GPUs), in no
                                                     mount: the exporter's labels (pyvgpu.cluster.node.records)

The region file must be writable by the container's processes (they account their allocations in it),
and the device plugin does not always know which uid they run as:

* the pod or container names `securityContext.runAsUser`: the file belongs to that uid (and
  `runAsGroup`, if given), mode 0600, and its header records that uid as its owner (pyvgpu.group.region checks
  that the two agree);
* otherwise the image decides the uid: the file stays root's, mode 0666. No other tenant can reach it:
  its directory is mounted into this container only, and on the host the 0700 `containers/` directory
  keeps everyone but root out.

Either way a process inside the container can change its own region (its limits too): enforcement in
the process's own address space cannot defend against the process itself. What this layout does is keep
every other tenant out of it.

pyvgpu refuses a region or turn file that another user owns or every user can write (pyvgpu.native.safefile),
unless PYVGPU_TRUST_SHARED=1. Here the directory layout, not the file mode, keeps other tenants out, so
Allocate sets that opt-in in every container's environment (docs/security.md, "Kubernetes"): the turn
file is root's 0666 for every container, and a region is root's 0666 when the container's uid is not
known. The node agent, which made these files, trusts them the same way when it checks them.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from pyvgpu.contract import layout as L
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import region
from pyvgpu.native import safefile

DEFAULT_ROOT = Path("/run/pyvgpu")
TURNS = "turns"
CONTAINERS = "containers"
REGION_FILE = "vgpu.region"

MODE_ROOT = 0o755
MODE_CONTAINERS = 0o700
MODE_CONTAINER_DIR = 0o755
MODE_REGION_OWNED = 0o600  # the container's uid is known and owns the file
MODE_REGION_SHARED = 0o666  # the uid is not known: root owns the file, the directory keeps others out
MODE_TURNS = 0o666
TRUST_ENV = {safefile.TRUST_ENV: "1"}  # what every container's environment gets (see the docstring)
RECLAIM_MARGIN_S = 2.0  # file times come from a coarse clock: a directory this much older is surely older

_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # a container name is a DNS label


@dataclass(frozen=True)
class Owner:
    """Who the container's processes run as, when the pod says so."""

    uid: int | None = None
    gid: int | None = None


def owner_of(pod: dict, container: str) -> Owner:
    """runAsUser / runAsGroup of the container, else of the pod; None where neither says."""
    spec = pod.get("spec") or {}
    ctr = next((c for part in ("initContainers", "containers") for c in spec.get(part) or []
                if c.get("name") == container), {})
    csc, psc = ctr.get("securityContext") or {}, spec.get("securityContext") or {}

    def pick(key: str) -> int | None:
        v = csc.get(key, psc.get(key))
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    return Owner(pick("runAsUser"), pick("runAsGroup"))


def _chmod_dir(path: Path, mode: int) -> None:
    path.mkdir(mode=mode, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise PyvgpuError(f"{path} should be a directory (pyvgpu's node state) but is not; remove it")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    if os.geteuid() == 0 and st.st_uid != 0:
        os.chown(path, 0, 0)


def region_name(pod_uid: str, container: str) -> str:
    """The group name a container's region is made with."""
    return f"{pod_uid[:8]}_{container}"[: L.GROUP_NAME_BYTES - 1]


@dataclass(frozen=True)
class NodeState:
    root: Path = DEFAULT_ROOT

    @property
    def turn_path(self) -> Path:
        return self.root / TURNS

    @property
    def containers(self) -> Path:
        return self.root / CONTAINERS

    def ensure(self) -> None:
        """Create (or repair the modes of) the state root, the containers directory and the turn file."""
        from pyvgpu.group import turnfile as sched

        try:
            self.root.mkdir(parents=True, exist_ok=True)
            _chmod_dir(self.root, MODE_ROOT)
            _chmod_dir(self.containers, MODE_CONTAINERS)
            # created if missing, checked otherwise; root's 0666 by design (the module's docstring), so trusted
            sched.node_file(self.turn_path, MODE_TURNS)
        except PermissionError as e:
            raise PyvgpuError(f"the node state directory {self.root}: {e.strerror} ({e.filename}); run the node "
                              "agent as root, or give --state-dir a directory it owns") from None

    def container_dir(self, pod_uid: str, container: str) -> Path:
        if not _UID.match(pod_uid or ""):
            raise PyvgpuError(f"pod UID {pod_uid!r} is not a UID (letters, digits and '-')")
        if not _NAME.match(container or ""):
            raise PyvgpuError(f"container name {container!r} is not a DNS label")
        return self.containers / f"{pod_uid}_{container}"

    def create_region(self, pod_uid: str, container: str, limits: list[int], sm: list[int],
                      owner: Owner = Owner()) -> Path:
        """A fresh directory for one container with its region (limits in bytes and shares in percent per
        device slot). An older directory of the same container is replaced: a new Allocate is a new
        container. Returns the region's path."""
        d = self.container_dir(pod_uid, container)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(mode=MODE_CONTAINER_DIR)
        os.chmod(d, MODE_CONTAINER_DIR)
        final = d / REGION_FILE
        try:
            # made whole, of its owner and mode, before it appears at its path (the group core)
            mode = MODE_REGION_OWNED if owner.uid is not None else MODE_REGION_SHARED
            region.create(final, region.GroupSpec(region_name(pod_uid, container), limits, sm=sm), mode=mode,
                          owner=(owner.uid, owner.gid) if owner.uid is not None else None)
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)
            raise
        return final

    def remove_container(self, pod_uid: str, container: str) -> None:
        from pyvgpu.cluster.node import records

        d = self.container_dir(pod_uid, container)
        shutil.rmtree(d, ignore_errors=True)
        records.remove(d)

    def container_dirs(self) -> list[tuple[str, str, Path]]:
        """(pod UID, container, directory) of every container directory."""
        out = []
        try:
            entries = sorted(self.containers.iterdir())
        except FileNotFoundError:
            return []
        for p in entries:
            uid, sep, name = p.name.partition("_")
            if sep and p.is_dir() and not p.is_symlink():
                out.append((uid, name, p))
        return out

    def reclaim(self, keep_uids: set[str], listed_at: float) -> list[Path]:
        """Remove the directories of pods not in `keep_uids` made before `listed_at` (the time the pod list
        was read: a directory made after it may belong to a pod the list did not see yet), with a margin
        for the coarse clock of file times."""
        from pyvgpu.cluster.node import records

        removed = []
        listed_at -= RECLAIM_MARGIN_S
        for uid, _, p in self.container_dirs():
            if uid in keep_uids:
                continue
            try:
                if p.stat().st_mtime >= listed_at:
                    continue
            except FileNotFoundError:
                continue
            shutil.rmtree(p, ignore_errors=True)
            records.remove(p)
            removed.append(p)
        # a record whose directory is gone (Allocate was stopped between the two)
        try:
            orphans = [r for r in self.containers.glob("*" + records.SUFFIX) if not r.with_suffix("").exists()]
        except OSError:
            orphans = []
        for r in orphans:
            uid = r.name.partition("_")[0]
            try:
                if uid not in keep_uids and r.lstat().st_mtime < listed_at:
                    r.unlink()
            except FileNotFoundError:
                pass
        return removed
