"""A lean install: `pip install pyvgpu` runs wrap, status, limits, top and the exporter without the cluster's
dependencies (kubernetes, grpcio, protobuf); `pip install 'pyvgpu[cluster]'` adds them, and a cluster daemon
started without them says, in one line, which extra to install.

Uninstalling packages from the test environment is not an option (other tests need them), so a child
interpreter is started with an import hook that makes the cluster's modules missing, as they are in a
lean install; the packaging metadata is checked on the installed distribution."""

from __future__ import annotations

import json
import re
import sys
from importlib import metadata

import pytest
from helpers import clean_env, run

# Makes every module of the cluster extra missing (ModuleNotFoundError), as in an install without it.
HIDE = """
import sys, importlib.abc
HIDDEN = ("kubernetes", "grpc", "google.protobuf")
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == h or name.startswith(h + ".") for h in HIDDEN):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
"""


def _lean(code: str, tmp_path, **env: str):
    return run([sys.executable, "-c", HIDE + code], env=clean_env(XDG_RUNTIME_DIR=str(tmp_path), **env),
               timeout=120)


def _cli(args: list[str]) -> str:
    return f"sys.argv = ['pyvgpu', *{args!r}]\nfrom pyvgpu.cli import main\nmain()\n"


def test_the_hook_really_hides_the_cluster_modules(tmp_path):
    p = _lean("import kubernetes", tmp_path)
    assert p.returncode != 0 and "No module named 'kubernetes'" in p.stderr


@pytest.mark.parametrize("args", [["cluster", "device-plugin", "--node-name", "n1"],
                                  ["cluster", "node-agent", "--node-name", "n1"],
                                  ["cluster", "scheduler", "--port", "18888"]])
def test_a_cluster_daemon_without_the_extra_names_it_in_one_line(args, tmp_path):
    p = _lean(_cli(args), tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "ImportError" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert re.fullmatch(rf"pyvgpu: `pyvgpu cluster {args[1]}` needs .*kubernetes.*; install the cluster extra: "
                        r"pip install 'pyvgpu\[cluster\]'", lines[0]), lines[0]


def test_the_single_machine_commands_work_without_the_extra(tmp_path):
    p = _lean(_cli(["status", "--json"]), tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) is not None
    # what wrap, limits, top, the exporter (also on a node's state dir) and `cluster explain` import
    code = ("import pyvgpu.cli.root, pyvgpu.ops.wrap, pyvgpu.group.limits, pyvgpu.ops.top, pyvgpu.ops.exporter\n"
            "import pyvgpu.ops.status\n"
            "import pyvgpu.cluster.core.decide, pyvgpu.cluster.core.explain\n"
            "from pyvgpu.ops import status\n"
            f"assert status.collect(state_dir={str(tmp_path / 'state')!r}) == []\n"
            "s = pyvgpu.ops.exporter.server(0, '127.0.0.1'); s.server_close()\n"
            "assert not any(m.split('.')[0] in ('kubernetes', 'grpc') for m in sys.modules)\n"
            "print('lean ok')\n")
    p = _lean(code, tmp_path)
    assert p.returncode == 0 and "lean ok" in p.stdout, p.stderr


def test_the_cluster_dependencies_are_an_extra_that_the_test_extra_includes():
    reqs = metadata.requires("pyvgpu") or []

    def names(extra: str | None) -> set[str]:
        out = set()
        for r in reqs:
            name, _, marker = r.partition(";")
            if (extra is None) == (not marker.strip()) and (extra is None or f'extra == "{extra}"' in marker):
                out.add(re.split(r"[\s<>=!~\[]", name.strip(), maxsplit=1)[0].lower())
        return out

    cluster = {"kubernetes", "grpcio", "protobuf"}
    assert not cluster & names(None), "a plain install would pull in the cluster's dependencies"
    assert cluster <= names("cluster")
    assert "pyvgpu" in names("test"), "the test extra must set up the cluster tests (pyvgpu[cluster])"
    assert any(r.startswith("pyvgpu[cluster]") and 'extra == "test"' in r for r in reqs)
