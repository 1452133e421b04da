"""What is in use on each node: registered GPUs, minus what the pods bound to them hold.

A pod counts against a node when a pyvgpu scheduler places it (spec.schedulerName: the webhook lets no
one else write its allocation annotations), it has not ended (phase not Succeeded or Failed) and names
the node, in spec.nodeName or, before the binding lands, in hami.io/vgpu-node (HAMi tracks pods by that
annotation: pkg/scheduler/scheduler.go onAddPod). Its GPUs come from hami.io/vgpu-devices-allocated.
While it binds (hami.io/bind-phase: allocating) the device plugin pops containers off
hami.io/vgpu-devices-to-allocate one by one (HAMi pkg/device-plugin/.../plugin/util.go), so each
container counts by whichever of the two annotations still lists its GPUs.

A pod's init containers run one at a time before its app containers, so per GPU the pod holds the
larger of its biggest init container and the sum of its app containers; slots likewise (HAMi
pkg/device/initContainer.go CollapseInitContainerUsage). Once every init container has exited 0 (the
pod's status lists each one terminated with exit code 0), the pod holds its app containers' GPUs only
(HAMi AppContainersOnlyDeviceUsage, pkg/util AllInitContainersSucceeded).

On a GPU registered with HAMi v2.10 dynamic MIG profiles (migProfiles) an entry names the GPU alone; the
instance is the pod's reservation in hami.io/vgpu-mig-allocations (profile and placement). Every reservation
of the pod takes its placement, whether an entry names it or not (HAMi pkg/scheduler/scheduler.go
getNodesUsage restores unconsumed ones too). Fail closed, as HAMi: a pod on such a GPU without a reservation
for it (or whose reservations cannot be read) leaves the GPU taking nothing new; a reservation on a GPU not
in MIG mode blocks that GPU; one on a GPU the node does not list blocks every MIG GPU of the node.

A pod whose allocation annotation cannot be decoded is skipped, as HAMi's scheduler skips it (its GPUs
count as free); the node keeps taking pods and says so in NodeInfo.warnings.
"""

from __future__ import annotations

import functools
from typing import Any

from pyvgpu.cluster.core import codec, keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.model import DeviceUsage, NodeInfo, PodDevices

_ENDED = ("Succeeded", "Failed")
# A registration of more GPUs is refused: every filter reads each node's GPUs, and the biggest machines
# have 16 (the policy's search is bounded too; this bounds the rest of a decision).
MAX_GPUS_PER_NODE = 128


def items(obj: Any, kind: str) -> list[dict]:
    """The objects of a `kubectl get -o json` dump: a List's items, a plain list, or one object."""
    if isinstance(obj, dict) and isinstance(obj.get("items"), list):
        out = obj["items"]
    elif isinstance(obj, list):
        out = obj
    elif isinstance(obj, dict) and obj.get("kind") == kind:
        out = [obj]
    else:
        raise ClusterInputError(f"{kind}List", f"expected a {kind}List (kubectl get {kind.lower()}s -o json), "
                                               f"a list of {kind}s or one {kind}")
    for i, o in enumerate(out):
        if not isinstance(o, dict):
            raise ClusterInputError(f"{kind}List items[{i}]", f"expected a {kind} object, got {type(o).__name__}")
    return out


def _meta(obj: dict, i: int, kind: str) -> tuple[dict, dict]:
    meta = obj.get("metadata") or {}
    if not isinstance(meta, dict) or not meta.get("name"):
        raise ClusterInputError(f"{kind}List items[{i}].metadata.name", f"a {kind} without a name")
    annos = meta.get("annotations") or {}
    if not isinstance(annos, dict):
        raise ClusterInputError(f"{kind}List items[{i}].metadata.annotations", f"{kind} {meta['name']}: expected a "
                                                                             "map of strings")
    return meta, annos


