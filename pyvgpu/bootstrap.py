"""Install the compiled callbacks into the preloaded shim.

Runs in three places, always the same code:

* the startup hook (pyvgpu/_boot/sitecustomize.py) of a wrapped Python
  process, on the main thread before user code: ``startup()``;
* the shim's first-call fallback in a Python process whose startup hook
  did not run (``python -S``/``-I``, or LD_PRELOAD without wrap), under
  the GIL on the calling thread: ``install_from_shim("first-call")``;
* the interpreter the shim embeds into a non-Python program:
  ``install_from_shim("embedded")``.

The warm path imports llvmlite.binding and ctypes only, loads the cached
object (pyvgpu/cache.py) and passes one address per hook entry to the
shim. Nothing here runs per CUDA call.
"""

from __future__ import annotations

import ctypes
import os

from pyvgpu import cache, devices, hooks, layout, shim
from pyvgpu.errors import PyvgpuError

_ENGINE = None  # the JIT linker owning the callbacks' code; kept for the life of the process
_REGION = None  # the mapped region of this process's group; kept for the life of the process


def load(manifest: dict) -> tuple[list[int], dict[str, int]]:
    """Load the object named by the manifest.

    Returns one address per hook entry (0: implemented in C) and the
    addresses of the services (pyvgpu.hooks.SERVICES).
    """
    global _ENGINE
    import llvmlite.binding as llvm

    try:
        llvm.initialize()  # required by llvmlite < 0.45, an error in later versions
    except Exception:
        pass
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    tm = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(cache.object_bytes(manifest)))  # hash checked
    engine.finalize_object()
    by_callback = {}
    for name, symbol in manifest["symbols"].items():
        addr = engine.get_function_address(symbol)
        if not addr:
            raise PyvgpuError(f"the callback cache {manifest['object_path']} lacks {symbol}; "
                              "run `pyvgpu warmup --force`")
        by_callback[name] = addr
    addrs = []
    for e in hooks.ENTRIES:
        if e.policy is None:
            addrs.append(0)
        elif e.abi not in manifest["entries"]:
            raise PyvgpuError(f"the callback cache has no callback for {e.abi}; run `pyvgpu warmup --force`")
        else:
            addrs.append(by_callback[manifest["entries"][e.abi]])
    # The code must outlive the interpreter: libraries' static destructors run
    # after Python finalizes and still call cuMemFree through the hooks.
    # Detached, the engine is never disposed.
    engine.detach()
    _ENGINE = engine
    names = [s.name for s in hooks.SERVICES]
    missing = [n for n in names if n not in by_callback]
    if missing:
        raise PyvgpuError(f"the callback cache lacks {', '.join(missing)}; run `pyvgpu warmup --force`")
    return addrs, {n: by_callback[n] for n in names}


