"""Builders of the objects the test API server (fake_apiserver.py) keeps, as the real one serves them, and
RFC 7386 merge patches of them."""

from __future__ import annotations

import copy
import uuid as uuidlib


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def node(name: str, annotations: dict | None = None, allocatable: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": str(uuidlib.uuid4()), "annotations": dict(annotations or {}),
                         "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": dict(allocatable or {}), "capacity": dict(allocatable or {})}}


def pod(name: str, containers: list[dict], namespace: str = "default", annotations: dict | None = None,
        node_name: str | None = None, phase: str = "Pending", init_containers: list[dict] | None = None,
        scheduler: str = "pyvgpu-scheduler", uid: str | None = None) -> dict:
    spec = {"containers": containers, "schedulerName": scheduler}
    if init_containers:
        spec["initContainers"] = init_containers
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuidlib.uuid4()),
                         "annotations": dict(annotations or {}), "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": spec, "status": {"phase": phase}}


def gpu_container(name: str = "main", gpus: int = 1, mem: int | None = None, cores: int | None = None) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return {"name": name, "image": "busybox", "resources": {"limits": limits}}