def node_info(node: dict, cfg: ClusterConfig, i: int = 0) -> NodeInfo:
    """One node's GPUs (no usage yet). A broken registration becomes the node's error, not an exception."""
    meta, annos = _meta(node, i, "Node")
    info = NodeInfo(str(meta["name"]))
    raw = annos.get(keys.NODE_REGISTER)
    if raw is None:
        info.error = f"no {keys.NODE_REGISTER} annotation: no pyvgpu or HAMi node agent registered GPUs here"
        return info
    try:
        devices, scores = _registration(raw, annos.get(keys.NODE_PAIR_SCORE))
    except (RecursionError, ValueError, TypeError) as e:  # the codec maps these; should one slip, it stays here
        info.error = f"{keys.NODE_REGISTER}: cannot be read ({type(e).__name__}): check the node agent"
        return info
    except ClusterInputError as e:
        info.error = str(e)
        if ".migprofiles" in e.field:  # HAMi v2.10's device plugin writes these (HAMi too leaves such a node out)
            info.error += ("; the node's MIG profiles cannot be placed on, so nothing is placed on this node: check "
                           "the node's device plugin and its migProfileAllowlist")
        return info
    if not devices:
        info.error = f"{keys.NODE_REGISTER} lists no GPU"
        return info
    if len(devices) > MAX_GPUS_PER_NODE:
        info.error = (f"{keys.NODE_REGISTER} lists {len(devices)} GPUs, more than the {MAX_GPUS_PER_NODE} pyvgpu "
                      "takes from one node: check the node agent; nothing is placed on this node")
        return info
    cordoned = {u.strip() for u in str(annos.get(keys.NODE_DEVICE_CORDON, "")).split(",") if u.strip()}
    for d in devices:
        du = DeviceUsage.of(d)
        du.cordoned = d.id in cordoned
        if du.mode != keys.MIG:
            du.profiles = ()
        elif du.profiles:
            # HAMi v2.10 dynamic MIG: the registered profiles and placements are all the GPU offers (never
            # pyvgpu's own table, which could name a slice the node does not have)
            du.geometries = ()
        elif not du.geometries:
            du.geometries = cfg.mig_geometries(du.type)
            if not du.geometries:
                du.problem = (f"mode mig, but no MIG geometry is known for {du.type!r}: add its model to the "
                              "config's mig_models")
        info.devices.append(du)
    info.pair_scores = scores
    return info


@functools.lru_cache(maxsize=16384)
def _registration(raw: str, pair_raw: str | None) -> tuple[tuple, dict[str, dict[str, int]]]:
    """A node's registration and pair scores, decoded once per text (the scheduler's cache rebuilds a node's
    usage each time its pods change; the registration changes far less often). The pair scores are shared:
    read only."""
    scores = codec.decode_pair_scores(pair_raw) if pair_raw is not None else {}
    return tuple(codec.decode_register(raw)), scores


@functools.lru_cache(maxsize=65536)
def _decoded(text: str, where: str) -> PodDevices:
    return codec.decode_pod_devices(text, where)


def placed_by_us(pod: dict, cfg: ClusterConfig) -> bool:
    """Whether one of pyvgpu's schedulers places this pod: only then are its allocation annotations pyvgpu's
    (the webhook refuses them from anyone else), so only then do they count."""
    return ((pod.get("spec") or {}).get("schedulerName") or "default-scheduler") in cfg.scheduler_names


def pod_node(pod: dict) -> str | None:
    meta = pod.get("metadata") or {}
    return (pod.get("spec") or {}).get("nodeName") or (meta.get("annotations") or {}).get(keys.POD_NODE) or None


def pod_devices(pod: dict) -> PodDevices:
    """The GPUs a pod holds, per container (init containers first); () when none. Raises on a bad annotation."""
    annos = (pod.get("metadata") or {}).get("annotations") or {}
    allocated = _decode(annos.get(keys.POD_ALLOCATED, ""), keys.POD_ALLOCATED)
    if annos.get(keys.POD_BIND_PHASE) != keys.BIND_ALLOCATING:
        return allocated
    pending = _decode(annos.get(keys.POD_TO_ALLOCATE, ""), keys.POD_TO_ALLOCATE)
    n = max(len(allocated), len(pending))
    return tuple((allocated[i] if i < len(allocated) and allocated[i] else
                  pending[i] if i < len(pending) else ()) for i in range(n))


