"""The wheel carried to a GPU machine (scripts/build_wheel.py --for-device): scripts/gpu_check.sh installs it
only where the digest beside it is the digest of the tree it runs in, so the digest must follow every source
of the wheel and nothing a build leaves in the tree."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import build_wheel
finally:
    sys.path.pop(0)


def _tree(root: Path) -> Path:
    for rel, text in {"pyvgpu/__init__.py": "x = 1\n", "pyvgpu/jit/cost.py": "c = 2\n", "shim/pv.c": "int a;\n",
                      "shim/generated/pv_layout.h": "/* generated */\n", "setup.py": "setup()\n",
                      "pyproject.toml": "[project]\n", "scripts/build_native.py": "b = 3\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize("rel", ["pyvgpu/jit/cost.py", "shim/pv.c", "shim/generated/pv_layout.h", "setup.py",
                                 "pyproject.toml", "scripts/build_native.py"])
def test_the_digest_follows_every_source(tmp_path, rel):
    root = _tree(tmp_path)
    before = build_wheel.source_digest(root)
    assert build_wheel.source_digest(root) == before  # stable
    (root / rel).write_text((root / rel).read_text() + "# changed\n")
    assert build_wheel.source_digest(root) != before, rel


def test_a_renamed_source_changes_the_digest(tmp_path):
    root = _tree(tmp_path)
    before = build_wheel.source_digest(root)
    (root / "pyvgpu/jit/cost.py").rename(root / "pyvgpu/jit/costs.py")
    assert build_wheel.source_digest(root) != before


@pytest.mark.parametrize("rel", ["pyvgpu/libpyvgpu.so", "pyvgpu/libpyvgpu_callbacks.so", "pyvgpu/bin/pv_bench",
                                 "pyvgpu/__pycache__/x.cpython-311.pyc", "pyvgpu.egg-info/PKG-INFO",
                                 "shim/pv.o", "README.md", "tests/test_x.py"])
def test_what_a_build_leaves_or_the_wheel_does_not_hold_leaves_it(tmp_path, rel):
    root = _tree(tmp_path)
    before = build_wheel.source_digest(root)
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(b"\x7fELF built")
    assert build_wheel.source_digest(root) == before, rel


def test_this_tree_has_the_digest_of_its_clean_copy(tmp_path):
    """The working tree (built in place or not) and a copy of its sources alone agree: a wheel built here
    installs on the device, whose copy of the tree may hold other build outputs."""
    for top in build_wheel.SOURCES:
        src = ROOT / top
        if src.is_dir():
            shutil.copytree(src, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__", "*.so", "bin"))
        elif src.is_file():
            (tmp_path / top).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tmp_path / top)
    assert build_wheel.source_digest(tmp_path) == build_wheel.source_digest(ROOT)


def test_for_device_writes_the_digest_only_after_the_wheel(tmp_path, monkeypatch):
    src = _tree(tmp_path / "src")
    out = tmp_path / "wheels"
    out.mkdir()
    (out / "pyvgpu-0.0.9-py3-none-any.whl").write_text("an older tree's")
    (out / build_wheel.DIGEST_FILE).write_text("stale\n")
    (out / "rich-1.0-py3-none-any.whl").write_text("a dependency")

    def fake_build(where: Path, source: Path, isolation: bool) -> Path:
        assert not (where / build_wheel.DIGEST_FILE).exists()  # never a digest beside a wheel being built
        assert not list(where.glob("pyvgpu-*.whl"))  # the older tree's wheel is gone first
        w = where / "pyvgpu-0.1.0-py3-none-manylinux_2_34_x86_64.whl"
        w.write_text("built")
        return w

    monkeypatch.setattr(build_wheel, "build", fake_build)
    wheel = build_wheel.for_device(out, src)
    assert wheel.name.startswith("pyvgpu-0.1.0")
    assert (out / build_wheel.DIGEST_FILE).read_text().strip() == build_wheel.source_digest(src)
    assert (out / "rich-1.0-py3-none-any.whl").exists()  # the other carried wheels stay

    def failing_build(where: Path, source: Path, isolation: bool) -> Path:
        raise SystemExit("auditwheel refused it")

    monkeypatch.setattr(build_wheel, "build", failing_build)
    with pytest.raises(SystemExit):
        build_wheel.for_device(out, src)
    assert not (out / build_wheel.DIGEST_FILE).exists()  # a failed build leaves no digest to match
