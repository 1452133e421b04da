"""The wire names HAMi uses, exactly, so a cluster can move from HAMi to pyvgpu node by node.

Sources (Project-HAMi/HAMi): pkg/device/nvidia/device.go (node and pod annotation keys, modes),
pkg/util/types.go (vgpu-node, bind-phase, policy keys and values), pkg/device/nvidia/device.go
InitNvidiaDevice (the two allocation annotations), pkg/device/devices.go (separators).
"""

# Node annotations, written by the node agent (HAMi: the device plugin).
NODE_REGISTER = "hami.io/node-nvidia-register"
NODE_PAIR_SCORE = "hami.io/node-nvidia-score"
NODE_HANDSHAKE = "hami.io/node-handshake"
# The per-node lock a bind holds (pkg/util/nodelock/nodelock.go): "<RFC 3339 time>,<namespace>,<pod>".
NODE_LOCK = "hami.io/mutex.lock"
# A live, per-GPU cordon: comma-separated UUIDs that take no new allocation (newer HAMi).
NODE_DEVICE_CORDON = "hami.io/device-cordon"

# Pod annotations written by the scheduler (filter, then bind).
POD_NODE = "hami.io/vgpu-node"
POD_TIME = "hami.io/vgpu-time"
POD_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
POD_ALLOCATED = "hami.io/vgpu-devices-allocated"
POD_BIND_PHASE = "hami.io/bind-phase"
POD_BIND_TIME = "hami.io/bind-time"
# HAMi v2.10's dynamic MIG: each MIG instance the scheduler gives, as JSON [{containerIndex, deviceIndex,
# gpuUUID, profile, placement: {start, size}, and once made: migUUID, gpuInstanceID, computeInstanceID}]
# (pkg/device/nvidia/mig_allocations.go MigAllocationsAnnotation).
POD_MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
BIND_ALLOCATING = "allocating"
BIND_SUCCESS = "success"
BIND_FAILED = "failed"

# Pod annotations a user writes.
NODE_POLICY = "hami.io/node-scheduler-policy"
GPU_POLICY = "hami.io/gpu-scheduler-policy"
USE_TYPE = "nvidia.com/use-gputype"
NOUSE_TYPE = "nvidia.com/nouse-gputype"
USE_UUID = "nvidia.com/use-gpuuuid"
NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
VGPU_MODE = "nvidia.com/vgpu-mode"
NUMA_BIND = "nvidia.com/numa-bind"
# Per-pod weights of the device score, "slot=1,core=1,memory=3" (pkg/util/types.go, v2.10).
SCORING_WEIGHTS = "hami.io/device-scoring-weights"

# Policy values.
BINPACK = "binpack"
SPREAD = "spread"
TOPOLOGY = "topology-aware"
MUTEX = "mutex"  # only GPUs nothing uses (pkg/util/types.go GPUSchedulerPolicyMutex)
NUMA = "numa"  # a sort key of a comma list: the lower NUMA node first
GPU_POLICY_WORDS = (BINPACK, SPREAD, TOPOLOGY, MUTEX, NUMA)

# Device modes (docs/cluster.md, "Modes").
HAMI_CORE = "hami-core"
MIG = "mig"
MPS = "mps"
MODES = (HAMI_CORE, MIG, MPS)

# The device type written in an allocation entry (HAMi's NvidiaGPUDevice common word).
DEVICE_TYPE = "NVIDIA"

# Allocation encoding separators (pkg/device/devices.go): after every device, after every container.
DEVICE_SEP = ":"
CONTAINER_SEP = ";"