def _decode(text: object, where: str) -> PodDevices:
    # decoded once per text (PodDevices are immutable); anything but a string goes to the codec's error
    return _decoded(text, where) if isinstance(text, str) else codec.decode_pod_devices(text, where)


def usage_inputs(pod: dict) -> tuple:
    """Everything of a pod that node_infos reads to charge it: two versions of a pod with equal inputs
    charge its node alike (the scheduler's cache then keeps the node's usage as it is)."""
    meta = pod.get("metadata") or {}
    annos = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    if not isinstance(annos, dict):
        return (None, id(pod))  # unreadable: never equal to another version
    return ((pod.get("status") or {}).get("phase") in _ENDED, spec.get("schedulerName"), pod_node(pod),
            annos.get(keys.POD_ALLOCATED), annos.get(keys.POD_BIND_PHASE) == keys.BIND_ALLOCATING,
            annos.get(keys.POD_TO_ALLOCATE), len(spec.get("initContainers") or []), init_done(pod),
            annos.get(keys.POD_MIG_ALLOCATIONS))


def ended(pod: dict) -> bool:
    """The pod has ended (Succeeded or Failed): it holds nothing."""
    return (pod.get("status") or {}).get("phase") in _ENDED


def init_done(pod: dict) -> bool:
    """Every init container of the pod has exited 0: its status lists them all, each terminated with code 0
    (HAMi: a pod with no init container statuses is not done)."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    if not isinstance(statuses, list) or not statuses:
        return False
    for st in statuses:
        term = ((st or {}).get("state") or {}).get("terminated") if isinstance(st, dict) else None
        if not isinstance(term, dict) or term.get("exitCode") != 0:
            return False
    return True


def collapse(pd: PodDevices, n_init: int, app_only: bool = False) -> dict[str, list]:
    """Per GPU UUID: [slots, mem, cores, {(geometry, instance)}, [dynamic MIG placements]] the pod holds at its
    peak; with `app_only` (its init containers are done) what its app containers hold. Every reserved
    placement counts, the init containers' too (HAMi keeps every reservation of the pod)."""
    slices: dict[str, list] = {}
    for ctr in pd:
        for d in ctr:
            if d.mig is not None:
                slices.setdefault(d.uuid, []).append((d.mig.start, d.mig.size))
    init: dict[str, list] = {}
    app: dict[str, list] = {}
    for ci, ctr in enumerate(pd):
        if app_only and ci < n_init:
            continue
        for d in ctr:
            uuid, g, inst = codec.split_mig_uuid(d.uuid)
            if ci < n_init:
                cur = init.setdefault(uuid, [1, 0, 0, set()])
                cur[1], cur[2] = max(cur[1], d.usedmem), max(cur[2], d.usedcores)
            else:
                cur = app.setdefault(uuid, [0, 0, 0, set()])
                cur[0] += 1
                cur[1] += d.usedmem
                cur[2] += d.usedcores
            if inst is not None:
                cur[3].add((g, inst))
    out = {}
    for uuid in init.keys() | app.keys():
        a, b = init.get(uuid, [0, 0, 0, set()]), app.get(uuid, [0, 0, 0, set()])
        out[uuid] = [max(a[0], b[0], 1), max(a[1], b[1]), max(a[2], b[2]), a[3] | b[3], slices.pop(uuid, [])]
    for uuid, held in slices.items():  # reserved by an init container that is done
        out[uuid] = [0, 0, 0, set(), held]
    return out


def _instances(geometry: tuple) -> int:
    return sum(t.count for t in geometry)


def add_pod(node: NodeInfo, pd: PodDevices, n_init: int = 0, sign: int = 1, who: str = "a pod",
            app_only: bool = False) -> None:
    """Charge (sign=1) or release (sign=-1) a pod's GPUs on a node. GPUs the node does not list are ignored,
    as HAMi does. Contradictions (a MIG instance on a non-MIG GPU, two geometries on one GPU) mark the GPU
    with a problem, so it takes nothing new."""
    _charge(node, collapse(pd, n_init, app_only).items(), sign, who)


