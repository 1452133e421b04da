"""The environment contract: every variable pyvgpu reads or writes, declared once.

Each :class:`Var` gives the name, its type and default, what it means, HAMi's
equivalent where there is one, and who reads it: the shim's C (``shim``),
Python (``python``) or both. Code names a variable through this module
(``envspec.SM_TURN.name``), never by a string literal; tests/test_envspec.py
fails on a literal anywhere else in pyvgpu/ or shim/src/. From the same table
scripts/gen_shim.py writes shim/generated/pv_env_names.h (``PV_ENV_SM_TURN``
and so on, for the C) and the table of docs/environment.md.

A variable with ``per_device`` is also read as NAME_<i> for device i
(:meth:`Var.device`, :attr:`Var.prefix`).

HAMi's names are facts, with their source: Project-HAMi/HAMi
pkg/device/nvidia/device.go (the variables its device plugin sets in a
container) and Project-HAMi/HAMi-core (the library that reads them).

Imported by the fast wrap path (pyvgpu/fastwrap.py): the standard library only.
"""

from __future__ import annotations

from pyvgpu.contract.record import record

SHIM, PYTHON, BOTH = "shim", "python", "both"
HAMI = "HAMi"  # the origin of a variable HAMi defines and pyvgpu reads as HAMi does


@record(frozen=True)
class Var:
    """One environment variable of the contract."""

    key: str  # the attribute of this module and the C macro's suffix: PV_ENV_<key>
    name: str
    type: str
    default: str
    meaning: str
    readers: str  # SHIM, PYTHON or BOTH
    hami: str = ""  # HAMi's equivalent, or HAMI when the variable is HAMi's own
    per_device: bool = False  # NAME_<i> sets device i

    @property
    def prefix(self) -> str:
        """NAME_, the start of a per-device variable's name."""
        return self.name + "_"

    def device(self, i: int) -> str:
        """The variable for device ``i`` alone."""
        return f"{self.prefix}{i}"

    @property
    def c_macro(self) -> str:
        return f"PV_ENV_{self.key}"


# --- HAMi's variables (its device plugin sets them; pyvgpu reads them as HAMi-core does) and the device lists ---
CUDA_DEVICE_MEMORY_LIMIT = Var(
    "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT", "size", "none",
    "the memory cap of every device (NAME_i: of device i alone)", BOTH, HAMI, per_device=True)
CUDA_DEVICE_SM_LIMIT = Var(
    "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_SM_LIMIT", "percent", "0 (none)",
    "the compute share of every device (NAME_i: of device i alone)", BOTH, HAMI, per_device=True)
CUDA_DEVICE_MEMORY_SHARED_CACHE = Var(
    "CUDA_DEVICE_MEMORY_SHARED_CACHE", "CUDA_DEVICE_MEMORY_SHARED_CACHE", "path", "unset",
    "the group's region file, when PYVGPU_REGION is unset", BOTH, HAMI)
GPU_CORE_UTILIZATION_POLICY = Var(
    "GPU_CORE_UTILIZATION_POLICY", "GPU_CORE_UTILIZATION_POLICY", "default|force|disable", "default",
    "force: always cap; disable: never; default: follow the group's switch", BOTH, HAMI)
CUDA_TASK_PRIORITY = Var(
    "CUDA_TASK_PRIORITY", "CUDA_TASK_PRIORITY", "0|1|high|low", "low",
    "a new group's priority (HAMi's 0 high, 1 low)", BOTH, HAMI)
CUDA_VISIBLE_DEVICES = Var(
    "CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "list", "unset",
    "CUDA's device list: bounds `--devices`; wrap and Allocate (as HAMi's) set it to the group's UUIDs",
    PYTHON)
NVIDIA_VISIBLE_DEVICES = Var(
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "list", "unset",
    "the container runtime's device list; Allocate (as HAMi's) sets it to the GPUs' UUIDs", PYTHON)

# --- pyvgpu's own ---
REGION = Var("REGION", "PYVGPU_REGION", "path", "unset",
             "the group's region file; the shim sets it so that children join the group", BOTH,
             "CUDA_DEVICE_MEMORY_SHARED_CACHE")
SCHED = Var("SCHED", "PYVGPU_SCHED", "path", "the machine's turn file",
            "the turn file groups with a share take turns through", BOTH)
SM_TURN = Var("SM_TURN", "PYVGPU_SM_TURN", "0|1", "1",
              "1: groups with a share take turns on a GPU; 0: they time-slice it", BOTH)
