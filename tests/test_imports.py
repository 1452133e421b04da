"""No import circles in the package: the module graph (every `import`, also inside
functions, since a lazy import is still a dependency) must be acyclic."""

from __future__ import annotations

import ast
from pathlib import Path

import pyvgpu

PKG = Path(pyvgpu.__file__).resolve().parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """pyvgpu module -> the pyvgpu modules it imports (packages' __init__ left out as targets
    when a submodule is named, so `from pyvgpu import x` points at pyvgpu.x)."""
    files = {_module_name(p): p for p in root.rglob("*.py") if "_boot" not in p.parts}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):  # imports only for type checkers are not dependencies at run time
            if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
                node.body = []
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != mod and not (files[t].name == "__init__.py" and t == "pyvgpu"):
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_circles():
    graph = import_graph()
    assert len(graph) > 40 and graph["pyvgpu.vpmm.torch_startup"], "the import graph was not read"
    assert cycles(graph) == []


def test_a_circle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# --- layers: which package may import which (names below are the layer packages) -----------------------
# A module belongs to the longest package below that names it; it may import its own package and those listed.
# docs/architecture.md ("How the layers map to folders") draws the same stack.
CONTRACT, HOST, NATIVE = "pyvgpu.contract", "pyvgpu.host", "pyvgpu.native"
GROUP, VPMM, OPS = "pyvgpu.group", "pyvgpu.vpmm", "pyvgpu.ops"
RUNTIME, STATE, JDEV = "pyvgpu.jit.runtime", "pyvgpu.jit.state", "pyvgpu.jit.devices"
JMEM, COMPUTE, JVPMM = "pyvgpu.jit.memory", "pyvgpu.jit.compute", "pyvgpu.jit.vpmm"
JIT_LAYERS = {RUNTIME, STATE, JDEV, JMEM, COMPUTE, JVPMM}
ERRORS, CLUSTER, BENCH = "pyvgpu.errors", "pyvgpu.cluster", "pyvgpu.bench"
MAY_IMPORT: dict[str, set[str]] = {
    ERRORS: set(),
    CONTRACT: set(),  # the models: nothing of pyvgpu
    RUNTIME: {CONTRACT},
    STATE: {CONTRACT, RUNTIME},
    JDEV: {CONTRACT, RUNTIME, STATE},
    JMEM: {CONTRACT, RUNTIME, STATE, JDEV},
    COMPUTE: {CONTRACT, RUNTIME, STATE, JDEV},
    JVPMM: {CONTRACT, RUNTIME},
    "pyvgpu.jit": {CONTRACT} | JIT_LAYERS - {JVPMM},  # policies.py: the hook table's names, resolved in jit
    HOST: {ERRORS, CONTRACT},
    NATIVE: {ERRORS, CONTRACT, HOST, "pyvgpu.jit"} | JIT_LAYERS,
    GROUP: {ERRORS, CONTRACT, HOST, NATIVE},  # never jit, vpmm, ops, the cluster or the CLI
    VPMM: {ERRORS, CONTRACT, HOST, NATIVE, GROUP, JVPMM},
    CLUSTER: {ERRORS, CONTRACT, HOST, NATIVE, GROUP, VPMM},  # never ops or the CLI
    OPS: {ERRORS, CONTRACT, HOST, NATIVE, GROUP, VPMM, CLUSTER},  # never the CLI
    BENCH: {ERRORS, CONTRACT, HOST, NATIVE, GROUP, VPMM, CLUSTER, OPS},
}
# what sits on top (the CLI, its entry points) may import every layer
TOP = ("pyvgpu.cli", "pyvgpu.cluster.cli", "pyvgpu.entry", "pyvgpu.fastwrap", "pyvgpu.__main__")
# imports that cross the layers today, each with why and what removes it; the test fails when one is gone,
# so the list cannot outlive its reason
KNOWN_CROSSINGS = {
    ("pyvgpu.host.devices", "pyvgpu.group.limits"): "a lazy import of the ASCII check of a --devices entry",
}


def layer_of(module: str) -> str | None:
    names = [*MAY_IMPORT, *TOP]
    found = [n for n in names if module == n or module.startswith(n + ".")]
    return max(found, key=len) if found else None