def _charge(node: NodeInfo, held, sign: int, who: str, mig_error: str | None = None) -> None:
    """add_pod's charge of a pod's collapsed use, (uuid, (slots, mem, cores, migs, slices)) per GPU.
    `mig_error`: why the pod's hami.io/vgpu-mig-allocations could not be read (then it has no reservation)."""
    node.score_cache = None
    node.fit_cache = None
    node.results = None
    by_id = {d.id: d for d in node.devices}
    for uuid, (slots, mem, cores, migs, slices) in held:
        dev = by_id.get(uuid)
        if dev is None:
            if slices and sign > 0:
                for d in node.devices:
                    if d.mode == keys.MIG:
                        d.problem = (f"{who} holds a MIG reservation ({keys.POD_MIG_ALLOCATIONS}) on GPU {uuid}, "
                                     "which this node does not list")
            continue
        dev.used += sign * slots
        dev.usedmem += sign * mem
        dev.usedcores += sign * cores
        if dev.mode != keys.MIG:
            if (migs or slices) and sign > 0:
                dev.problem = (f"{who} holds a MIG instance on this {dev.mode} GPU" if migs else
                               f"{who} holds a MIG reservation ({keys.POD_MIG_ALLOCATIONS}) on this {dev.mode} GPU")
            continue
        if dev.profiles:
            _charge_slices(dev, slots, migs, slices, sign, who, mig_error)
            continue
        if slices and sign > 0:
            dev.problem = (f"{who} holds a dynamic MIG reservation ({keys.POD_MIG_ALLOCATIONS}) on this GPU, which "
                           "is registered with MIG templates")
            continue
        if not migs and sign > 0:
            dev.problem = f"{who} holds this MIG GPU without naming an instance (UUID[geometry-instance])"
            continue
        used = set(dev.mig_used)
        for g, inst in migs:
            if sign < 0:
                used.discard(inst)
                continue
            if dev.mig_geometry is not None and dev.mig_geometry != g:
                dev.problem = f"pods use MIG geometries {dev.mig_geometry} and {g} on this GPU"
            elif g >= len(dev.geometries) or inst >= _instances(dev.geometries[g]):
                dev.problem = f"{who} holds MIG instance [{g}-{inst}], which geometry table does not have"
            elif inst in used:
                dev.problem = f"MIG instance [{g}-{inst}] is held twice"
            dev.mig_geometry = g
            used.add(inst)
        dev.mig_used = frozenset(used)
        if not used:
            dev.mig_geometry = None


def _charge_slices(dev: DeviceUsage, slots: int, migs, slices, sign: int, who: str, mig_error: str | None) -> None:
    """A dynamic-MIG GPU's reserved placements: added (or released) one per reservation."""
    if sign > 0 and migs:
        dev.problem = f"{who} names a MIG template instance on this GPU, which is registered with migProfiles"
    elif sign > 0 and slots and not slices:
        dev.problem = (f"{who} holds this MIG GPU without a {keys.POD_MIG_ALLOCATIONS} reservation for it"
                       + (f" ({mig_error})" if mig_error else "")
                       + ": which instance it has is not known, so the GPU takes nothing new (as in HAMi)")
    used = list(dev.slices_used)
    for sl in slices:
        if sign > 0:
            used.append(sl)
        elif sl in used:
            used.remove(sl)
    dev.slices_used = tuple(used)