SM_BATCH_MS = Var("SM_BATCH_MS", "PYVGPU_SM_BATCH_MS", "ms (0-1000)", "10",
                  "how far a group may run ahead of its share, so that held launches leave together (a gang: 100 at "
                  "least)", BOTH)
SM_BORROW = Var("SM_BORROW", "PYVGPU_SM_BORROW", "on|off", "off (a cap)",
                "a new group's borrowing of idle GPU time beyond its share", BOTH)
CLOCK = Var("CLOCK", "PYVGPU_CLOCK", "auto|tsc|system", "auto", "the clock a launch under a share reads", BOTH)
MIN_MEMORY = Var("MIN_MEMORY", "PYVGPU_MIN_MEMORY", "size", "64M",
                 "the smallest memory cap accepted (lowered for simulated drivers)", BOTH)
TRUST_SHARED = Var("TRUST_SHARED", "PYVGPU_TRUST_SHARED", "0|1", "0",
                   "1: use regions and turn files another user owns or others can write", BOTH)
ON_ERROR = Var("ON_ERROR", "PYVGPU_ON_ERROR", "closed|open", "closed",
               "when the shim cannot enforce the limits: refuse GPU calls, or pass them with a warning", BOTH)
STATS = Var("STATS", "PYVGPU_STATS", "1|path", "unset",
            "per-call statistics at exit: a table on stderr (1) or JSON appended to a file; wrap sets it", SHIM)
CALLBACKS = Var("CALLBACKS", "PYVGPU_CALLBACKS", "path", "the cached or packaged library",
                "the callback library the shim loads; wrap sets it", BOTH)
CACHE_DIR = Var("CACHE_DIR", "PYVGPU_CACHE_DIR", "path", "$XDG_CACHE_HOME/pyvgpu, else ~/.cache/pyvgpu",
                "the compiled-callback cache", BOTH)
REAL_LIBCUDA = Var("REAL_LIBCUDA", "PYVGPU_REAL_LIBCUDA", "path", "libcuda.so.1",
                   "the CUDA driver the shim forwards to", BOTH)
REAL_LIBNVML = Var("REAL_LIBNVML", "PYVGPU_REAL_LIBNVML", "path", "libnvidia-ml.so.1",
                   "the NVML library the shim forwards to", SHIM)
SHIM_PATH = Var("SHIM_PATH", "PYVGPU_SHIM", "path", "the installed libpyvgpu.so", "the shim wrap preloads", PYTHON)
ALLOCATOR = Var("ALLOCATOR", "PYVGPU_ALLOCATOR", "vpmm", "unset",
                "vpmm: the startup hook makes VPMM PyTorch's allocator", PYTHON)
GROUP_IDLE_HOURS = Var("GROUP_IDLE_HOURS", "PYVGPU_GROUP_IDLE_HOURS", "hours", "12",
                       "a named group unused this long with no live member expires (0: never)", PYTHON)
BENCH_RANKS = Var("BENCH_RANKS", "PYVGPU_BENCH_RANKS", "int", "2", "processes of the all-reduce benchmark", PYTHON)
BENCH_STACKS = Var("BENCH_STACKS", "PYVGPU_BENCH_STACKS", "path", "unset",
                   "a bench load writes each process's thread stacks here (stacks.PID) on SIGUSR1", PYTHON)
DECODE = Var("DECODE", "PYVGPU_DECODE", "torch", "unset",
             "torch: the VPMM loop benchmark decodes with the torch model", PYTHON)

# --- VPMM's (pyvgpu/vpmm/pool.py; arguments win over them) ---
VPMM_PAGE_SIZE = Var("VPMM_PAGE_SIZE", "VPMM_PAGE_SIZE", "bytes", "2 MiB",
                     "VPMM's page, at least the device's VMM granularity", PYTHON)
VPMM_VA_SIZE = Var("VPMM_VA_SIZE", "VPMM_VA_SIZE", "bytes", "8 TiB", "VPMM's address space per reserved chunk",
                   PYTHON)
VPMM_PAGES = Var("VPMM_PAGES", "VPMM_PAGES", "int", "0", "VPMM's pages mapped at start", PYTHON)
VPMM_GAP = Var("VPMM_GAP", "VPMM_GAP", "bytes", "1 GiB",
               "address space VPMM leaves free beside a span in a fresh hole, so that it can grow in place", PYTHON)
