"""Messages a newcomer meets (issue 31): each names the input and the fix."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pyvgpu


def test_an_unbuilt_source_tree_says_to_install_and_run_elsewhere(env, tmp_path):
    tree = tmp_path / "checkout"
    shutil.copytree(Path(pyvgpu.__file__).parent, tree / "pyvgpu",
                    ignore=shutil.ignore_patterns("*.so", "*.so.*", "bin", "__pycache__", "*.json"))
    (tree / "pyproject.toml").write_text("[project]\nname = 'pyvgpu'\n")
    (tree / "shim" / "src").mkdir(parents=True)
    e = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-m", "pyvgpu", "wrap", "-m", "64M", "--", "true"], cwd=tree, env=e,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1, p.stderr
    assert f"imported from its source tree {tree}" in p.stderr and "pip install ." in p.stderr
    assert "reinstall" not in p.stderr