def test_every_module_belongs_to_a_layer():
    graph = import_graph()
    homeless = sorted(m for m in graph if m != "pyvgpu" and layer_of(m) is None)
    assert not homeless, f"modules outside every layer (place them in a package of MAY_IMPORT): {homeless}"


def test_each_layer_imports_only_the_layers_below_it():
    graph = import_graph()
    crossings = set()
    for mod, targets in graph.items():
        layer = layer_of(mod)
        if layer is None or layer in TOP:
            continue
        for t in targets:
            to = layer_of(t)
            if to != layer and to not in MAY_IMPORT[layer]:
                crossings.add((mod, t))
    unknown = sorted(crossings - set(KNOWN_CROSSINGS))
    assert not unknown, f"imports against the layers (docs/architecture.md): {unknown}"
    gone = sorted(set(KNOWN_CROSSINGS) - crossings)
    assert not gone, f"these crossings are gone: delete them from KNOWN_CROSSINGS: {gone}"


def test_the_layer_rules_catch_an_upward_import():
    assert layer_of("pyvgpu.group.region") == GROUP and layer_of("pyvgpu.jit.compute.turn") == COMPUTE
    assert layer_of("pyvgpu.cli.wrap") == "pyvgpu.cli" and layer_of("pyvgpu.cluster.core.fit") == CLUSTER
    assert OPS not in MAY_IMPORT[GROUP] and "pyvgpu.jit" not in MAY_IMPORT[GROUP] and not MAY_IMPORT[CONTRACT]


def test_the_top_level_holds_packages_and_the_entry_modules_only():
    modules = sorted(p.stem for p in PKG.glob("*.py"))
    allowed = {"__init__", "__main__", "entry", "fastwrap", "errors"}
    assert set(modules) <= allowed, f"pyvgpu/ holds modules that belong in a layer package: {set(modules) - allowed}"


def test_every_layer_package_says_what_it_owns_and_may_import():
    for layer in [*MAY_IMPORT, "pyvgpu.jit"]:
        init = PKG.parent / layer.replace(".", "/") / "__init__.py"
        if layer == ERRORS:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 60, f"{init} needs a docstring saying what the package owns"
        if layer not in (CLUSTER, BENCH):  # those two say it in their own words
            assert "May import" in doc, f"{init}'s docstring must say what the package may import"


def _module_level_imports(mod: str, files: dict[str, Path]) -> set[str]:
    """The pyvgpu modules mod imports when it is imported (not those imported inside a function)."""
    tree = ast.parse(files[mod].read_text())
    out = set()
    for node in tree.body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        for n in names:
            while n and n not in files:
                n = n.rpartition(".")[0]
            if n and n.startswith("pyvgpu.") and not files[n].name == "__init__.py":
                out.add(n)
    return out


def _closure(roots: set[str], files: dict[str, Path]) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += _module_level_imports(m, files)
    return seen


def _sources(module_file: Path) -> set[Path]:
    """The files that module_file's `_SOURCES` globs (relative to the package) cover."""
    tree = ast.parse(module_file.read_text())
    (patterns,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                   and any(getattr(t, "id", "") == "_SOURCES" for t in n.targets)]
    return {p.resolve() for pattern in patterns for p in PKG.glob(pattern)}


def test_the_callbacks_cache_key_covers_every_module_they_are_compiled_from():
    """A moved module the key missed would let a stale compiled library pass as fresh."""
    from pyvgpu.contract import hooks

    files = {_module_name(p): p for p in PKG.rglob("*.py") if "_boot" not in p.parts}
    policies = {f"pyvgpu.jit.{e.policy.rpartition('.')[0]}" for e in hooks.ENTRIES if e.policy}
    assert policies and policies <= set(files), "the hook table's policies were not found"
    compiled = _closure({"pyvgpu.native.callbacks", "pyvgpu.native.aot", "pyvgpu.jit.policies"} | policies, files)
    covered = _sources(PKG / "native" / "cache.py")
    missing = sorted(m for m in compiled if files[m].resolve() not in covered and m != "pyvgpu.errors")
    assert not missing, f"pyvgpu/native/cache.py's _SOURCES misses what the callbacks are compiled from: {missing}"
