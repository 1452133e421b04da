"""Rendering a Decision for people (a text report) and for scripts (JSON)."""

from __future__ import annotations

import re
import textwrap
from typing import Any

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.model import ContainerRequest, Decision, Placement

_GPU_PART = re.compile(r"(?::|;) (?=GPU \d+ )")
_ORDER = {keys.BINPACK: ("fullest node first", "most used GPU first"),
          keys.SPREAD: ("emptiest node first", "least used GPU first")}


def _ask(c: ContainerRequest) -> str:
    mem = f"{c.memreq} MiB" if c.memreq > 0 else f"{c.mem_percentage}% of the memory"
    return f"{c.nums} GPU(s), {mem} and {c.coresreq}% cores each"


def _mig(p: Placement) -> str:
    if p.mig_slice is not None:  # dynamic MIG: the profile and its placement on the GPU
        return f" {p.mig_template} at slice {p.mig_slice[0]}, {p.mig_slice[1]} slice(s)"
    return f" {p.mig_template} [{p.mig_geometry}-{p.mig_instance}]" if p.mig_template else ""


def to_json(d: Decision) -> dict[str, Any]:
    """The documented schema: node, annotations, nodes[{name, fits, score, reason}], plus the request and
    the GPUs per container."""
    r = d.request
    containers = []
    for i, c in enumerate(r.containers):
        placed = d.placements[i] if i < len(d.placements) else ()
        containers.append({
            "name": c.name, "init": c.init, "gpus": c.nums, "memory_mib": c.memreq or None,
            "memory_percentage": None if c.memreq else c.mem_percentage, "cores": c.coresreq,
            "devices": [{"uuid": p.uuid, "index": p.index, "mode": p.mode, "memory_mib": p.usedmem,
                         "cores": p.usedcores, "mig_template": p.mig_template,
                         "mig_placement": None if p.mig_slice is None else
                         {"start": p.mig_slice[0], "size": p.mig_slice[1]}} for p in placed],
        })
    return {
        "pod": d.pod,
        "node": d.node,
        "annotations": dict(d.annotations),
        "policy": {"node": d.node_policy, "gpu": d.gpu_policy, "topology_aware": r.topology,
                   "numa_bind": r.numa_bind, "modes": list(r.modes)},
        "warnings": list(d.warnings),
        "containers": containers,
        "nodes": [{"name": n.name, "fits": n.fits, "score": None if n.score is None else round(n.score, 4),
                   "reason": n.reason} for n in d.nodes],
    }


def to_text(d: Decision, width: int = 100) -> str:
    r = d.request
    out = []
    asking = [c for c in r.containers if c.nums > 0]
    out.append(f"pod {d.pod}: {len(asking)} of {len(r.containers)} container(s) ask GPUs")
    for c in asking:
        out.append(f"  {'init ' if c.init else ''}container {c.name}: {_ask(c)}")
    extra = [keys.TOPOLOGY] if r.topology else []
    if r.numa_bind:
        extra.append("numa-bind")
    if r.modes:
        extra.append(f"modes {','.join(r.modes)}")
    for name, vals in (("types", r.use_types), ("not types", r.nouse_types), ("UUIDs", r.use_uuids),
                       ("not UUIDs", r.nouse_uuids)):
        if vals:
            extra.append(f"{name} {','.join(vals)}")
    if r.mutex:
        extra.append("mutex (unused GPUs only)")
    if r.gpu_chain:
        extra.append(f"GPU sort keys {','.join(r.gpu_chain)}")
    if r.weights != (1, 1, 1):
        extra.append("scoring weights slot={},core={},memory={}".format(*r.weights))
    out.append(f"policy: node {d.node_policy} ({_ORDER[d.node_policy][0]}), GPU {d.gpu_policy} "
               f"({_ORDER[d.gpu_policy][1]})" + ("; " + "; ".join(extra) if extra else ""))
    for w in d.warnings:
        out.extend(textwrap.wrap(w, width=max(width - 2, 40), initial_indent="warning: ",
                                 subsequent_indent="  "))
    out.append("")
    if not r.wants_gpus:
        out.append("decision: the pod asks no GPU; the GPU scheduler leaves the node to kube-scheduler")
    elif d.node is None:
        out.append("decision: no node fits; the pod stays Pending (the reasons per node are below)")
    else:
        out.append(f"decision: {d.node}")
        for c, placed in zip(r.containers, d.placements, strict=True):
            if placed:
                gpus = "; ".join(f"GPU {p.index} {p.uuid} ({p.mode}"
                                 + _mig(p)
                                 + f") {p.usedmem} MiB {p.usedcores}%" for p in placed)
                out.append(f"  {c.name}: {gpus}")
        out.append("")
        out.append("annotations the scheduler would write:")
        for k, v in d.annotations.items():
            out.append(f"  {k}: {v}")
        out.append(f"  (and {keys.POD_TIME}, {keys.POD_BIND_TIME}: the time of writing)")
    out.append("")
    n_fit = sum(1 for n in d.nodes if n.fits)
    out.append(f"nodes: {n_fit} of {len(d.nodes)} fit" + (f", best first ({_ORDER[d.node_policy][0]})"
                                                           if r.wants_gpus and n_fit else ""))
    name_w = max([4] + [len(n.name) for n in d.nodes])
    out.append(f"  {'RANK':<5} {'NODE':<{name_w}} {'FITS':<4} {'SCORE':>6}  REASON")
    rank = 0
    for n in d.nodes:
        rank += n.fits
        score = "-" if n.score is None else f"{n.score:.2f}"
        row = f"  {(str(rank) if n.fits and r.wants_gpus else '-'):<5} {n.name:<{name_w}} " \
              f"{'yes' if n.fits else 'no':<4} {score:>6}"
        if not n.reason:
            out.append(row)
            continue
        if n.fits:
            out.append(f"{row}  {n.reason}")
            continue
        out.append(row)
        # One line for the container, one per GPU refusal (place.container_reason joins them with "; GPU").
        head, *gpus = _GPU_PART.split(n.reason)
        for i, part in enumerate([head, *gpus]):
            indent = " " * (8 if i == 0 else 10)
            out.extend(textwrap.wrap(part, width=max(width - len(indent), 40), initial_indent=indent,
                                     subsequent_indent=indent + "  "))
    return "\n".join(out)
