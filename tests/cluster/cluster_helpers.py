"""Builders of Kubernetes objects (as `kubectl get -o json` prints them) for the cluster tests."""

from __future__ import annotations

from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.model import DeviceInfo

A100 = "NVIDIA A100-SXM4-80GB"


def gpu(uuid: str, index: int = 0, *, count: int = 10, mem: int = 81920, core: int = 100, type: str = A100,
        numa: int = 0, mode: str = "hami-core", health: bool = True) -> DeviceInfo:
    return DeviceInfo(uuid, index, count, mem, core, type, numa, mode, health)


def node(name: str, devices: list[DeviceInfo] | str | None, scores: dict | None = None,
         annotations: dict | None = None) -> dict:
    annos: dict[str, str] = {}
    if devices is not None:
        annos[keys.NODE_REGISTER] = devices if isinstance(devices, str) else codec.encode_register(devices)
    if scores is not None:
        annos[keys.NODE_PAIR_SCORE] = codec.encode_pair_scores(scores)
    annos.update(annotations or {})
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": annos}}


def ctr(name: str = "main", gpus: int | str | None = 1, mem: int | str | None = None, pct: int | str | None = None,
        cores: int | str | None = None, requests: bool = False) -> dict:
    res = {}
    for k, v in (("nvidia.com/gpu", gpus), ("nvidia.com/gpumem", mem), ("nvidia.com/gpumem-percentage", pct),
                 ("nvidia.com/gpucores", cores)):
        if v is not None:
            res[k] = v if isinstance(v, str) else str(v)
    return {"name": name, "image": "x", "resources": {"requests" if requests else "limits": res}}


def pod(name: str = "new", containers: list[dict] | None = None, annotations: dict | None = None,
        node_name: str | None = None, allocated: str | None = None, phase: str = "Running",
        init: list[dict] | None = None, namespace: str = "default", scheduler: str = "pyvgpu-scheduler") -> dict:
    annos = dict(annotations or {})
    if allocated is not None:
        annos[keys.POD_ALLOCATED] = allocated
    spec: dict = {"containers": containers if containers is not None else [ctr()], "schedulerName": scheduler}
    if init:
        spec["initContainers"] = init
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                             "annotations": annos},
            "spec": spec, "status": {"phase": phase if node_name else "Pending"}}


def nodelist(*nodes: dict) -> dict:
    return {"apiVersion": "v1", "kind": "NodeList", "items": list(nodes)}


def podlist(*pods: dict) -> dict:
    return {"apiVersion": "v1", "kind": "PodList", "items": list(pods)}
