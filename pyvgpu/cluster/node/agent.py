"""`pyvgpu cluster node-agent`: the node's GPUs in the node's annotations, and the node's shared state.

* Registers the GPUs in `hami.io/node-nvidia-register` (HAMi's JSON: id, index, count, devmem, devcore,
  type, numa, mode, health) and their links in `hami.io/node-nvidia-score`, and answers the handshake:
  `hami.io/node-handshake: Reported_<UTC time>`. A HAMi scheduler (v2.7 and older) asks with
  `Requesting_<time>` and takes a node whose plugin does not answer within a minute for dead; newer ones
  look at the node's allocatable GPUs instead. The annotations are written again when they differ from
  what the node has (a GPU turned unhealthy, someone edited them) or when a scheduler asks.
  The device type is NVML's name, prefixed "NVIDIA-" when it does not start with "NVIDIA" (as HAMi does).
  A GPU's memory and cores are scaled by the node's devicememoryscaling and devicecorescaling, and its count
  is the node's devicesplitcount, from HAMi's device-plugin config (pyvgpu.cluster.node.nodeconfig).
  A GPU whose MIG mode is on is registered with mode `mig`, `count` its instances and `migtemplate` one
  geometry: the instances that exist (gpus.mig_layout), never others; pyvgpu does not change MIG geometry,
  so the scheduler can only place on instances an administrator made. One in MIG mode without an
  instance is left out (there is nothing to use on it), with a warning.
* Owns the node's shared state (pyvgpu.cluster.node.nodestate): creates it at start, and removes the region
  directories of pods that are gone or ended.
While the API server is unreachable it keeps trying, every `interval` seconds; the state stays as it is.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from pyvgpu.cluster.api.kube import Kube, KubeError, KubeUnreachable, annotations
from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.model import DeviceInfo
from pyvgpu.cluster.node import gpus as G
from pyvgpu.cluster.node import nodestate
from pyvgpu.cluster.node.nodeconfig import registered_cores, registered_memory
from pyvgpu.cluster.node.plugin import Devices

log = logging.getLogger("pyvgpu.cluster.node.agent")
_ENDED = ("Succeeded", "Failed")


def device_type(name: str) -> str:
    return name if name.startswith("NVIDIA") else f"NVIDIA-{name}"


def handshake_value(now: float | None = None) -> str:
    return "Reported_" + time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() if now is None else now))


@dataclass
class NodeAgent:
    kube: Kube
    node: str
    devices: Devices
    state: nodestate.NodeState
    split: int = 10
    interval: float = 30.0
    scores: dict[str, dict[str, int]] | None = None
    warned: set = field(default_factory=set)
    # HAMi's devicememoryscaling and devicecorescaling of this node (pyvgpu.cluster.node.nodeconfig); None: 1
    memory_scaling: float | None = None
    core_scaling: float | None = None

    def registration(self) -> dict[str, str]:
        _, health = self.devices.snapshot()
        infos = []
        for g in self.devices.gpus:
            kind = device_type(g.name)
            if not g.mig_mode:
                infos.append(DeviceInfo(id=g.uuid, index=g.index, count=self.split,
                                        devmem=registered_memory(g.memory_mib, self.memory_scaling),
                                        devcore=registered_cores(self.core_scaling), type=kind, numa=g.numa,
                                        mode=keys.HAMI_CORE, health=health.get(g.uuid) is None))
                continue
            geometry, _ = G.mig_layout(g, ClusterConfig().mig_geometries(kind))
            if not geometry:
                if g.uuid not in self.warned:
                    self.warned.add(g.uuid)
                    log.warning("GPU %d %s has its MIG mode on but no MIG instance: not registered (an "
                                "administrator makes instances with nvidia-smi mig; pyvgpu never does)",
                                g.index, g.uuid)
                continue
            infos.append(DeviceInfo(id=g.uuid, index=g.index, count=len(g.migs), devmem=g.memory_mib, devcore=100,
                                    type=kind, numa=g.numa, mode=keys.MIG, health=health.get(g.uuid) is None,
                                    mig_geometries=(geometry,)))
        out = {keys.NODE_REGISTER: codec.encode_register(infos)}
        if self.scores is not None:
            out[keys.NODE_PAIR_SCORE] = codec.encode_pair_scores(self.scores)
        return out

    def register_once(self) -> bool:
        """Write the registration if the node's differs or a scheduler asks; True when written."""
        want = self.registration()
        have = annotations(self.kube.get_node(self.node))
        asked = keys.NODE_HANDSHAKE not in have or "Requesting" in have.get(keys.NODE_HANDSHAKE, "")
        if not asked and all(have.get(k) == v for k, v in want.items()):
            return False
        self.kube.patch_node(self.node, {"metadata": {"annotations": {**want, keys.NODE_HANDSHAKE: handshake_value()}}})
        log.info("registered %d GPU(s) on node %s", len(self.devices.gpus), self.node)
        return True

    def reclaim_once(self) -> list:
        """Remove the region directories of this node's pods that are gone or ended."""
        listed_at = time.time()
        pods = self.kube.list_pods(node=self.node).get("items") or []
        keep = {(p.get("metadata") or {}).get("uid") for p in pods
                if (p.get("status") or {}).get("phase") not in _ENDED}
        removed = self.state.reclaim({u for u in keep if u}, listed_at)
        for p in removed:
            log.info("reclaimed %s (its pod is gone or ended)", p)
        return removed

    def step(self) -> None:
        for what in (self.register_once, self.reclaim_once):
            try:
                what()
            except (KubeError, KubeUnreachable) as e:
                log.warning("%s (trying again in %g s)", e, self.interval)

    def run(self, stop: threading.Event) -> None:
        self.state.ensure()
        while not stop.is_set():
            self.step()
            seen, _ = self.devices.snapshot()
            end = time.monotonic() + self.interval
            while not stop.is_set() and time.monotonic() < end and self.devices.snapshot()[0] == seen:
                self.devices.wait_change(seen, min(0.5, self.interval))  # a health change re-registers at once


def pair_scores(gpu_list: list[G.GpuInfo]) -> dict[str, dict[str, int]]:
    scores, note = G.pair_scores(gpu_list)
    if note:
        log.warning("%s", note)
    return scores
