"""`pyvgpu wrap`: prepare the environment of a vGPU and exec the program.

The program replaces this process (os.execvpe), so it keeps the pid, and
its exit code and signals reach the caller unchanged. Paths are text here (os.path), as in every module a
plain wrap imports: pathlib would cost a wrap more than its own work (pyvgpu/fastwrap.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from pyvgpu.contract import envspec
from pyvgpu.contract.record import record
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import limits as lim
from pyvgpu.group import mps, region
from pyvgpu.group import turnfile as sched
from pyvgpu.group.spec import GroupSpec
from pyvgpu.host import devices
from pyvgpu.host.driver import DRIVER_FIX, driver_problem
from pyvgpu.native import cache, choice, groupfiles
from pyvgpu.native.shim import BOOT, shim_file

ON_ERROR_CHOICES = ("closed", "open")


def check_on_error(text: str) -> str:
    """``closed`` or ``open`` (envspec.ON_ERROR's values); the message names --on-error."""
    if text not in ON_ERROR_CHOICES:
        raise PyvgpuError(f"--on-error {text!r} is not one of {', '.join(ON_ERROR_CHOICES)}")
    return text


def check_allocator(text: str) -> str:
    """``default`` or ``vpmm``; the message names --allocator."""
    from pyvgpu.vpmm.torch_startup import ALLOCATORS

    if text not in ALLOCATORS:
        raise PyvgpuError(f"--allocator {text!r} is not one of {', '.join(ALLOCATORS)}")
    return text


def check_mode(text: str) -> str:
    """``hami-core`` or ``mps``; the message names --mode."""
    mps.check_mode(text)
    return text


def check_priority(text: str) -> str:
    """``high`` or ``low`` (also HAMi's 0 and 1, any case), as the word; the message names --priority."""
    return lim.PRIORITIES[lim.parse_priority(text, "--priority")]


@record(frozen=True)  # a frozen dataclass's behaviour without importing dataclasses (contract/record.py)
class WrapRequest:
    """What one `pyvgpu wrap` asks for, checked once when it is made (both command lines build one, and
    pyvgpu's benches), then passed down whole. None: not asked; the environment's variable, else the group's
    setting, applies (:func:`group_spec`, the one place the two meet). --memory and --sm are parsed when it is
    made (:attr:`memory_limits`, :attr:`sm_shares`; the text stays the field, for messages); --devices stays
    text until it is read against the machine's devices."""

    memory: str | None = None  # --memory: SIZE or DEV=SIZE,...
    sm: str | None = None  # --sm: PCT or DEV=PCT,...
    devices: str | None = None  # --devices: indices or UUIDs
    group: str | None = None  # --group NAME
    region_path: str | None = None  # --region PATH
    allocator: str | None = None  # one of bootstrap.ALLOCATORS
    on_error: str | None = None  # one of ON_ERROR_CHOICES
    mode: str | None = None  # one of mps.MODES
    priority: str | None = None  # high or low (HAMi's 0 and 1 are read as these)
    sm_borrow: bool | None = None  # --sm-borrow (True) or --sm-cap (False)
    stats: str | None = None  # envspec.STATS: "1", or the file to append the counts to
    join: bool = True  # create or join a group region (False: only the shim and its callbacks)
    callbacks: str | None = None  # the callback library to name (None: pyvgpu.native.choice's)

    def __post_init__(self) -> None:
        if self.on_error is not None:
            check_on_error(self.on_error)
        if self.allocator is not None:
            check_allocator(self.allocator)
        if self.mode is not None:
            check_mode(self.mode)
        if self.priority is not None:
            object.__setattr__(self, "priority", check_priority(self.priority))  # one spelling from here on
        if self.group and self.region_path:
            raise PyvgpuError("give --group or --region, not both")
        if self.group:  # an empty --group= is none, as before
            region.check_group_name(self.group)
        # parsed once, here; the text stays the field (the source in messages, and what both parsers compare)
        object.__setattr__(self, "_memory", None if self.memory is None else lim.parse_memory_option(self.memory))
        object.__setattr__(self, "_sm", None if self.sm is None else lim.parse_sm_option(self.sm))
        if not self.join:
            for what, value in (("--devices", self.devices), ("--mode", self.mode), ("--priority", self.priority),
                                ("--sm-borrow", self.sm_borrow)):
                if value is not None:
                    raise PyvgpuError(f"{what} needs a group region")

    @property
    def memory_limits(self) -> lim.MemoryLimits | None:
        """--memory, parsed (None: not asked)."""
        return self._memory

    @property
    def sm_shares(self) -> lim.SmLimits | None:
        """--sm, parsed (None: not asked)."""
        return self._sm

    @classmethod
    def from_options(cls, *, stats: bool = False, stats_file: str | None = None, **options: object) -> WrapRequest:
        """From wrap's command-line options (both parsers' names): --stats and --stats-file make ``stats``."""
        return cls(stats=stats_file or ("1" if stats else None), **options)  # type: ignore[arg-type]


def _prepend(item: str, current: str | None, sep: str) -> str:
    parts = [p for p in (current or "").split(sep) if p and p != item]
    return sep.join([item, *parts])


def build_env(base: Mapping[str, str], request: WrapRequest) -> dict[str, str]:
    """The wrapped program's environment: ``base`` plus the shim, its callbacks and the group ``request`` asks
    for (the callbacks compiled first if none fits, with progress on stderr)."""
    env = _with_shim(base, request)
    check_program_env(env)
    if request.join:
        join_group(env, request)
    return env


def _with_shim(base: Mapping[str, str], request: WrapRequest) -> dict[str, str]:
    """``base`` with the shim preloaded, the callbacks it loads, and the request's shim settings."""
    shim = shim_file()
    if not os.path.exists(shim):
        from pyvgpu.native.shim import missing_fix

        raise PyvgpuError(f"the shim {shim} is missing; {missing_fix()}")
    env = dict(base)
    # LD_PRELOAD may be separated by spaces or colons; keep the user's entries after ours.
    user_preload = " ".join(env.get(envspec.LD_PRELOAD.name, "").replace(":", " ").split())
    env[envspec.LD_PRELOAD.name] = _prepend(shim, user_preload, " ")
    # The compiled callbacks this pyvgpu chose (the shim would choose alike, except in a source tree
    # edited since its build, whose callbacks only the cache has). A user's own setting wins.
    if not env.get(envspec.CALLBACKS.name):
        env[envspec.CALLBACKS.name] = request.callbacks or choice.choose(workers=cache.cli_workers())
    if request.stats:
        env[envspec.STATS.name] = request.stats
    if request.on_error:
        env[envspec.ON_ERROR.name] = request.on_error
    if request.allocator is not None:
        env[envspec.ALLOCATOR.name] = request.allocator
    if env.get(envspec.ALLOCATOR.name) == "vpmm":  # the startup hook makes VPMM PyTorch's allocator
        env[envspec.PYTHONPATH.name] = _prepend(BOOT, env.get(envspec.PYTHONPATH.name), os.pathsep)
    return env


def check_program_env(env: Mapping[str, str]) -> None:
    """The variables the program's shim reads, checked now: a bad one is an error before the program starts."""
    lim.sm_policy(env)  # GPU_CORE_UTILIZATION_POLICY
    lim.sm_batch_ns(env)
    lim.clock_mode(env)
    sched.enabled(env)
    lim.priority_from_env(env)
    lim.sm_borrow_from_env(env)


def check_physical(limits: lim.MemoryLimits, source: str, chosen: list[devices.Gpu] | None = None) -> int:
    """A limit above a device's memory, or for a device the group lacks, is an error (when NVML can tell).

    Device d of the limits is the group's device d: the d-th of --devices when given.
    Returns the number of devices the group has (0 if NVML cannot tell, or if there
    is nothing to check: initialising NVML costs a wrapped program ~0.1 s)."""
    if not limits and not chosen:
        return 0
    if chosen:
        phys = [g.total for g in chosen]
        what = f"{len(phys)} with --devices"
    else:
        phys = devices.physical_memory()
        if phys is None:
            return 0
        what = f"this machine has {len(phys)}"
    for d in sorted(limits.per_device):
        if d >= len(phys):
            raise PyvgpuError(f"{source}: there is no device {d} ({what})")
    for d, total in enumerate(phys):
        want = limits.for_device(d)
        if want and want > total:
            raise PyvgpuError(f"{source}: {lim.human(want)} is more than device {d}'s {lim.human(total)}; "
                              "give a limit at most the device's memory")
    return len(phys)


def _drop(env: dict[str, str], variable: envspec.Var) -> None:
    """Remove ``variable`` and its per-device forms (NAME_0, NAME_1, ...): an option replaces them."""
    for k in [k for k in env if k.startswith(variable.name)]:
        del env[k]


def _shares_asked(env: dict[str, str], request: WrapRequest) -> tuple[lim.SmLimits, str]:
    """--sm (which replaces CUDA_DEVICE_SM_LIMIT[_i]), else those variables, and where the shares came from."""
    if request.sm_shares is None:
        return lim.sm_from_env(env), envspec.CUDA_DEVICE_SM_LIMIT.name
    _drop(env, envspec.CUDA_DEVICE_SM_LIMIT)
    return request.sm_shares, f"--sm {request.sm}"


def _memory_asked(env: dict[str, str], request: WrapRequest) -> tuple[lim.MemoryLimits, str]:
    """--memory (which replaces CUDA_DEVICE_MEMORY_LIMIT[_i]), else those variables, and where they came from."""
    if request.memory_limits is None:
        return lim.memory_from_env(env), envspec.CUDA_DEVICE_MEMORY_LIMIT.name
    _drop(env, envspec.CUDA_DEVICE_MEMORY_LIMIT)
    return request.memory_limits, f"--memory {request.memory}"


def sm_limits_for(env: dict[str, str], request: WrapRequest,
                  chosen: list[devices.Gpu] | None = None) -> tuple[lim.SmLimits, str]:
    """The compute shares asked for (--sm wins over CUDA_DEVICE_SM_LIMIT[_i]) and where they came from.

    A share that cannot be enforced (NVML cannot measure the device) is refused, or with
    PYVGPU_ON_ERROR=open dropped with a warning. GPU_CORE_UTILIZATION_POLICY=disable is
    said out loud: the limit is recorded for the group but this program runs unlimited.
    """
    shares, source = _shares_asked(env, request)
    if not any(0 < v < 100 for v in shares.as_list()):
        return shares, source
    limited = [d for d, v in enumerate(shares.as_list()) if 0 < v < 100]
    migs = []
    if chosen:  # group device d is the machine's chosen[d]; shares past the group's devices apply to none
        if shares.per_device and max(shares.per_device) >= len(chosen):
            raise PyvgpuError(f"{source}: there is no device {max(shares.per_device)} ({len(chosen)} with --devices)")
        migs = [chosen[d] for d in limited if d < len(chosen) and chosen[d].is_mig]
        limited = [chosen[d].index for d in limited if d < len(chosen)]
    problem = (f"{migs[0].describe()} is a MIG instance: NVML reports no utilization in MIG mode (NVML's "
               "reference), and the instance's SMs are its own already, partitioned by the hardware"
               if migs else devices.utilization_problem(limited))
    if problem:
        msg = (f"{source}: {problem}, so a compute share cannot be enforced; leave the share out "
               "(memory limits work without it)")
        if env.get(envspec.ON_ERROR.name) != "open":
            raise PyvgpuError(msg)
        print(f"pyvgpu: warning: {msg}; running without a compute share (PYVGPU_ON_ERROR=open)", file=sys.stderr)
        _drop(env, envspec.CUDA_DEVICE_SM_LIMIT)
        return lim.SmLimits(), source
    if sched.enabled(env):  # a broken turn file is an error now, not in the program
        turns, note = sched.choose(env)
        if note:
            print(f"pyvgpu: warning: {note}", file=sys.stderr)
        os.close(sched.open_fd(turns, env))
        env[envspec.SCHED.name] = str(turns)  # the program uses the file checked here
    if lim.sm_policy(env) == 2:
        print(f"pyvgpu: warning: {source} is not enforced for this program: GPU_CORE_UTILIZATION_POLICY=disable",
              file=sys.stderr)
    return shares, source


def _group_settings(env: Mapping[str, str], request: WrapRequest) -> dict[str, object]:
    """The priority and borrowing asked for (an option wins over HAMi's CUDA_TASK_PRIORITY and over
    PYVGPU_SM_BORROW) and where each came from, as GroupSpec's fields; None: not asked, the group's stays."""
    if request.priority is not None:  # checked and spelt as the word by WrapRequest
        prio, prio_source = lim.PRIORITIES.index(request.priority), f"--priority {request.priority}"
    else:
        prio, prio_source = lim.priority_from_env(env), envspec.CUDA_TASK_PRIORITY.name
    if request.sm_borrow is not None:
        borrow, borrow_source = request.sm_borrow, "--sm-borrow"
    else:
        borrow, borrow_source = lim.sm_borrow_from_env(env), envspec.SM_BORROW.name
    return {"priority": prio, "priority_source": prio_source, "sm_borrow": borrow, "borrow_source": borrow_source}


def group_spec(env: dict[str, str], request: WrapRequest) -> tuple[str, GroupSpec, lim.SmLimits]:
    """The region and the group ``request`` asks for: each option, else its variable in ``env`` (an option
    removes the variables it replaces), the one place the two meet; and, in MPS mode, the shares MPS
    enforces instead (the group then has none of pyvgpu's). Every value is checked here, before the
    program starts: against the devices, the turn file and the named group's expiry."""
    settings = _group_settings(env, request)
    chosen = devices.select(request.devices, env) if request.devices is not None else []
    mps_shares = lim.SmLimits()
    if request.mode == "mps":  # MPS enforces the share (pyvgpu/group/mps.py): nothing of pyvgpu's limiter to check
        mps_shares, sm_source = _shares_asked(env, request)
        shares = lim.SmLimits()
        _drop(env, envspec.CUDA_DEVICE_SM_LIMIT)
    else:
        shares, sm_source = sm_limits_for(env, request, chosen)
    limits, source = _memory_asked(env, request)
    n_physical = check_physical(limits, source, chosen)
    path = _region_path(env, request)
    stem = os.path.splitext(os.path.basename(path))[0]
    spec = GroupSpec(request.group or stem, limits, shares, tuple(chosen), n_physical=n_physical,
                     limits_source=source, sm_source=sm_source, devices_source=f"--devices {request.devices}",
                     **settings)
    return path, spec, mps_shares


def _absolute(path: str) -> str:
    """``path`` made absolute against the current directory, as Path.absolute() does (no `..` resolved)."""
    return groupfiles.spelt(os.path.join(os.getcwd(), path))


def _region_path(env: Mapping[str, str], request: WrapRequest) -> str:
    """--region, else --group's file (expired first if idle too long), else HAMi's
    CUDA_DEVICE_MEMORY_SHARED_CACHE, else a new private region."""
    if request.region_path:
        path = _absolute(request.region_path)
        if os.path.isdir(path):
            raise PyvgpuError(f"--region {request.region_path} is a directory; give the path of a region file in "
                              f"it, such as --region {os.path.join(request.region_path, 'NAME.region')}")
        return path
    if request.group:
        path = region.group_file(request.group)
        from pyvgpu.ops import groups  # a named group's lifecycle: the idle expiry, the join notes

        expired = groups.expire_if_idle(path, env)
        if expired:
            print(f"pyvgpu: {expired}", file=sys.stderr)
        return path
    if env.get(envspec.CUDA_DEVICE_MEMORY_SHARED_CACHE.name):
        return _absolute(env[envspec.CUDA_DEVICE_MEMORY_SHARED_CACHE.name])
    region.gc_private()
    return region.new_private_path()


def join_group(env: dict[str, str], request: WrapRequest) -> str:
    """Create or join the group's region before the program starts; set the env contract for it."""
    path, spec, mps_shares = group_spec(env, request)
    existed = os.path.exists(path)
    r = _create_or_join(path, spec, request.group, existed)
    if request.mode is not None:
        _check_mode(r, spec, request.mode, existed, mps_shares)
    limits, shares = spec.limits, spec.sm
    if not limits and any(r.limits()):  # caps read from the file (asked-for ones were checked above) are
        # bounded by the devices' memory
        phys = [g.total for g in spec.visible] if spec.visible else devices.physical_memory()
        region.check_bounds(r, phys or [])
    if not limits:  # joining a group without asking: take its limits
        limits = lim.MemoryLimits(per_device={d: v for d, v in enumerate(r.limits()) if v})
    if not shares:
        shares = lim.SmLimits(per_device={d: v for d, v in enumerate(r.sm_limits()) if v})
    env.update(lim.memory_to_env(limits))
    env.update(lim.sm_to_env(shares))
    env.update(lim.priority_to_env(r.header.priority))  # HAMi's variable, for the program's children too
    env[envspec.SM_BORROW.name] = "1" if r.header.sm_borrow else "0"
    if r.header.n_visible:  # the group's devices, also for a member that did not name them
        env[envspec.CUDA_VISIBLE_DEVICES.name] = ",".join(u for _, u in r.visible())
    if r.header.mode == mps.MODES.index("mps"):  # every member of an MPS group is a client, --mode or not
        n = r.header.n_visible or spec.n_physical or len(devices.physical_memory() or [])
        mps.apply(env, region.runtime_dir(), limits, r.header.mps_active_threads, n)
    env[envspec.REGION.name] = path
    return path


def _create_or_join(path: str, spec: GroupSpec, group: str | None, existed: bool) -> region.Region:
    """region.create_or_open, with a named group's lifecycle: the idle hint on a refusal, its use recorded,
    and the notes of joining a group that asks for other limits."""
    try:
        r = region.create_or_open(path, spec)
    except PyvgpuError as e:
        if group and existed:
            from pyvgpu.ops import groups

            raise PyvgpuError(f"{e}{groups.idle_hint(path)}") from None
        raise
    if group:
        from pyvgpu.ops import groups

        groups.touch(path)
        if existed:
            for note in groups.join_notes(r, spec):
                print(f"pyvgpu: note: {note}", file=sys.stderr)
    return r


def _check_mode(r: region.Region, spec: GroupSpec, mode: str, existed: bool, mps_shares: lim.SmLimits) -> None:
    """--mode: a new group runs in it (MPS with the group's one share); an existing one must already."""
    want = mps.check_mode(mode)
    if not existed:
        r.header.mode = want
        if want == mps.MODES.index("mps"):
            r.header.mps_active_threads = mps.one_share(mps_shares, spec.sm_source)
    elif r.header.mode != want:
        raise PyvgpuError(f"--mode {mode}: the group {spec.name} runs in mode {mps.mode_name(r.header.mode)}; "
                          "join it without --mode, or start another group")


def _executable(path: str) -> bool:
    return os.path.exists(path) and os.access(path, os.X_OK) and not os.path.isdir(path)


def _which(cmd: str, path: str | None) -> str | None:
    """shutil.which's answer on POSIX, without importing shutil (and the compression modules it pulls in:
    a twentieth of a plain wrap's start)."""
    if os.path.dirname(cmd):
        return cmd if _executable(cmd) else None
    if path is None:
        path = os.environ.get("PATH") or os.confstr("CS_PATH") or os.defpath
    for d in path.split(os.pathsep) if path else []:
        candidate = os.path.join(d, cmd)
        if _executable(candidate):
            return candidate
    return None


def exec_wrapped(command: Sequence[str], env: Mapping[str, str]) -> None:
    """Replace this process with ``command``; say so in one line first when there is no CUDA driver (the
    program may not need a GPU, so it runs anyway)."""
    if not command:
        raise PyvgpuError("no program given: use `pyvgpu wrap [OPTIONS] -- PROGRAM [ARGS...]`")
    if _which(command[0], env.get("PATH")) is None and not os.path.exists(command[0]):
        raise PyvgpuError(f"program not found: {command[0]!r} (not a file, and not on PATH)")
    problem = driver_problem(env)
    if problem:
        print(f"pyvgpu: no CUDA driver ({problem}); the program runs without a GPU. Fix: {DRIVER_FIX} "
              "(`pyvgpu doctor` checks it)", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], list(command), dict(env))
