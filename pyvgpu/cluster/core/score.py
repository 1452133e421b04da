"""The device score and the node score, from current usage, Weight 10 (docs/cluster.md, "Scores").

    DeviceScore = 10 * ((request + used) / count + (coresReq + usedCores) / totalCores + (memReq + usedMem) / totalMem)
    NodeScore   = 10 * (sum used / sum count + sum usedCores / sum totalCores + sum usedMem / sum totalMem)

HAMi computes them in float32 (pkg/scheduler/policy/gpu_policy.go ComputeScore, node_policy.go
ComputeDefaultScore); this is float64, which orders the same except on near-ties. `request` is what one
container takes from one GPU: one slot (HAMi counts 1 per container request, whatever the GPU count).
A GPU or node with no slots, cores or memory scores 0, as in HAMi. HAMi's NVIDIA OverrideScore adds 0
(pkg/device/nvidia/device.go ScoreNode), so the node score is the default score alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyvgpu.cluster.core.model import DeviceUsage

WEIGHT = 10


def device_score(dev: DeviceUsage, mem: int, cores: int, request: int = 1,
                 weights: tuple[int, int, int] = (1, 1, 1)) -> float:
    """How full `dev` would be with one more container of `mem` MiB and `cores` %: 0 (empty) to 30 (full)
    with the default weights; `weights` (slot, core, memory) scale the three parts (HAMi v2.10,
    hami.io/device-scoring-weights)."""
    if dev.count == 0 or dev.totalcore == 0 or dev.totalmem == 0:
        return 0.0
    ws, wc, wm = weights
    return WEIGHT * (ws * (request + dev.used) / dev.count + wc * (cores + dev.usedcores) / dev.totalcore
                     + wm * (mem + dev.usedmem) / dev.totalmem)


def node_score(devices: Iterable[DeviceUsage]) -> float:
    """How full a node is now, over all its registered GPUs: 0 (empty) to 30 (full)."""
    used = count = ucores = tcores = umem = tmem = 0
    for d in devices:
        used += d.used
        count += d.count
        ucores += d.usedcores
        tcores += d.totalcore
        umem += d.usedmem
        tmem += d.totalmem
    if count == 0 or tcores == 0 or tmem == 0:
        return 0.0
    return WEIGHT * (used / count + ucores / tcores + umem / tmem)
