"""The device plugin's Allocate: which pod is being bound, what its next container gets.

The kubelet's Allocate names only virtual device IDs, not the pod. As in HAMi, the pod is found through
the API server: among the pods bound to this node whose `hami.io/bind-phase` is `allocating`, the oldest
bind (`hami.io/bind-time`) whose next container in `hami.io/vgpu-devices-to-allocate` asks as many GPUs as
the kubelet's request. Containers are taken in order (init containers first) and popped from that
annotation (its entry becomes empty), which is what HAMi's device plugin does; when none is left the pod
is marked `hami.io/bind-phase: success`.

Each container gets (HAMi's formats, pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go):

    NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES   the GPUs' UUIDs, in the allocation's order
    CUDA_DEVICE_MEMORY_LIMIT_<i>                   "<MiB>m" for the i-th of them (HAMi writes %vm)
    CUDA_DEVICE_SM_LIMIT                           the first GPU's cores, percent ("0": no limit)
    CUDA_DEVICE_MEMORY_SHARED_CACHE                the region file, in the container's region directory
    PYVGPU_SCHED                                   the node's turn file
    PYVGPU_TRUST_SHARED=1                          the node's files are root's and shared (nodestate.py)
    LD_PRELOAD, PYTHONPATH, PYVGPU_*               the shim and what it needs (pyvgpu.cluster.node.runtime)

and mounts: its region directory (read-write), the turn file (read-write), the runtime (read-only).

MIG: an entry `GPU-x[0-i]` (HAMi's suffix) is position i of the one geometry the node agent registered for
GPU x: the MIG instances that exist, read again from NVML here (gpus.mig_positions). The container gets
that instance's own UUID (MIG-...) in NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES, its memory as the
cap, and no compute share (the instance's SMs are its own; NVML reports no utilization in MIG mode). An
entry for a geometry other than 0 or a position the GPU no longer has (an administrator changed the
instances since the registration) fails the container with a message; pyvgpu never creates or destroys
instances to make it fit, which HAMi's MIG mode may do. A container gets one MIG instance alone: a CUDA
process enumerates a single one.

When the pod's last container is allocated (or its bind fails here), the node lock `hami.io/mutex.lock` is
released if this pod holds it: a HAMi scheduler leaves the lock to the device plugin, as HAMi's plugin
releases it (pyvgpu's scheduler releases its own at the end of its bind, so there is nothing left then).

Failures: the container's region directories are removed, the pod is marked `bind-phase: failed` when
the API server can be told, and the caller gets an AllocateError with a gRPC status code and a message
that says what to do. Nothing is half-allocated: the pod's annotation is changed in one patch, after
every region exists, and only if the pod has not changed since it was read (resourceVersion).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyvgpu.cluster.api import events, nodelock
from pyvgpu.cluster.api.kube import Kube, KubeError, KubeUnreachable
from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.model import ContainerDevice
from pyvgpu.cluster.node import gpus as G
from pyvgpu.cluster.node import nodestate, records
from pyvgpu.cluster.node.runtime import Runtime
from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import limits as lim

REGION_MOUNT = "/run/pyvgpu/region"  # the container's region directory, inside the container
TURNS_MOUNT = "/run/pyvgpu/turns"  # the node's turn file, inside the container
SUCCESS = keys.BIND_SUCCESS
FAILED = keys.BIND_FAILED
log = logging.getLogger("pyvgpu.cluster.node.allocate")


class AllocateError(PyvgpuError):
    """Allocate cannot answer; `code` is the gRPC status code's name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Retry(Exception):
    pass


@dataclass
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass
class ContainerAnswer:
    envs: dict[str, str]
    mounts: list[Mount]
    pod: str = ""  # namespace/name, for logs
    container: str = ""


@dataclass
class AllocateConfig:
    node: str
    state: nodestate.NodeState
    runtime: Runtime
    api_retry_s: float = 10.0  # how long Allocate keeps trying an unreachable API server
    region_mount: str = REGION_MOUNT
    turns_mount: str = TURNS_MOUNT
    extra_env: dict[str, str] = field(default_factory=dict)
    scheduler_names: tuple[str, ...] = ("pyvgpu-scheduler",)  # only their pods' annotations are pyvgpu's


def _bind_time(pod: dict) -> int:
    try:
        return int(pod["metadata"]["annotations"].get(keys.POD_BIND_TIME, "0"))
    except (KeyError, ValueError, TypeError):
        return 0


