"""The scheduler's configuration: resource names, defaults, policies and the MIG geometry table.

Defaults are HAMi's (charts/hami/values.yaml, charts/hami/templates/scheduler/device-configmap.yaml and
cmd/scheduler/main.go, v2.8.0): nvidia.com/gpu, gpumem, gpumem-percentage, gpucores; defaultMemory 0,
defaultCores 0, defaultGPUNum 1, memoryFactor 1; node policy binpack, GPU policy spread.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.model import Geometry, MigTemplate


@dataclass(frozen=True)
class ResourceNames:
    """The container resource names a pod asks GPUs with."""

    count: str = "nvidia.com/gpu"
    memory: str = "nvidia.com/gpumem"  # MiB per GPU
    memory_percentage: str = "nvidia.com/gpumem-percentage"  # percent of each GPU's memory
    cores: str = "nvidia.com/gpucores"  # percent of each GPU's compute


@dataclass(frozen=True)
class MigModels:
    """The MIG geometries a family of GPU models can be split by (HAMi: knownMigGeometries)."""

    models: tuple[str, ...]  # matched as substrings of the registered device type, first entry wins
    geometries: tuple[Geometry, ...]  # tried in this order for a GPU with no instance in use


def _g(*templates: tuple[str, int, int, int]) -> Geometry:
    return tuple(MigTemplate(name, core, memory, count) for name, core, memory, count in templates)


# The default table. Geometries, sizes and names: HAMi v2.8.0 charts/hami/templates/scheduler/
# device-configmap.yaml (knownMigGeometries), which follow NVIDIA's MIG profiles. Model strings
# include both HAMi's spellings and the product names NVML reports (e.g. "NVIDIA H100 80GB HBM3"),
# since the registered type is NVML's name. Order matters: the first entry whose model is a
# substring of the device type wins.
DEFAULT_MIG_MODELS: tuple[MigModels, ...] = (
    MigModels(("A30",), (_g(("1g.6gb", 25, 6144, 4)), _g(("2g.12gb", 50, 12288, 2)), _g(("4g.24gb", 100, 24576, 1)))),
    MigModels(("A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"),
              (_g(("1g.5gb", 14, 5120, 7)),
               _g(("1g.5gb", 14, 5120, 1), ("2g.10gb", 28, 10240, 3)),
               _g(("3g.20gb", 42, 20480, 2)),
               _g(("7g.40gb", 100, 40960, 1)))),
    MigModels(("A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB", "A100 80GB PCIe"),
              (_g(("1g.10gb", 14, 10240, 7)),
               _g(("1g.10gb", 14, 10240, 1), ("2g.20gb", 28, 20480, 3)),
               _g(("3g.40gb", 42, 40960, 2)),
               _g(("7g.79gb", 100, 80896, 1)))),
    MigModels(("H100-PCIE-94GB", "H100-SXM5-94GB", "H100 NVL"),
              (_g(("1g.12gb", 14, 12288, 7)),
               _g(("1g.12gb", 14, 12288, 1), ("2g.24gb", 28, 24576, 3)),
               _g(("3g.47gb", 42, 48128, 2)),
               _g(("7g.94gb", 100, 96256, 1)))),
    MigModels(("H100-PCIE-80GB", "H100-SXM5-80GB", "H100 80GB HBM3", "H100 PCIe"),
              (_g(("1g.10gb", 14, 10240, 7)),
               _g(("1g.10gb", 14, 10240, 1), ("2g.20gb", 28, 20480, 3)),
               _g(("3g.40gb", 42, 40960, 2)),
               _g(("7g.80gb", 100, 81920, 1)))),
)


@dataclass(frozen=True)
class ClusterConfig:
    """Everything the core reads besides the cluster itself. Frozen: one config serves many decisions."""

    resources: ResourceNames = ResourceNames()
    default_memory: int = 0  # MiB for a container that asks none; 0 = 100% of the GPU (HAMi defaultMemory)
    default_cores: int = 0  # percent for a container that asks none (HAMi defaultCores)
    default_gpu_num: int = 1  # GPUs for a container that asks memory or cores but no count (HAMi webhook)
    memory_factor: int = 1  # the memory asked is multiplied by this (HAMi memoryFactor)
    # A container that asks GPUs, no cores and no memory (or 100%) gets 100 cores: the GPU alone (HAMi's
    # webhook, defaultExclusiveCoreIfNeeded, v2.10).
    exclusive_core_default: bool = True
    node_policy: str = keys.BINPACK
    gpu_policy: str = keys.SPREAD
    mig_models: tuple[MigModels, ...] = DEFAULT_MIG_MODELS
    # How many placements of a multi-container pod one node's search may try before it gives up.
    # One container never searches; only containers that share GPUs and do not fit the first way do.
    search_budget: int = 20_000
    # Pods whose spec.schedulerName is one of these count on their node and are Allocate's candidates: the
    # webhook lets only pyvgpu write their allocation annotations. A pod any other scheduler placed (or none)
    # carries nothing pyvgpu trusts (docs/security.md).
    scheduler_names: tuple[str, ...] = ("pyvgpu-scheduler",)

    def mig_geometries(self, device_type: str) -> tuple[Geometry, ...]:
        """The geometries of a GPU model: the first table entry with a model that is a substring of it."""
        for entry in self.mig_models:
            if any(m in device_type for m in entry.models):
                return entry.geometries
        return ()