def node_infos(nodes: Any, pods: Any, cfg: ClusterConfig | None = None,
               exclude: tuple[str, str] | None = None) -> list[NodeInfo]:
    """Every node of a NodeList with the usage of the pods of a PodList. `exclude` (namespace, name) leaves
    one pod out: the pod being scheduled, whose earlier allocation must not count against itself."""
    cfg = cfg or ClusterConfig()
    infos = [node_info(n, cfg, i) for i, n in enumerate(items(nodes, "Node"))]
    by_name = {n.name: n for n in infos}
    if len(by_name) != len(infos):
        names = [n.name for n in infos]
        dup = next(n for n in names if names.count(n) > 1)
        raise ClusterInputError("NodeList", f"node {dup!r} is listed twice")
    for i, pod in enumerate(items(pods, "Pod")):
        meta, _ = _meta(pod, i, "Pod")
        if (pod.get("status") or {}).get("phase") in _ENDED or not placed_by_us(pod, cfg):
            continue
        ns = str(meta.get("namespace") or "default")
        if exclude is not None and (ns, str(meta["name"])) == exclude:
            continue
        node = by_name.get(pod_node(pod) or "")
        if node is None or node.error:
            continue
        who = f"pod {ns}/{meta['name']}"
        try:
            held = _held(pod)
        except (ClusterInputError, RecursionError, ValueError, TypeError) as e:
            node.warnings.append(f"{who} was skipped: {e}; its GPUs count as free on node {node.name}, as in "
                                 "HAMi's scheduler")
            continue
        held, mig_error = _with_reservations(pod, held)
        if mig_error:
            node.warnings.append(f"{who}: its MIG reservations were ignored, as in HAMi's scheduler: {mig_error}")
        if held:
            _charge(node, held, 1, who, mig_error)
    return infos


def _with_reservations(pod: dict, held: tuple) -> tuple[tuple, str | None]:
    """The pod's held GPUs with its hami.io/vgpu-mig-allocations reservations added per GPU, and why that
    annotation could not be read (then it counts as none, as HAMi ignores it)."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.POD_MIG_ALLOCATIONS)
    if text is None:
        return held, None
    if not isinstance(text, str):
        return held, f"{keys.POD_MIG_ALLOCATIONS}: expected a string"
    try:
        return _reserved(held, text), None
    except (ClusterInputError, RecursionError, ValueError, TypeError) as e:
        return held, str(e)


@functools.lru_cache(maxsize=4096)
def _reserved(held: tuple, text: object) -> tuple:
    by_gpu: dict[str, list] = {}
    for _, _, uuid, sl in codec.decode_mig_allocations(text):
        by_gpu.setdefault(uuid, []).append((sl.start, sl.size))
    out = [(uuid, (slots, mem, cores, migs, tuple(slices) + tuple(by_gpu.pop(uuid, ()))))
           for uuid, (slots, mem, cores, migs, slices) in held]
    out += [(uuid, (0, 0, 0, frozenset(), tuple(sl))) for uuid, sl in by_gpu.items()]
    return tuple(out)


def _held(pod: dict) -> tuple:
    """What the pod holds per GPU (collapse of pod_devices), computed once per allocation text: a node's
    usage is rebuilt from its pods whenever one of them changes, and most of them did not."""
    annos = (pod.get("metadata") or {}).get("annotations") or {}
    allocated, pending = annos.get(keys.POD_ALLOCATED, ""), annos.get(keys.POD_TO_ALLOCATE, "")
    allocating = annos.get(keys.POD_BIND_PHASE) == keys.BIND_ALLOCATING
    n_init = len((pod.get("spec") or {}).get("initContainers") or [])
    if not isinstance(allocated, str) or not isinstance(pending, str):
        return _held_of(pod_devices(pod), n_init, init_done(pod))  # raises with the field's name
    return _held_cached(allocated, pending if allocating else None, n_init, init_done(pod))


@functools.lru_cache(maxsize=65536)
def _held_cached(allocated: str, pending: str | None, n_init: int, app_only: bool) -> tuple:
    annos = {keys.POD_ALLOCATED: allocated}
    if pending is not None:
        annos.update({keys.POD_TO_ALLOCATE: pending, keys.POD_BIND_PHASE: keys.BIND_ALLOCATING})
    return _held_of(pod_devices({"metadata": {"annotations": annos}}), n_init, app_only)


def _held_of(pd: PodDevices, n_init: int, app_only: bool) -> tuple:
    return tuple((uuid, (slots, mem, cores, frozenset(migs), tuple(slices)))
                 for uuid, (slots, mem, cores, migs, slices) in collapse(pd, n_init, app_only).items()) if pd else ()