def _containers(pod: dict) -> list[dict]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def container_env(cfg: AllocateConfig, devs: tuple[ContainerDevice, ...]) -> dict[str, str]:
    """The environment of one container given these GPUs (HAMi's variables and formats)."""
    uuids = ",".join(d.uuid for d in devs)
    env = dict(cfg.runtime.env)
    env.update(cfg.extra_env)
    env[envspec.NVIDIA_VISIBLE_DEVICES.name] = uuids
    env[envspec.CUDA_VISIBLE_DEVICES.name] = uuids
    for i, d in enumerate(devs):
        if d.usedmem > 0:  # 0 MiB would refuse every allocation; HAMi's scheduler never writes it
            env[envspec.CUDA_DEVICE_MEMORY_LIMIT.device(i)] = f"{d.usedmem}m"
    env[envspec.CUDA_DEVICE_SM_LIMIT.name] = str(devs[0].usedcores)
    env[envspec.CUDA_DEVICE_MEMORY_SHARED_CACHE.name] = f"{cfg.region_mount}/{nodestate.REGION_FILE}"
    env[envspec.SCHED.name] = cfg.turns_mount
    env.update(nodestate.TRUST_ENV)  # the node's files are shared by layout, not by mode (nodestate.py)
    return env


class Allocator:
    def __init__(self, cfg: AllocateConfig, kube: Kube, health: Callable[[], dict[str, str | None]],
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 migs: Callable[[], dict[str, list[str]]] = G.mig_positions,
                 inventory: Callable[[], list[G.GpuInfo]] = list) -> None:
        self.cfg = cfg
        self.kube = kube
        self.health = health
        self.migs = migs
        self.inventory = inventory  # the node's GPUs (indexes, MIG instances): the exporter's labels (records)
        self.clock = clock
        self.sleep = sleep

    def allocate(self, requests: list[list[str]]) -> list[ContainerAnswer]:
        """Answer one Allocate call (a list of device-ID lists, one per container)."""
        if not requests or any(not r for r in requests):
            raise AllocateError("INVALID_ARGUMENT", "Allocate asked for a container without devices")
        deadline = self.clock() + self.cfg.api_retry_s
        pause = 0.1
        while True:
            try:
                return self._once(requests)
            except (KubeUnreachable, _Retry) as e:
                left = deadline - self.clock()
                if left <= 0:
                    if isinstance(e, KubeUnreachable):
                        raise AllocateError("UNAVAILABLE", f"{e}; tried for {self.cfg.api_retry_s:g} s. The container "
                                                           "is not started; the kubelet retries it. Check that this "
                                                           "node reaches the API server") from None
                    raise AllocateError("ABORTED", f"the pod being bound kept changing for {self.cfg.api_retry_s:g} "
                                                   "s; the kubelet retries it") from None
                self.sleep(min(pause, left))
                pause = min(pause * 2, 1.0)

    def _find(self, requests: list[list[str]]) -> tuple[dict, list[int]]:
        node = self.cfg.node
        pods = self.kube.list_pods(node=node).get("items") or []
        cands = []
        for p in pods:
            meta = p.get("metadata") or {}
            annos = meta.get("annotations") or {}
            spec = p.get("spec") or {}
            if (annos.get(keys.POD_BIND_PHASE) != keys.BIND_ALLOCATING or annos.get(keys.POD_NODE) != node
                    or spec.get("nodeName") != node
                    or (spec.get("schedulerName") or "default-scheduler") not in self.cfg.scheduler_names
                    or meta.get("deletionTimestamp") or (p.get("status") or {}).get("phase", "Pending") != "Pending"):
                continue  # only a pod one of pyvgpu's schedulers bound here carries annotations pyvgpu wrote
            cands.append(p)
        cands.sort(key=lambda p: (_bind_time(p), p["metadata"].get("creationTimestamp", ""),
                                  p["metadata"].get("namespace", ""), p["metadata"]["name"]))
        want = [len(r) for r in requests]
        for p in cands:
            where = f"pod {p['metadata'].get('namespace', 'default')}/{p['metadata']['name']}"
            try:
                pd = codec.decode_pod_devices(p["metadata"]["annotations"].get(keys.POD_TO_ALLOCATE, ""),
                                              f"{where}: {keys.POD_TO_ALLOCATE}")
            except ClusterInputError as e:
                # one broken pod fails itself, never the node: the kubelet's request may be another pod's
                log.warning("%s; the pod is marked %s: failed and skipped", e, keys.POD_BIND_PHASE)
                self._event(p, "AllocationUnreadable", f"{e}; pyvgpu's device plugin on node {node} skipped this "
                                                       f"pod and marked it {keys.POD_BIND_PHASE}: failed")
                self._fail(p, None)
                continue
            pending = [i for i, c in enumerate(pd) if c]
            if len(pending) >= len(want) and all(len(pd[i]) == n for i, n in zip(pending, want, strict=False)):
                return p, pending[: len(want)]
        asks = " and ".join(f"{n} GPU(s)" for n in want)
        raise AllocateError("FAILED_PRECONDITION",
                            f"no pod on node {node} is being bound ({keys.POD_BIND_PHASE}: allocating, "
                            f"{keys.POD_NODE}: {node}) with a next container asking {asks}: a pod that asks "
                            "GPUs must be scheduled by pyvgpu's scheduler (schedulerName; the webhook sets it), "
                            "whose bind writes those annotations")

    def _once(self, requests: list[list[str]]) -> list[ContainerAnswer]:
        pod, entries = self._find(requests)
        meta = pod["metadata"]
        ns, name, uid = meta.get("namespace", "default"), meta["name"], meta.get("uid", "")
        annos = meta.get("annotations") or {}
        pd = list(codec.decode_pod_devices(annos.get(keys.POD_TO_ALLOCATE, ""), keys.POD_TO_ALLOCATE))
        ctrs = _containers(pod)
        made: list[tuple[str, str]] = []
        answers = []
        try:
            health = self.health()
            inventory = self._inventory()
            if annos.get(keys.POD_MIG_ALLOCATIONS):
                # HAMi v2.10's dynamic MIG: the instance is to be made at this placement. pyvgpu's plugin uses
                # the instances that exist and makes none; giving the whole GPU instead would be wrong.
                raise AllocateError("FAILED_PRECONDITION", f"pod {ns}/{name} holds dynamic MIG reservations "
                                                           f"({keys.POD_MIG_ALLOCATIONS}), which pyvgpu's device "
                                                           "plugin does not make: a node registered with migProfiles "
                                                           "runs HAMi v2.10's device plugin")
            for i in entries:
                devs = pd[i]
                if i >= len(ctrs):
                    raise AllocateError("FAILED_PRECONDITION", f"pod {ns}/{name}: {keys.POD_TO_ALLOCATE} has an entry "
                                                               f"for container {i}, the pod has {len(ctrs)}")
                cname = ctrs[i].get("name", "")
                devs, gpu_ids = self._mig_instances(devs, f"pod {ns}/{name} container {cname}")
                for d in (dataclasses.replace(d, uuid=u) for d, u in zip(devs, gpu_ids, strict=True)):
                    if d.uuid not in health:  # a MIG instance's health is its GPU's
                        raise AllocateError("FAILED_PRECONDITION", f"pod {ns}/{name} container {cname}: GPU {d.uuid} "
                                                                   f"is not on node {self.cfg.node}")
                    if health[d.uuid]:
                        raise AllocateError("FAILED_PRECONDITION", f"pod {ns}/{name} container {cname}: GPU {d.uuid} "
                                                                   f"is unhealthy ({health[d.uuid]})")
                env = container_env(self.cfg, devs)
                mem = lim.memory_from_env(env).as_list()
                sm = lim.sm_from_env(env).as_list()
                try:
                    self.cfg.state.create_region(uid, cname, mem, sm, nodestate.owner_of(pod, cname))
                except (OSError, PyvgpuError) as e:
                    raise AllocateError("INTERNAL", f"pod {ns}/{name} container {cname}: cannot create its region "
                                                    f"under {self.cfg.state.containers}: {e}") from None
                made.append((uid, cname))
                self._record(uid, cname, ns, name, devs, inventory)
                mounts = [Mount(self.cfg.region_mount, str(self.cfg.state.container_dir(uid, cname)), False),
                          Mount(self.cfg.turns_mount, str(self.cfg.state.turn_path), False)]
                mounts += [Mount(d, d, True) for d in self.cfg.runtime.mounts]
                answers.append(ContainerAnswer(env, mounts, f"{ns}/{name}", cname))
                pd[i] = ()
            patch_annos = {keys.POD_TO_ALLOCATE: codec.encode_pod_devices(tuple(pd))}
            if not any(pd):
                patch_annos[keys.POD_BIND_PHASE] = SUCCESS
            self.kube.patch_pod(ns, name, {"metadata": {"annotations": patch_annos,
                                                        "resourceVersion": meta.get("resourceVersion")}})
            if not any(pd):
                self._release_lock(ns, name)
            return answers
        except KubeError as e:
            self._undo(made)
            if e.conflict:
                raise _Retry() from None
            if e.not_found:
                raise AllocateError("NOT_FOUND", f"pod {ns}/{name} was deleted while it was being bound; nothing "
                                                 "was allocated") from None
            self._fail(pod, e)
            raise AllocateError("INTERNAL", f"{e}; the pod is marked {keys.POD_BIND_PHASE}: failed") from None
        except KubeUnreachable:
            self._undo(made)
            raise
        except AllocateError as e:
            self._undo(made)
            self._fail(pod, e)
            raise AllocateError(e.code, f"{e}; the pod is marked {keys.POD_BIND_PHASE}: failed") from None
        except BaseException:
            self._undo(made)
            raise

    def _mig_instances(self, devs: tuple[ContainerDevice, ...],
                       who: str) -> tuple[tuple[ContainerDevice, ...], list[str]]:
        """The container's devices with a MIG entry (GPU-x[g-i]) made its instance (its MIG UUID, no compute
        share), and the GPU UUID of each (their health)."""
        entries = [(d, *codec.split_mig_uuid(d.uuid)) for d in devs]
        if not any(inst is not None for *_, inst in entries):
            return devs, [d.uuid for d in devs]
        if len(devs) > 1:
            raise AllocateError("FAILED_PRECONDITION", f"{who}: gets {len(devs)} GPUs, one of them a MIG instance; "
                                                       "a CUDA process sees a single MIG instance, so a container "
                                                       "asking MIG gets one GPU (nvidia.com/gpu: 1)")
        d, gpu, g, inst = entries[0]
        try:
            positions = self.migs()
        except PyvgpuError as e:
            raise AllocateError("INTERNAL", f"{who}: cannot read the node's MIG instances: {e}") from None
        have = positions.get(gpu)
        if have is None:
            raise AllocateError("FAILED_PRECONDITION", f"{who}: {d.uuid} is a MIG instance, but GPU {gpu} is not in "
                                                       f"MIG mode on node {self.cfg.node} (or not there)")
        if g != 0 or inst >= len(have):
            raise AllocateError("FAILED_PRECONDITION", f"{who}: {d.uuid} names MIG instance {inst} of geometry {g}, "
                                                       f"but GPU {gpu} has {len(have)} instance(s) in the one "
                                                       "geometry pyvgpu registers (the instances that exist): they "
                                                       "changed since the registration, or the pod was placed by a "
                                                       "scheduler with another table. pyvgpu does not create MIG "
                                                       "instances; the node agent registers the new ones")
        return (dataclasses.replace(d, uuid=have[inst], usedcores=0),), [gpu]

    def _inventory(self) -> list[G.GpuInfo]:
        try:
            return list(self.inventory())
        except PyvgpuError as e:  # the record then has UUIDs without indexes; the container still starts
            log.warning("cannot read the node's GPUs for the exporter's labels: %s", e)
            return []

    def _record(self, uid: str, cname: str, ns: str, name: str, devs: tuple[ContainerDevice, ...],
                inventory: list[G.GpuInfo]) -> None:
        """The node agent's record of what this container got (pyvgpu.cluster.node.records)."""
        d = self.cfg.state.container_dir(uid, cname)
        try:
            records.write(d, pod=name, namespace=ns, pod_uid=uid, container=cname,
                          group=nodestate.region_name(uid, cname),
                          gpus=records.gpu_entries([x.uuid for x in devs], inventory))
        except OSError as e:
            raise AllocateError("INTERNAL", f"pod {ns}/{name} container {cname}: cannot write its record beside "
                                            f"{d}: {e}") from None

    def _undo(self, made: list[tuple[str, str]]) -> None:
        for uid, cname in made:
            self.cfg.state.remove_container(uid, cname)

    def _event(self, pod: dict, reason: str, message: str) -> None:
        """A Warning Event on the pod, for its owner to see with `kubectl describe` (one try)."""
        try:
            self.kube.create_event((pod["metadata"].get("namespace") or "default"),
                                   events.event_body(pod, reason, message, True, "pyvgpu-device-plugin", time.time()))
        except (KubeError, KubeUnreachable) as e:
            log.warning("could not write the Event %s on pod %s: %s", reason, pod["metadata"].get("name"), e)

    def _fail(self, pod: dict, why) -> None:
        """Mark the pod bind-phase failed (one try: the caller is failing anyway)."""
        meta = pod["metadata"]
        try:
            self.kube.patch_pod(meta.get("namespace", "default"), meta["name"],
                                {"metadata": {"annotations": {keys.POD_BIND_PHASE: FAILED}}})
        except (KubeError, KubeUnreachable):
            pass
        self._release_lock(meta.get("namespace", "default"), meta["name"])

    def _release_lock(self, ns: str, name: str) -> None:
        """Release the node's lock if this pod holds it (a HAMi scheduler's bind leaves it to us)."""
        try:
            nodelock.NodeLock(self.kube).release(self.cfg.node, ns, name, tries=2)
        except (KubeError, KubeUnreachable) as e:
            log.warning("could not release the lock of node %s held by pod %s/%s: %s; it expires", self.cfg.node,
                        ns, name, e)