VPMM_CONTEXT = Var("VPMM_CONTEXT", "VPMM_CONTEXT", "pool|caller", "pool",
                   "the context VPMM's driver calls run in: the device's primary one, or the caller's", PYTHON)

# --- other programs' variables that pyvgpu sets or reads ---
LD_PRELOAD = Var("LD_PRELOAD", "LD_PRELOAD", "paths", "unset", "the dynamic loader's preload: wrap puts the shim "
                 "first", PYTHON)
PYTHONPATH = Var("PYTHONPATH", "PYTHONPATH", "paths", "unset",
                 "wrap puts the startup hook's directory first (with PYVGPU_ALLOCATOR=vpmm)", PYTHON)
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = Var(
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "percent", "unset",
    "mode mps: the clients' share, from --sm", PYTHON)
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT = Var(
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "list", "unset",
    "mode mps: the clients' memory caps, from --memory", PYTHON)
CUDA_MPS_PIPE_DIRECTORY = Var("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PIPE_DIRECTORY", "path", "unset",
                              "mode mps: the group's MPS daemon's pipes", PYTHON)
CUDA_MPS_LOG_DIRECTORY = Var("CUDA_MPS_LOG_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "path", "unset",
                             "mode mps: the group's MPS daemon's logs", PYTHON)
XDG_RUNTIME_DIR = Var("XDG_RUNTIME_DIR", "XDG_RUNTIME_DIR", "path", "unset: /tmp/pyvgpu-UID is used",
                      "groups, private regions and a user's own turn file live in $XDG_RUNTIME_DIR/pyvgpu", BOTH)
XDG_CACHE_HOME = Var("XDG_CACHE_HOME", "XDG_CACHE_HOME", "path", "~/.cache", "the cache's parent", BOTH)
NODE_NAME = Var("NODE_NAME", "NODE_NAME", "name", "unset", "the node agent's node, when --node is not given",
                PYTHON)

HOME = Var("HOME", "HOME", "path", "unset", "the cache's parent when XDG_CACHE_HOME is unset", BOTH)
CC = Var("CC", "CC", "command", "gcc, else cc", "the C compiler that builds the callbacks", PYTHON)
NUMBA_OPT = Var("NUMBA_OPT", "NUMBA_OPT", "int", "numba's", "numba's optimisation level: 0 while the "
                "callbacks compile (pyvgpu/native/aot.py optimises the linked module once)", PYTHON)
KUBERNETES_SERVICE_HOST = Var("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_HOST", "host", "unset",
                              "set inside a pod: the cluster commands use the in-cluster configuration", PYTHON)
PYTORCH_CUDA_ALLOC_CONF = Var("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "text", "unset",
                              "PyTorch's allocator settings: the VPMM benchmarks set or clear them", PYTHON)
# Not declared: PATH (the command search path, read where a program is looked up as the shell does; its name
# is also the usual metavar of a path option), and torch.distributed's RANK, LOCAL_RANK, WORLD_SIZE,
# MASTER_ADDR and MASTER_PORT, which the all-reduce benchmark (pyvgpu/bench/sm_worker.py) sets as torch
# documents them.

VARS: tuple[Var, ...] = tuple(v for v in globals().values() if isinstance(v, Var))
BY_NAME: dict[str, Var] = {v.name: v for v in VARS}
NAMESPACE = "PYVGPU_"  # every variable of pyvgpu's own starts so
PER_DEVICE: tuple[Var, ...] = tuple(v for v in VARS if v.per_device)


def c_header() -> str:
    """The body of shim/generated/pv_env_names.h: one macro per variable, and NAME_ for each per-device one."""
    lines = []
    for v in VARS:
        lines.append(f'#define {v.c_macro} "{v.name}"')
        if v.per_device:
            lines.append(f'#define {v.c_macro}_PREFIX "{v.prefix}"')
    return "\n".join(lines)


def markdown_table() -> str:
    """The table of docs/environment.md."""
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    rows = ["| Variable | Type | Default | Meaning | HAMi | Read by |", "|---|---|---|---|---|---|"]
    for v in VARS:
        name = f"`{v.name}`" + (f", `{v.prefix}<i>`" if v.per_device else "")
        hami = "HAMi's own" if v.hami == HAMI else (f"`{v.hami}`" if v.hami else "")
        rows.append(f"| {name} | {cell(v.type)} | {cell(v.default)} | {cell(v.meaning)} | {hami} | {v.readers} |")
    return "\n".join(rows)
