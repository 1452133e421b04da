"""The mutating admission webhook: pods that ask GPUs go to pyvgpu's scheduler.

AdmissionReview (admission.k8s.io/v1, and v1beta1 the same way) in, AdmissionReview out with a JSON
patch. For a pod whose containers ask the GPU resources (HAMi's rules, pkg/scheduler/webhook.go and
pkg/device/nvidia/device.go MutateAdmission):

* a container that asks memory or cores but no GPU count gets `nvidia.com/gpu: <default_gpu_num>` in its
  limits, so that the kubelet calls the device plugin for it;
* `spec.schedulerName` becomes the scheduler's name, unless the pod names another scheduler than the
  default one (then it is left alone);
* a privileged container that asks GPUs is refused: it would see every GPU of the node;
* a pod that asks GPUs and already names a node is refused: no scheduler would run for it;
* a pod whose GPU request alone takes its namespace over a ResourceQuota's GPU limit is refused (HAMi v2.10
  `fitResourceQuota`): the MiB asked (a share of memory counts 0, since the GPU is not known yet) and the
  cores, times the GPUs, summed over the app containers, or the largest init container's if more; what the
  namespace's pods already hold counts too (the scheduler's quota cache, pyvgpu.cluster.core.quota).
Pods that ask no GPU are admitted unchanged.

The allocation annotations (ALLOCATION_KEYS: which node and GPUs a pod holds, its bind phase) are what
usage and Allocate read, so only pyvgpu writes them: on CREATE a pod carrying any of them is refused, and on
UPDATE a change to any of them is refused, unless the request's user is one of `writers` (the scheduler's
and the node agent's service accounts; docs/security.md has the RBAC).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.quota import Quotas
from pyvgpu.cluster.core.request import pod_request

DEFAULT_SCHEDULER = "default-scheduler"
ALLOCATION_KEYS = (keys.POD_NODE, keys.POD_TIME, keys.POD_TO_ALLOCATE, keys.POD_ALLOCATED, keys.POD_BIND_PHASE,
                   keys.POD_BIND_TIME, keys.POD_MIG_ALLOCATIONS)


def _annotations(obj: Any) -> dict:
    annos = ((obj or {}).get("metadata") or {}).get("annotations") if isinstance(obj, dict) else None
    return annos if isinstance(annos, dict) else {}


def forged_annotations(req: dict, writers: frozenset[str]) -> str | None:
    """Why the request must be refused: it sets or changes an allocation annotation and its user is not one
    of `writers`. None when it may go on."""
    user = ((req.get("userInfo") or {}).get("username")) or ""
    if user in writers:
        return None
    new, old = _annotations(req.get("object")), _annotations(req.get("oldObject"))
    if req.get("operation", "CREATE") == "CREATE":
        old = {}
    changed = sorted(k for k in ALLOCATION_KEYS if new.get(k) != old.get(k))
    if not changed:
        return None
    who = user or "an unnamed user"
    return (f"annotation {changed[0]} is written by pyvgpu's scheduler and node agent alone, not by {who}: "
            f"remove it from the pod (use {keys.GPU_POLICY} or {keys.NODE_POLICY} to steer placement)")


def _ptr(*parts: str) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def mutate(pod: dict, cfg: ClusterConfig, scheduler_name: str) -> tuple[bool, str, list[dict]]:
    """(allowed, message, JSON patch operations) for a pod being created."""
    spec = pod.get("spec") or {}
    names = cfg.resources
    ops: list[dict] = []
    asks = False
    privileged = None
    for part in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(part) or []):
            res = c.get("resources") or {}
            limits = res.get("limits") or {}
            requests = res.get("requests") or {}
            has_count = names.count in limits or names.count in requests
            other = any(n in limits or n in requests for n in (names.memory, names.memory_percentage, names.cores))
            if has_count:
                asks = True
            elif other and cfg.default_gpu_num > 0:
                asks = True
                if "resources" not in c:
                    ops.append({"op": "add", "path": _ptr("spec", part, str(i), "resources"), "value": {}})
                if "limits" not in res:
                    ops.append({"op": "add", "path": _ptr("spec", part, str(i), "resources", "limits"), "value": {}})
                ops.append({"op": "add", "path": _ptr("spec", part, str(i), "resources", "limits", names.count),
                            "value": str(cfg.default_gpu_num)})
            if (has_count or other) and ((c.get("securityContext") or {}).get("privileged") is True):
                privileged = c.get("name", f"{part}[{i}]")
    if not asks:
        return True, "the pod asks no GPU", []
    if privileged:
        return False, (f"container {privileged} is privileged and asks GPUs: it would see every GPU of the node "
                       "regardless of its limits; drop privileged, or the GPU resources"), []
    current = spec.get("schedulerName") or ""
    if current and current not in (DEFAULT_SCHEDULER, scheduler_name):
        return True, f"the pod names the scheduler {current!r}; left alone", []
    if spec.get("nodeName"):
        return False, (f"the pod asks GPUs but already names node {spec['nodeName']!r}: {scheduler_name} must "
                       "choose its node and GPUs; remove spec.nodeName (use a nodeSelector)"), []
    if current != scheduler_name:
        ops.append({"op": "replace" if current else "add", "path": "/spec/schedulerName", "value": scheduler_name})
    return True, "", ops


def quota_refusal(pod: dict, namespace: str, cfg: ClusterConfig, quotas: Quotas | None) -> str | None:
    """Why the pod's GPU request takes its namespace over its quota, or None (no quota, within it, or a request
    that cannot be read: the scheduler refuses that one with the field named)."""
    if quotas is None:
        return None
    view = quotas.view(namespace)
    if view is None:
        return None
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    named = {**pod, "metadata": {**meta, "name": meta.get("name") or meta.get("generateName") or "new"}}
    try:  # a pod being created may have only generateName; the name matters nothing here
        req = pod_request(named, cfg)
    except ClusterInputError:
        return None
    app = [0, 0]
    init = [0, 0]
    for c in req.containers:
        mem, cores = c.memreq * c.nums, c.coresreq * c.nums
        if c.init:
            init = [max(init[0], mem), max(init[1], cores)]
        else:
            app = [app[0] + mem, app[1] + cores]
    why = view.reason((max(app[0], init[0]), max(app[1], init[1])))
    return f"{why}: ask less, or raise the quota" if why else None


def _check_shape(pod: dict) -> None:
    """ValueError (a 400) for a pod whose spec or containers are not objects: the API server never sends one."""
    spec = pod.get("spec")
    if spec is not None and not isinstance(spec, dict):
        raise ValueError("the pod's spec is not an object")
    for part in ("initContainers", "containers"):
        ctrs = (spec or {}).get(part)
        if ctrs is None:
            continue
        if not isinstance(ctrs, list):
            raise ValueError(f"spec.{part} is not a list")
        for i, c in enumerate(ctrs):
            if not isinstance(c, dict):
                raise ValueError(f"spec.{part}[{i}] is not an object")
            res = c.get("resources")
            if res is not None and (not isinstance(res, dict)
                                    or any(not isinstance(res.get(k), (dict, type(None))) for k in ("limits",
                                                                                                       "requests"))):
                raise ValueError(f"spec.{part}[{i}].resources: expected limits and requests as objects")


def review(body: dict, cfg: ClusterConfig, scheduler_name: str, writers: frozenset[str] = frozenset(),
           quotas: Quotas | None = None) -> dict:
    """An AdmissionReview answer for an AdmissionReview request. Raises ValueError for a malformed one.
    `quotas`: the namespaces' GPU limits and use (the scheduler's cache); None checks no quota."""
    if not isinstance(body, dict) or not isinstance(body.get("request"), dict):
        raise ValueError("expected an AdmissionReview with a request")
    req = body["request"]
    uid = req.get("uid")
    if not uid:
        raise ValueError("the AdmissionReview request has no uid")
    pod: Any = req.get("object")
    resp: dict[str, Any] = {"uid": uid, "allowed": True}
    is_pod = isinstance(pod, dict) and pod.get("kind", "Pod") == "Pod"
    if is_pod:
        _check_shape(pod)
    forged = forged_annotations(req, writers) if is_pod else None
    if forged:
        resp["allowed"] = False
        resp["status"] = {"code": 403, "reason": "Forbidden", "message": forged}
    elif is_pod and req.get("operation", "CREATE") == "CREATE":
        allowed, message, ops = mutate(pod, cfg, scheduler_name)
        if allowed:  # HAMi checks every pod it admits, whichever scheduler it names
            namespace = str(req.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "default")
            over = quota_refusal(pod, namespace, cfg, quotas)
            if over:
                allowed, message, ops = False, over, []
        resp["allowed"] = allowed
        if not allowed:
            resp["status"] = {"code": 403, "reason": "Forbidden", "message": message}
        elif ops:
            resp["patchType"] = "JSONPatch"
            resp["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {"apiVersion": body.get("apiVersion") or "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": resp}
