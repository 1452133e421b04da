"""The cluster's layers (issue 28, item 1): core is pure, api serves both sides, scheduler and node do not
import each other, no module reaches into another's private names, and each layer says what it owns and
may import. Read from the source (every import statement, at any depth), not by importing it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parents[2] / "pyvgpu" / "cluster"
LAYERS = ("core", "api", "scheduler", "node")
TRANSPORT = ("kubernetes", "grpc", "google.protobuf", "urllib3", "http", "socket", "socketserver", "ssl",
             "prometheus_client", "requests")
# what each layer may not import (besides the transport libraries, which only core is denied)
FORBIDDEN = {
    "core": ("pyvgpu.cluster.api", "pyvgpu.cluster.scheduler", "pyvgpu.cluster.node", "pyvgpu.cluster.cli",
             "pyvgpu.cluster.signals", *TRANSPORT),
    "api": ("pyvgpu.cluster.scheduler", "pyvgpu.cluster.node", "pyvgpu.cluster.cli"),
    "scheduler": ("pyvgpu.cluster.node", "pyvgpu.cluster.cli"),
    "node": ("pyvgpu.cluster.scheduler", "pyvgpu.cluster.cli"),
}


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of every import in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.module, [a.name for a in node.names], node.lineno))
    return out


def _modules(layer: str) -> list[Path]:
    return sorted(p for p in (CLUSTER / layer).rglob("*.py") if "v1beta1" not in p.parts)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_imports_only_what_it_may(layer):
    bad = []
    for path in _modules(layer):
        for module, names, line in _imports(path):
            full = [module] + [f"{module}.{n}" for n in names]  # `from pyvgpu.cluster import node`
            for f in FORBIDDEN[layer]:
                if any(_within(m, f) for m in full):
                    bad.append(f"{path.relative_to(CLUSTER)}:{line} imports {module} ({f})")
    assert not bad, f"pyvgpu/cluster/{layer} may not import these:\n" + "\n".join(bad)


def test_no_module_imports_another_modules_private_name():
    """Before the split, the extender's server imported daemon._stop_on_signals."""
    bad = []
    for path in CLUSTER.rglob("*.py"):
        if "v1beta1" in path.parts:
            continue
        for module, names, line in _imports(path):
            if module.startswith("pyvgpu"):
                bad += [f"{path.relative_to(CLUSTER)}:{line} imports {module}.{n}" for n in names
                        if n.startswith("_") and n != "__version__"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_says_what_it_owns_and_may_import(layer):
    doc = ast.get_docstring(ast.parse((CLUSTER / layer / "__init__.py").read_text())) or ""
    assert "May import" in doc and "Never" in doc, f"pyvgpu/cluster/{layer}/__init__.py: say what it may import"


def test_the_cluster_folder_holds_the_layers_and_little_else():
    top = sorted(p.name for p in CLUSTER.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__"))
    assert top == ["__init__.py", "api", "cli.py", "core", "extras.py", "node", "scheduler", "signals.py"], top


def test_the_rule_sees_a_forbidden_import(tmp_path, monkeypatch):
    """The check itself: a core module importing the client is found."""
    fake = tmp_path / "cluster"
    (fake / "core").mkdir(parents=True)
    (fake / "core" / "bad.py").write_text("def f():\n    from kubernetes import client\n")
    monkeypatch.setattr(__import__(__name__), "CLUSTER", fake)
    with pytest.raises(AssertionError, match="kubernetes"):
        test_each_layer_imports_only_what_it_may("core")
