"""The mutating admission webhook: pods that ask GPUs go to pyvgpu's scheduler.

AdmissionReview (admission.k8s.io/v1, and v1beta1 the same way) in, AdmissionReview out with a JSON
patch. For a pod whose containers ask the GPU resources (HAMi's rules, pkg/scheduler/webhook.go and
pkg/device/nvidia/device.go MutateAdmission):

* a container that asks memory or cores but no GPU count gets `nvidia.com/gpu: <default_gpu_num>` in its
  limits, so that the kubelet calls the device plugin for it;
* `spec.schedulerName` becomes the scheduler's name, unless the pod names another scheduler than the
  default one (then it is left alone);
* a privileged container that asks GPUs is refused: it would see every GPU of the node;
* a pod that asks GPUs and already names a node is refused: no scheduler would run for it.
Pods that ask no GPU are admitted unchanged.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pyvgpu.cluster.config import ClusterConfig

DEFAULT_SCHEDULER = "default-scheduler"


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


def review(body: dict, cfg: ClusterConfig, scheduler_name: str) -> dict:
    """An AdmissionReview answer for an AdmissionReview request. Raises ValueError for a malformed one."""
    if not isinstance(body, dict) or not isinstance(body.get("request"), dict):
        raise ValueError("expected an AdmissionReview with a request")
    req = body["request"]
    uid = req.get("uid")
    if not uid:
        raise ValueError("the AdmissionReview request has no uid")
    pod: Any = req.get("object")
    resp: dict[str, Any] = {"uid": uid, "allowed": True}
    if isinstance(pod, dict) and pod.get("kind", "Pod") == "Pod" and req.get("operation", "CREATE") == "CREATE":
        allowed, message, ops = mutate(pod, cfg, scheduler_name)
        resp["allowed"] = allowed
        if not allowed:
            resp["status"] = {"code": 403, "reason": "Forbidden", "message": message}
        elif ops:
            resp["patchType"] = "JSONPatch"
            resp["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {"apiVersion": body.get("apiVersion") or "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": resp}
