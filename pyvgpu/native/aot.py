"""Compile every callback into one relocatable object file.

numba compiles each callback into its own LLVM module. Here the modules
are linked into one, everything but the callback entry points is made
internal (so helpers compiled into several modules do not clash), the
result is optimised once more across the callbacks, and code is emitted,
position-independent, for the baseline CPU of this architecture (what the
package ships: it runs on any CPU of the architecture) or for this host's
CPU (`pyvgpu warmup`). pyvgpu/native/cblib.py links the object into the library
the shim loads.

Only libc functions may stay undefined: the loader resolves them from the
process. A callback that needs anything else (a numba runtime helper, the
Python C API) is a bug, reported here rather than at load time.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable

import llvmlite.binding as llvm

from pyvgpu.native import callbacks

# Undefined symbols the object may keep: resolved from libc at load time.
ALLOWED_EXTERNALS = frozenset({
    "__errno_location", "getpid", "close", "write", "fcntl", "open", "memcpy", "memset", "memmove",
    "clock_gettime", "sched_yield", "nanosleep", "syscall",
})


_NOINLINE = re.compile(r"(?<=[{ ])noinline(?=[ }])")  # replaced by the no-op "nounwind"
# numba's reference counting of arrays (an array's meminfo; NULL for a view of memory it does not own).
# Nothing in a callback allocates (NRT_Allocate and NRT_MemInfo_alloc are not allowed externals, so a
# callback that did fails the check below), so every meminfo is NULL and both are no-ops; their bodies
# are replaced by one, which removes their calls into the numba runtime (VPMM's entries pass carray
# views between functions too large to inline, where the NULL is not seen).
_REFCOUNT = re.compile(r"^(define [^\n]*@NRT_(?:incref|decref)\((?:ptr|i8\*) %[\w.]+\)[^\n{]*)\{\n.*?^\}",
                       re.M | re.S)  # (i8*: LLVM's typed pointers, before llvmlite 0.45)
# LLVM's name of each architecture's baseline CPU: what every CPU of it runs (x86-64: SSE2, no AVX).
BASELINE_CPU = {"x86_64": "x86-64", "AMD64": "x86-64"}

Progress = Callable[[int, int], None]  # (callbacks compiled so far, callbacks in all)


def target_cpu(tuned: bool) -> tuple[str, str]:
    """(LLVM CPU name, feature string) to compile for: this host's, or the architecture's baseline."""
    _init_llvm()
    if tuned:
        return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    return BASELINE_CPU.get(platform.machine(), "generic"), ""


def _init_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


def compile_ir(names: list[str]) -> list[tuple[str, str, str, list[str]]]:
    """Compile the named callbacks; (name, LLVM IR, entry symbol, ABI names served) each.

    Runs in worker processes too: everything returned is plain data.
    """
    only = set(names)
    built = callbacks.build(only) + callbacks.build_services(only)
    return [(cb.name, cb.func._library.get_llvm_str(), cb.func.native_name, [e.abi for e in cb.entries])
            for cb in built]


def _chunks(names: list[str], n: int) -> list[list[str]]:
    return [names[i::n] for i in range(n) if names[i::n]]


def _parts(names: list[str], n: int) -> list[list[str]]:
    """The callbacks split into parts compiled one at a time: each of callbacks.UNITS whole (its members
    share code that one process then compiles once), first, as it takes longest; the rest in n chunks."""
    units = [[m for m in u if m in names] for u in callbacks.UNITS]
    units = [u for u in units if u]
    grouped = {m for u in units for m in u}
    return units + _chunks([m for m in names if m not in grouped], n)


Compiled = tuple[int, str, str, str, list[str]]  # (its part, then what compile_ir returns)


def _compile_all(workers: int, progress: Progress | None) -> list[Compiled]:
    names = callbacks.all_names()
    done: list[Compiled] = []
    # several chunks per worker, so progress moves while they compile
    parts = _parts(names, max(1, workers) * 4)
    if workers <= 1:
        for i, part in enumerate(parts):
            done += [(i, *c) for c in compile_ir(part)]
            if progress:
                progress(len(done), len(names))
        return done
    import concurrent.futures as cf
    import multiprocessing as mp

    # spawn, not fork: the caller may have threads (and numba's own state should not be forked)
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        futures = {ex.submit(compile_ir, part): i for i, part in enumerate(parts)}
        for fut in cf.as_completed(futures):
            done += [(futures[fut], *c) for c in fut.result()]
            if progress:
                progress(len(done), len(names))
    return done


def compile_object(workers: int = 1, tuned: bool = False,
                   progress: Progress | None = None) -> tuple[bytes, dict[str, str], dict[str, str], str]:
    """Returns (object bytes, {callback name: symbol}, {ABI name: callback name}, the CPU compiled for)."""
    _init_llvm()
    cpu, features = target_cpu(tuned)
    try:
        compiled = _compile_all(workers, progress)
    except (OSError, RuntimeError, ImportError) as e:  # no worker processes here: compile in this one
        if workers <= 1:
            raise
        import sys

        print(f"pyvgpu: parallel compile failed ({e}); compiling in this process", file=sys.stderr)
        compiled = _compile_all(1, progress)
    compiled.sort(key=lambda c: (c[0], c[1]))  # the same object whatever order the workers finished in
    modules: dict[int, llvm.ModuleRef] = {}  # one per part
    symbols: dict[str, str] = {}
    entries: dict[str, str] = {}
    for part, name, ir_text, keep, abis in compiled:
        # numba marks the Python-level function noinline below its C wrapper;
        # lifting that lets the wrapper, policy and driver call fold into one.
        mod = llvm.parse_assembly(_REFCOUNT.sub(r"\1{\n  ret void\n}", _NOINLINE.sub("nounwind", ir_text)))
        # Each callback's module holds a copy of every function it calls. Within a part (compiled by one
        # process, where a name is one function) the copies are merged: linkonce_odr keeps one, so the
        # code VPMM's entry points share is optimised once, not once per entry point.
        for fn in mod.functions:
            if not fn.is_declaration and fn.name != keep:
                fn.linkage = "linkonce_odr"
        for gv in mod.global_variables:
            if not gv.is_declaration:
                gv.linkage = "internal"
        if part in modules:
            modules[part].link_in(mod)
        else:
            modules[part] = mod
        symbols[name] = keep
        for abi in abis:
            entries[abi] = name
    keeps = set(symbols.values())
    for mod in modules.values():  # between parts a name may be two functions: each part's stay its own
        for fn in mod.functions:
            if not fn.is_declaration and fn.name not in keeps:
                fn.linkage = "internal"
    main, *rest = (modules[p] for p in sorted(modules))
    for mod in rest:
        main.link_in(mod)

    target = llvm.Target.from_triple(llvm.get_process_triple())
    tm = target.create_target_machine(cpu=cpu, features=features, opt=2, reloc="pic", codemodel="default")
    main.triple = tm.triple
    main.data_layout = str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=2)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(main, pb)
    # O2 removes the paths that raise only after its interprocedural constant propagation ran; once more,
    # it learns that functions too large to inline (VPMM's) always answer "no exception", and their
    # callers' paths that would raise one through the numba runtime go.
    cleanup = llvm.create_new_module_pass_manager()
    cleanup.add_ipsccp_pass()
    cleanup.add_simplify_cfg_pass()
    cleanup.add_global_dead_code_eliminate_pass()
    cleanup.run(main, pb)
    main.verify()

    # A declaration nothing calls any more (an exception path the optimizer removed) leaves no
    # relocation in the object; only the ones still referenced must be resolvable without Python.
    body = "\n".join(line for line in str(main).splitlines() if not line.startswith("declare "))

    def referenced(name: str) -> bool:
        return re.search(r'@"?' + re.escape(name) + r'"?[^\w.$]', body) is not None

    undefined = sorted(
        fn.name for fn in main.functions
        if fn.is_declaration and not fn.name.startswith("llvm.") and fn.name not in ALLOWED_EXTERNALS
        and referenced(fn.name)
    )
    undefined += sorted(gv.name for gv in main.global_variables if gv.is_declaration and referenced(gv.name))
    if undefined:
        raise RuntimeError(
            "pyvgpu callbacks reference symbols outside libc: " + ", ".join(undefined)
            + " (a callback used something that needs the numba runtime or the Python C API)"
        )
    return tm.emit_object(main), symbols, entries, cpu
