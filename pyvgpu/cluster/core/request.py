"""Reading a pod's GPU request: container resources (limits, requests as fallback) and pod annotations.

The rules are HAMi's (pkg/device/nvidia/device.go GenerateResourceRequests, checkType, assertNuma;
pkg/device/devices.go CheckType, CheckUUID; pkg/scheduler/webhook.go and MutateAdmission for the count a
container gets when it asks memory or cores only; v2.10 defaultExclusiveCoreIfNeeded for the 100 cores a
container gets when it asks GPUs and no memory). Where HAMi schedules a value by a rule (gpucores above
100 clamped, a numa-bind that is not a boolean read as false), this module does the same and says so in
PodRequest.warnings; where HAMi drops a value it cannot use (a gpumem that is not a whole number, an
unknown policy word), it refuses the pod with an error that names the field: a typo should not schedule.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.codec import INT32_MAX
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.model import ContainerRequest, PodRequest

# Kubernetes resource.Quantity: a decimal number, then a binary or decimal SI suffix or an exponent.
_QUANTITY = re.compile(r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_SUFFIX = {"": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
           "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
           "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
           "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60)}
# strconv.ParseBool (Go): what nvidia.com/numa-bind accepts.
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def parse_quantity(value: Any, field: str, context: str, unit: str) -> int:
    """A whole-number Kubernetes quantity ("8192", 8192, "8k"); anything else is an error naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ClusterInputError(field, f"{context}: {json.dumps(value)} is not a whole number; write an integer "
                                       f"such as {unit}")
    if isinstance(value, int):
        return value
    m = _QUANTITY.match(value.strip())
    if not m:
        raise ClusterInputError(field, f"{context}: {json.dumps(value)} is not a whole number; write an integer "
                                       f"such as {unit}")
    suffix = m["suffix"] or ""
    scale = Fraction(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIX[suffix]
    v = Fraction(m["num"]) * scale
    if v.denominator != 1:
        raise ClusterInputError(field, f"{context}: {json.dumps(value)} is not a whole number; write an integer "
                                       f"such as {unit}")
    return int(v)


def _resource(ctr: dict, name: str, where: str) -> Any:
    # HAMi reads each resource from limits first, then from requests.
    res = ctr.get("resources") or {}
    for part in ("limits", "requests"):
        table = res.get(part) or {}
        if not isinstance(table, dict):
            raise ClusterInputError(f"resources.{part}", f"{where}: expected a map of resource names to quantities")
        if name in table:
            return table[name]
    return None


def container_request(ctr: dict, cfg: ClusterConfig, context: str, *, init: bool = False,
                      warnings: list[str] | None = None) -> ContainerRequest:
    """One container's request; nums 0 when it asks no GPU. What is read leniently (as HAMi reads it) is
    appended to `warnings`."""
    names = cfg.resources
    name = str(ctr.get("name", ""))
    where = f'{context}, container "{name}"'
    count_v, mem_v = _resource(ctr, names.count, where), _resource(ctr, names.memory, where)
    pct_v, cores_v = _resource(ctr, names.memory_percentage, where), _resource(ctr, names.cores, where)
    if count_v is None:
        # HAMi's webhook gives a container that asks memory or cores but no count defaultGPUNum GPUs.
        if (mem_v is not None or pct_v is not None or cores_v is not None) and cfg.default_gpu_num > 0:
            nums = cfg.default_gpu_num
        else:
            return ContainerRequest(name, 0, 0, 100, 0, init)
    else:
        nums = parse_quantity(count_v, names.count, where, "1")
        if nums < 0 or nums > 1024:
            raise ClusterInputError(names.count, f"{where}: {nums} GPUs is out of range (0..1024)")
    if nums == 0:
        return ContainerRequest(name, 0, 0, 100, 0, init)

    memreq = 0
    if mem_v is not None:
        memreq = parse_quantity(mem_v, names.memory, where, "8192 (MiB)")
        factor = max(cfg.memory_factor, 1)
        if memreq < 0 or memreq > INT32_MAX // factor:
            raise ClusterInputError(names.memory, f"{where}: {memreq} MiB is out of range (0..{INT32_MAX // factor})")
        memreq *= factor
    pct = 100
    pct_given = False
    if pct_v is not None:
        p = parse_quantity(pct_v, names.memory_percentage, where, "50 (percent)")
        if not 0 <= p <= 100:
            raise ClusterInputError(names.memory_percentage, f"{where}: {p} is out of range (0..100 percent)")
        # 0 means "not asked", as in HAMi (a 0% limit would read as no limit on the node).
        if p > 0:
            pct, pct_given = p, True
    if memreq == 0 and not pct_given and cfg.default_memory:
        memreq = cfg.default_memory
    cores = cfg.default_cores
    if cores_v is not None:
        cores = parse_quantity(cores_v, names.cores, where, "30 (percent)")
        if cores < 0:
            raise ClusterInputError(names.cores, f"{where}: {cores} is out of range (0..100 percent; 100 = the "
                                                 "whole GPU)")
        if cores > 100:
            # HAMi's Fit clamps it and schedules (pkg/device/nvidia/device.go): the same, said aloud.
            if warnings is not None:
                warnings.append(f"{where}: {names.cores} {cores} is above 100; read as 100 (the whole GPU), as "
                                "HAMi does")
            cores = 100
    elif cfg.exclusive_core_default and exclusive_by_default(pct_v, mem_v, pct):
        # HAMi's webhook (defaultExclusiveCoreIfNeeded) gives a container that asks GPUs with no memory, or
        # exactly 100%, and no cores the whole GPU's compute.
        cores = 100
    return ContainerRequest(name, nums, memreq, pct, cores, init)


def exclusive_by_default(pct_v: Any, mem_v: Any, pct: int) -> bool:
    """Whether a container that asks GPUs and names no cores gets 100 cores: it asks 100% of the memory,
    or (naming no percentage) no memory at all."""
    if pct_v is not None:
        return pct == 100
    return mem_v is None


def _list(annos: dict, key: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in str(annos.get(key, "")).split(",") if t.strip())


def pod_request(pod: dict, cfg: ClusterConfig | None = None) -> PodRequest:
    """The GPU request of a pod manifest (a dict as `kubectl get pod -o json` prints it)."""
    cfg = cfg or ClusterConfig()
    if not isinstance(pod, dict):
        raise ClusterInputError("pod", "expected a Pod object (a mapping with metadata and spec)")
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        raise ClusterInputError("pod", "metadata and spec must be mappings")
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    if not name:
        raise ClusterInputError("metadata.name", "the pod has no name")
    context = f"pod {ns}/{name}"
    annos = meta.get("annotations") or {}
    if not isinstance(annos, dict):
        raise ClusterInputError("metadata.annotations", f"{context}: expected a map of strings")
    containers = []
    warnings: list[str] = []
    for part, init in (("initContainers", True), ("containers", False)):
        items = spec.get(part) or []
        if not isinstance(items, list):
            raise ClusterInputError(f"spec.{part}", f"{context}: expected a list of containers")
        for i, c in enumerate(items):
            if not isinstance(c, dict):
                raise ClusterInputError(f"spec.{part}[{i}]", f"{context}: expected a container object")
            containers.append(container_request(c, cfg, context, init=init, warnings=warnings))
    if not spec.get("containers"):
        raise ClusterInputError("spec.containers", f"{context}: the pod has no containers")

    node_policy = str(annos.get(keys.NODE_POLICY, cfg.node_policy)).strip()
    if node_policy not in (keys.BINPACK, keys.SPREAD):
        raise ClusterInputError(keys.NODE_POLICY, f"{context}: {node_policy!r} is not a node policy; use binpack "
                                                  "or spread")
    raw_policy = str(annos[keys.GPU_POLICY] if keys.GPU_POLICY in annos else cfg.gpu_policy)
    gpu = gpu_policy_of(raw_policy, context)
    weights = scoring_weights(annos.get(keys.SCORING_WEIGHTS), context) if keys.SCORING_WEIGHTS in annos \
        else (1, 1, 1)

    modes = _list(annos, keys.VGPU_MODE)
    for m in modes:
        if m not in keys.MODES:
            raise ClusterInputError(keys.VGPU_MODE, f"{context}: {m!r} is not a mode; use hami-core, mig or mps")
    numa = str(annos.get(keys.NUMA_BIND, "false"))
    if numa not in _TRUE and numa not in _FALSE:
        # HAMi reads it with strconv.ParseBool and takes an error as false (assertNuma): so does pyvgpu, aloud.
        warnings.append(f"{context}: {keys.NUMA_BIND} {numa!r} is not a boolean; read as false (no NUMA binding), "
                        "as HAMi does; write true or false")
    return PodRequest(
        namespace=ns, name=name, containers=tuple(containers), node_policy=node_policy,
        gpu_policy=gpu.order, topology=gpu.topology, gpu_chain=gpu.chain, mutex=gpu.mutex, weights=weights,
        use_types=_list(annos, keys.USE_TYPE), nouse_types=_list(annos, keys.NOUSE_TYPE),
        use_uuids=_list(annos, keys.USE_UUID), nouse_uuids=_list(annos, keys.NOUSE_UUID),
        modes=modes, numa_bind=numa in _TRUE, uid=str(meta.get("uid") or ""), warnings=tuple(warnings),
    )


@dataclass(frozen=True)
class GpuPolicy:
    """A GPU policy annotation read as HAMi reads it (pkg/scheduler/policy/gpu_policy.go, pkg/util
    PolicyContains): `order` is binpack or spread (what explain names), `chain` the sort keys of a comma
    list, `mutex` and `topology` the two filter words."""

    order: str
    chain: tuple[str, ...]
    mutex: bool
    topology: bool


def gpu_policy_of(raw: str, context: str) -> GpuPolicy:
    """HAMi's rules: a value with a comma (or bare "numa") is a chain of sort keys in the order written,
    spread when it names none; a single value is binpack, mutex or (anything else) spread; "mutex" and
    "topology-aware" anywhere in the list are filters. Unknown words are refused (HAMi ignores them)."""
    tokens = [t.strip() for t in raw.split(",")]
    words = [t for t in tokens if t]
    for t in words:
        if t not in keys.GPU_POLICY_WORDS:
            raise ClusterInputError(keys.GPU_POLICY, f"{context}: {t!r} is not a GPU policy; use binpack, spread, "
                                                     "topology-aware, mutex or numa, or a comma list of them")
    chain: tuple[str, ...] = ()
    if "," in raw or raw.strip() == keys.NUMA:
        chain = tuple(dict.fromkeys(t for t in words if t in (keys.BINPACK, keys.SPREAD, keys.NUMA)))
        chain = chain or (keys.SPREAD,)
    order = keys.BINPACK if (chain[0] if chain else raw.strip()) == keys.BINPACK else keys.SPREAD
    return GpuPolicy(order, chain, keys.MUTEX in words, keys.TOPOLOGY in words)


def scoring_weights(raw: Any, context: str) -> tuple[int, int, int]:
    """hami.io/device-scoring-weights, "slot=1,core=1,memory=3": each of the three named once, whole numbers
    of 0 or more, at least one positive (HAMi pkg/util/device_scoring_weights.go)."""
    fix = "write slot=N,core=N,memory=N with whole numbers of 0 or more, one of them positive"
    parts = str(raw).split(",")
    if len(parts) != 3:
        raise ClusterInputError(keys.SCORING_WEIGHTS, f"{context}: {raw!r} needs the three weights; {fix}")
    got: dict[str, int] = {}
    for part in parts:
        key, sep, value = part.strip().partition("=")
        key = key.strip()
        if not sep or key not in ("slot", "core", "memory") or key in got:
            raise ClusterInputError(keys.SCORING_WEIGHTS, f"{context}: {raw!r}: {part.strip()!r} is not a new "
                                                          f"slot, core or memory weight; {fix}")
        try:
            w = int(value.strip(), 10)
        except ValueError:
            w = -1
        if w < 0 or not value.strip().lstrip("+").isdigit():
            raise ClusterInputError(keys.SCORING_WEIGHTS, f"{context}: {raw!r}: the {key} weight {value.strip()!r} "
                                                          f"is not a whole number of 0 or more; {fix}")
        got[key] = w
    if not any(got.values()):
        raise ClusterInputError(keys.SCORING_WEIGHTS, f"{context}: {raw!r}: every weight is 0; {fix}")
    return got["slot"], got["core"], got["memory"]