def attach_region(ctx_addr: int, env=os.environ) -> None:
    """Join this process's group: map its region. The shim claims a slot at the
    first CUDA or NVML call (pyvgpu/jit/quota.py), so helpers that never use
    the GPU do not become members.

    The group comes from PYVGPU_REGION (set by `pyvgpu wrap`) or HAMi's
    CUDA_DEVICE_MEMORY_SHARED_CACHE; limits in CUDA_DEVICE_MEMORY_LIMIT[_i]
    without a region make a private group, which this process's children join.
    """
    global _REGION
    from pyvgpu import limits, region, sched

    wanted = limits.memory_from_env(env)
    shares = limits.sm_from_env(env)
    policy = limits.sm_policy(env)
    limits.sm_batch_ns(env)  # bad values are errors before anything is attached
    sched.enabled(env)
    path = region.path_from_env(env)
    if path is None and not wanted and not shares:
        return  # no group and no limits: nothing to account
    if path is None:
        # not started by `pyvgpu wrap`, which checks this before the program starts
        limited = [d for d, v in enumerate(shares.as_list()) if 0 < v < 100]
        problem = limited and devices.utilization_problem(limited)
        if problem:
            raise PyvgpuError(f"CUDA_DEVICE_SM_LIMIT: {problem}, so a compute share cannot be enforced; unset it "
                              "(memory limits work without it)")
        path = region.new_private_path()
        os.environ["PYVGPU_REGION"] = str(path)  # children join this group
    r = region.create_or_open(path, path.stem, wanted, "CUDA_DEVICE_MEMORY_LIMIT", sm=shares)
    ctx = layout.CTX.ctypes_class().from_address(ctx_addr)
    ctx.sm_policy = policy
    ctx.sm_batch_ns = limits.sm_batch_ns(env)
    ctx.region = region.map_forever(r.fd, r.header.size)
    # Groups with a share take turns on the GPU. One that gets its first share
    # by a live change later launches without turns (it time-slices).
    if any(0 < v < 100 for v in r.sm_limits()):
        ctx.sched = sched.attach(env)
    ctx.region_fd = r.fd
    ctx.n_slots = r.header.n_slots
    ctx.slot = 0
    ctx.slot_index = -1
    if r.header.n_visible:
        msg = (f"pyvgpu: CUDA in this process does not see its vGPU's devices (nvidia-smi's "
               f"{','.join(str(i) for i, _ in r.visible())}), in that order: CUDA_VISIBLE_DEVICES was changed "
               "inside the program. Choose devices with `pyvgpu wrap --devices`, not in the program. "
               "Its GPU use is refused.\n").encode()
        msg = msg[: layout.MESSAGE_BYTES - 1]
        ctypes.memmove(ctypes.addressof(ctx) + layout.CTX.offset("devices_msg"), msg, len(msg))
    _REGION = r


def install(mode: str = "startup") -> None:
    """Install the callbacks into the preloaded shim. Raises PyvgpuError."""
    lib = shim.loaded()
    if lib is None:
        raise PyvgpuError("the pyvgpu shim is not preloaded in this process; start it with `pyvgpu wrap`")
    if lib.pyvgpu_installed():
        return
    manifest = cache.ensure()
    addrs, services = load(manifest)
    attach_region(lib.pyvgpu_ctx())
    for name, addr in services.items():
        lib.pyvgpu_set_service(name.encode(), addr)
    arr = (ctypes.c_uint64 * len(addrs))(*addrs)
    if lib.pyvgpu_install(arr, len(addrs), hooks.table_hash().encode(), mode.encode()) != 0:
        raise PyvgpuError(lib.pyvgpu_last_error().decode())


def install_from_shim(mode: str) -> str:
    """Entry point for the shim (pv_python.c): '' on success, else the reason."""
    try:
        install(mode)
    except PyvgpuError as e:
        return str(e)
    except Exception as e:  # a bug: name it rather than lose it
        return f"internal error in pyvgpu.bootstrap: {type(e).__name__}: {e}"
    return ""


ALLOCATORS = ("default", "vpmm")


def torch_allocator_hook() -> None:
    """PYVGPU_ALLOCATOR=vpmm: make VPMM PyTorch's allocator as soon as `import torch` completes,
    before the program can allocate. Nothing is imported until then."""
    import importlib.abc
    import importlib.util
    import sys

    class TorchHook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                from pyvgpu import vpmm

                vpmm.enable_for_torch()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, TorchHook())


def startup() -> None:
    """The startup hook: install now; on failure, leave the reason with the shim.

    Nothing is printed here: the shim reports at the first CUDA or NVML call,
    together with what it does about it (refuse, or pass through). A process
    that never uses the GPU is not disturbed.
    """
    lib = shim.loaded()
    if lib is None:
        return
    if os.environ.get("PYVGPU_ALLOCATOR") == "vpmm":
        torch_allocator_hook()
    err = install_from_shim("startup")
    if err:
        lib.pyvgpu_set_error(err.encode())
