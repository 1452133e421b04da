"""`pyvgpu wrap --mode mps`: compute shares and memory limits by NVIDIA's Multi-Process Service.

In MPS mode the group's processes run as clients of one MPS control daemon
per user and machine (started by the first `wrap --mode mps`, joined by the
next). MPS enforces the limits it knows:

* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` from ``--sm`` (one value for all of
  the client's devices: MPS has no per-device share for a client);
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` from ``--memory`` (per device, in MiB,
  rounded down so MPS never allows more than the cap).

pyvgpu's shim stays preloaded: the memory cap is also enforced and shown by
it (cuMemGetInfo, NVML and torch see the cap as the total, which MPS alone
does not do), and the group's region records the mode for status, top and
the exporter. pyvgpu's own compute limiter and turns are off in this mode:
the share is MPS's, and two limiters would compound.

Variable names and formats are NVIDIA's (the CUDA MPS documentation,
"Environment Variables").
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import limits as lim

TYPE_CHECKING = False  # not `typing`'s: a plain wrap imports this module (for --mode), and no Path is made here
if TYPE_CHECKING:
    from pathlib import Path

# indexed by layout.MODE_*; HAMi's names (nvidia.com/vgpu-mode). "mig" would be chosen by MIG UUIDs in --devices.
MODES = ("hami-core", "mps")
CONTROL = "nvidia-cuda-mps-control"
START_TIMEOUT_S = 10.0  # the daemon makes its control pipe within this, or the start failed


def control_binary(env: Mapping[str, str]) -> str:
    import shutil

    found = shutil.which(CONTROL, path=env.get("PATH"))
    if not found:
        raise PyvgpuError(f"--mode mps needs {CONTROL} (the NVIDIA driver's MPS daemon) on PATH; install the "
                          "driver's utilities, or use the default --mode hami-core")
    return found


def one_share(shares: lim.SmLimits, source: str) -> int:
    """The group's one active-thread percentage (0 = none): MPS has no per-device share for a client."""
    values = {v for v in shares.as_list() if v}
    if len(values) > 1:
        raise PyvgpuError(f"{source}: MPS gives a client one active-thread percentage for all its devices; "
                          "give one share (--sm 30), or use --mode hami-core for per-device shares")
    return values.pop() if values else 0


def client_env(memory: lim.MemoryLimits, active_threads: int, n_devices: int) -> dict[str, str]:
    """The MPS client variables for the group's limits, for its n_devices devices (numbered as the
    program's CUDA counts them, the numbering MPS uses for a client)."""
    env: dict[str, str] = {}
    if active_threads:
        env[envspec.CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.name] = str(active_threads)
    if memory:
        if n_devices <= 0:
            raise PyvgpuError("--mode mps with a memory cap: NVML cannot count this machine's devices, so the "
                              "MPS pinned-memory limit cannot be written; check the driver with `pyvgpu doctor`")
        caps = memory.as_list()[:n_devices]
        # MiB, rounded down: MPS must never allow more than the cap
        env[envspec.CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.name] = ",".join(f"{d}={c >> 20}M"
                                                                     for d, c in enumerate(caps) if c)
    return env


def _answers(control: str, env: Mapping[str, str]) -> bool:
    """Does a control daemon listen on env's pipe directory? (a bounded query)"""
    import subprocess

    try:
        p = subprocess.run([control], input="get_server_list\n", env=dict(env), capture_output=True, text=True,
                           timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


def ensure_daemon(pipe_dir: Path, log_dir: Path, env: Mapping[str, str]) -> bool:
    """Join the MPS control daemon on pipe_dir, or start it. True if this call started it."""
    import subprocess

    control = control_binary(env)
    denv = {**env, envspec.CUDA_MPS_PIPE_DIRECTORY.name: str(pipe_dir),
            envspec.CUDA_MPS_LOG_DIRECTORY.name: str(log_dir)}
    denv.pop(envspec.LD_PRELOAD.name, None)  # the daemon and its server run unwrapped: they serve every group
    denv.pop(envspec.CUDA_VISIBLE_DEVICES.name, None)  # all of the machine's GPUs; clients choose theirs
    for d in (pipe_dir, log_dir):
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (pipe_dir / "control").exists() and _answers(control, denv):
        return False
    p = subprocess.run([control, "-d"], env=denv, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    if p.returncode != 0:
        raise PyvgpuError(f"{control} -d failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()}; "
                          f"see {log_dir}/control.log")
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(control, denv):
        if time.monotonic() > deadline:
            raise PyvgpuError(f"the MPS control daemon did not answer on {pipe_dir} within {START_TIMEOUT_S:.0f} s; "
                              f"see {log_dir}/control.log")
        time.sleep(0.1)
    return True


def apply(env: dict[str, str], runtime: Path, memory: lim.MemoryLimits, active_threads: int,
          n_devices: int) -> None:
    """Make env an MPS client of this user's control daemon (started if needed), with the group's limits."""
    pipe_dir, log_dir = runtime / "mps" / "pipe", runtime / "mps" / "log"
    extra = client_env(memory, active_threads, n_devices)
    ensure_daemon(pipe_dir, log_dir, env)
    env[envspec.CUDA_MPS_PIPE_DIRECTORY.name] = str(pipe_dir)
    env[envspec.CUDA_MPS_LOG_DIRECTORY.name] = str(log_dir)
    env.update(extra)
    for k in [k for k in env if k.startswith(envspec.CUDA_DEVICE_SM_LIMIT.name)]:
        del env[k]  # the share is MPS's: pyvgpu's limiter stays off


def mode_name(code: int) -> str:
    return MODES[code] if 0 <= code < len(MODES) else f"unknown ({code})"


def check_mode(name: str) -> int:
    if name not in MODES:
        raise PyvgpuError(f"--mode {name!r} is not one of {', '.join(MODES)} (MIG: give MIG instance UUIDs to "
                          "--devices)")
    return MODES.index(name)
