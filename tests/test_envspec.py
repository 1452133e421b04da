"""The environment contract (pyvgpu/contract/envspec.py) is the one place a variable's name is written."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from pyvgpu.contract import envspec

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "pyvgpu" / "contract" / "envspec.py"
DOC = ROOT / "docs" / "environment.md"
# a name counts as written when a string literal is exactly the name, or a per-device variable's NAME_ or NAME_<i>
FORBIDDEN = {v.name for v in envspec.VARS} | {v.prefix for v in envspec.PER_DEVICE}
ONE_DEVICE = re.compile("|".join(re.escape(v.prefix) + r"[0-9]+" for v in envspec.PER_DEVICE))


def written(text: str) -> bool:
    return text in FORBIDDEN or ONE_DEVICE.fullmatch(text) is not None
C_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def python_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant (f-strings' constant parts too) and every keyword argument named
    like a variable (``dict(env, NAME=...)`` writes the name as surely as a literal)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.keyword) and node.arg:
            out.append((node.lineno, node.arg))
    return out


def c_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal of C source, comments left out (char literals hold no quote here)."""
    text = C_COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), source)
    return [(text.count("\n", 0, m.start()) + 1, m.group()[1:-1]) for m in C_STRING.finditer(text)]


def offenders(files, literals) -> list[str]:
    return [f"{f.relative_to(ROOT)}:{line}: {text!r}" for f in files for line, text in literals(f.read_text())
            if written(text)]


def test_no_variable_name_is_written_outside_the_contract():
    py = [p for p in sorted((ROOT / "pyvgpu").rglob("*.py")) if p != CONTRACT and "deviceplugin" not in p.parts]
    c = sorted((ROOT / "shim" / "src").glob("*.[ch]"))
    bad = offenders(py, python_literals) + offenders(c, c_literals)
    assert not bad, "name these through pyvgpu/contract/envspec.py (PV_ENV_* in C):\n" + "\n".join(bad)


def test_the_check_sees_a_literal():
    """The scanners find a name where code would write it, and not in comments."""
    assert [t for _, t in python_literals('env.get("PYVGPU_SM_TURN")\nf"CUDA_DEVICE_SM_LIMIT_{d}"\n'
                                          'dict(e, PYVGPU_SCHED="x")\n# "PYVGPU_CLOCK"\n')
            if written(t)] == ["PYVGPU_SM_TURN", "CUDA_DEVICE_SM_LIMIT_", "PYVGPU_SCHED"]
    assert [t for _, t in python_literals('dict(e, CUDA_DEVICE_MEMORY_LIMIT_0="1g", OTHER="x")') if written(t)] == [
        "CUDA_DEVICE_MEMORY_LIMIT_0"]
    assert [t for _, t in c_literals('/* "PYVGPU_CLOCK" */ getenv("PYVGPU_SCHED"); // "HOME"\n')
            if written(t)] == ["PYVGPU_SCHED"]


def test_every_variable_is_declared_once_under_its_key():
    assert len({v.name for v in envspec.VARS}) == len(envspec.VARS)
    for v in envspec.VARS:
        assert getattr(envspec, v.key) is v
        assert v.readers in (envspec.SHIM, envspec.PYTHON, envspec.BOTH), v
        assert v.meaning and v.type and v.default, v
    assert all(v.name.startswith(envspec.NAMESPACE) for v in envspec.VARS if v.key != v.name)


def test_the_generated_c_names_match_the_contract():
    """Every PV_ENV_* macro of the committed header names its variable, and every variable has one."""
    header = (ROOT / "shim" / "generated" / "pv_env_names.h").read_text()
    macros = dict(re.findall(r'#define (PV_ENV_\w+) "([^"]*)"', header))
    want = {v.c_macro: v.name for v in envspec.VARS} | {v.c_macro + "_PREFIX": v.prefix for v in envspec.PER_DEVICE}
    assert macros == want


def test_the_docs_table_is_fresh():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_shim.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    text = DOC.read_text()
    assert envspec.markdown_table() in text
