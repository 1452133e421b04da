"""What a plain `pyvgpu wrap` does before its exec, kept small: records without dataclasses
(pyvgpu/contract/record.py), the layouts the hook table sizes made at first use (pyvgpu/contract/layout.py),
the choice of the callback library made without loading one (pyvgpu.native.choice), and paths as text (no
pathlib, no re on a wrap's path).

These check what is imported and chosen, never how long it takes: the figures come from
`pyvgpu bench startup --concurrent N` (docs/measurements.md)."""

from __future__ import annotations

import dataclasses
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PYVGPU, run

from pyvgpu.contract.record import field, record
from pyvgpu.native import cache, cblib, choice, groupfiles


@record(frozen=True)
class _Frozen:
    a: int
    b: str = "x"
    c: tuple = ()


@record
class _Mutable:
    a: int | None = None
    d: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.a is not None and self.a < 0:
            raise ValueError("negative")


class _Sub(_Mutable):
    """Methods only: the base's fields, and unequal to a base instance with the same fields."""


def test_a_record_behaves_as_the_dataclass_it_replaces():
    f = _Frozen(1)
    assert (f.a, f.b, f.c) == (1, "x", ()) and f == _Frozen(1, "x") and f != _Frozen(2)
    assert hash(f) == hash(_Frozen(a=1, b="x")) and repr(f) == "_Frozen(a=1, b='x', c=())"
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.a = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        del f.b
    m, n = _Mutable(), _Mutable()
    assert m.d is not n.d and m == n and m != _Sub() and _Sub(1) == _Sub(1)
    m.a = 3
    assert m.a == 3 and m != n
    with pytest.raises(TypeError):
        hash(m)
    with pytest.raises(ValueError, match="negative"):
        _Mutable(-1)
    for args, kwargs in (((), {}), ((1, "y", (), 4), {}), ((1,), {"a": 2}), ((1,), {"z": 2})):
        with pytest.raises(TypeError):
            _Frozen(*args, **kwargs)
    own = record(frozen=True)(type("Own", (), {"__annotations__": {"x": "int"}, "__repr__": lambda self: "mine"}))
    assert repr(own(1)) == "mine" and hash(own(1)) == hash(own(1))  # what a class defines itself stays
    with pytest.raises(TypeError, match="follows one with a default"):
        record(type("Bad", (), {"__annotations__": {"x": "int", "y": "int"}, "x": 0}))


def test_the_layouts_sized_by_the_hook_table_are_made_at_first_use():
    code = ("import sys\n"
            "from pyvgpu.contract import layout as L\n"
            "assert 'pyvgpu.contract.hooks' not in sys.modules, 'imported with the layouts'\n"
            "from pyvgpu.contract import hooks\n"
            "assert L.N_ENTRIES == len(hooks.ENTRIES) and L.N_HELPERS == len(hooks.HELPERS)\n"
            "assert L.CTX.size > L.CTX.offset('helper') and L.CBLIB.offset('services') > 0\n"
            "from pyvgpu.contract.layout import N_ENTRIES, CTX\n"
            "assert CTX is L.CTX and N_ENTRIES == L.N_ENTRIES\n"
            "try:\n    L.NO_SUCH_THING\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit('no error')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert p.returncode == 0, p.stderr


@pytest.fixture(autouse=True)
def _runtime_dir(tmp_path, monkeypatch):
    """A runtime directory of the test's own: the choice is remembered there."""
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))
    return d


def test_the_wrap_chooses_the_packaged_library_as_ensure_does(tmp_path):
    d = tmp_path / "cache"
    assert choice.choose(d) == cache.ensure(d)["library"] == str(cache.packaged_path())
    assert not d.exists()  # nothing to compile: the cache is not touched


def test_the_wrap_chooses_the_tuned_library_as_ensure_does(tmp_path, tuned_cache, capfd):
    d = tmp_path / "c"
    shutil.copytree(tuned_cache, d)
    (lib,) = d.glob("callbacks-*.so")
    assert choice.choose(d) == cache.ensure(d)["library"] == str(lib)
    lib.unlink()  # a corrupt one: the same fallback, with the same warning, as ensure's
    lib.write_bytes(b"garbage")
    capfd.readouterr()
    assert choice.choose(d) == str(cache.packaged_path())
    said = capfd.readouterr().err
    assert cache.ensure(d)["library"] == str(cache.packaged_path())
    assert said and said == capfd.readouterr().err and str(lib) in said


def test_a_library_is_named_only_when_its_table_holds_the_key(tmp_path, monkeypatch):
    """A library of other sources (its table holds another key) never passes as one of these."""
    lib = tmp_path / cblib.FILE_NAME
    shutil.copy(cache.packaged_path(), lib)
    shutil.copy(cblib.hash_path(cache.packaged_path()), cblib.hash_path(lib))
    key = cache.cache_key()
    assert choice.fits(lib, key) and not choice.fits(lib, "0" * len(key))
    lib.chmod(0o777)  # writable by others: never named
    assert not choice.fits(lib, key)
    lib.chmod(0o755)
    cblib.hash_path(lib).write_text("0" * 64 + "\n")  # bytes that do not match their hash
    assert not choice.fits(lib, key)
    assert not choice.fits(tmp_path / "missing.so", key)
    monkeypatch.setattr(cache, "packaged_file", lambda: str(lib))  # a corrupt packaged one: ensure's error, as before
    for choose in (choice.choose, lambda d: cache.ensure(d)["library"]):
        with pytest.raises(cblib.CorruptLibrary, match="does not match the hash beside it"):
            choose(tmp_path / "cache")


def _no_hashing():
    raise AssertionError("the sources were hashed")


def test_a_remembered_choice_is_taken_until_a_file_it_rests_on_changes(tmp_path, tuned_cache, monkeypatch):
    memo = Path(groupfiles.runtime_dir(make=True)) / choice.MEMO_NAME
    d = tmp_path / "c"
    assert choice.choose(d) == str(cache.packaged_path())
    assert stat.S_IMODE(memo.stat().st_mode) == 0o600
    with monkeypatch.context() as m:
        m.setattr(cache, "cache_key", _no_hashing)
        assert choice.choose(d) == str(cache.packaged_path())  # remembered
    shutil.copytree(tuned_cache, d)  # a tuned library appears, as `pyvgpu warmup` makes it
    (lib,) = d.glob("callbacks-*.so")
    assert choice.choose(d) == str(lib)
    with monkeypatch.context() as m:
        m.setattr(cache, "cache_key", _no_hashing)
        assert choice.choose(d) == str(lib)
        memo.chmod(0o622)  # a memo others could write is not read
        with pytest.raises(AssertionError, match="hashed"):
            choice.choose(d)
    memo.chmod(0o600)
    cblib.hash_path(lib).write_text("0" * 64 + "\n")  # the library changed: the long way, which falls back
    assert choice.choose(d) == str(cache.packaged_path())


def test_a_source_edited_after_the_choice_was_remembered_is_seen(env, tmp_path):
    """A copy of the installed package: two wraps (the second takes the remembered choice), then a source the
    callbacks are compiled from is edited, and the next wrap finds that no library fits (the cache cannot be
    written, so it says so instead of compiling)."""
    import pyvgpu

    root = tmp_path / "copy"
    shutil.copytree(Path(pyvgpu.__file__).parent, root / "pyvgpu", ignore=shutil.ignore_patterns("__pycache__"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    e = dict(env, PYTHONPATH=str(root), PYVGPU_CACHE_DIR=str(blocker / "cache"), XDG_RUNTIME_DIR=str(tmp_path / "run"))
    memo = tmp_path / "run" / "pyvgpu" / choice.MEMO_NAME
    made = []
    for _ in range(2):
        p = run([*PYVGPU, "wrap", "-m", "8M", "-g", "g", "--", "true"], env=e)
        assert p.returncode == 0, p.stderr
        made.append((memo.stat().st_ino, memo.stat().st_mtime_ns))
    assert made[0] == made[1]  # the second wrap took the remembered choice (a new one would be a new file)
    with open(root / "pyvgpu" / "jit" / "runtime" / "context.py", "a") as f:
        f.write("\n# edited after the build\n")
    p = run([*PYVGPU, "wrap", "-m", "8M", "-g", "g", "--", "true"], env=e)
    assert p.returncode == 2 and "no compiled callbacks fit this pyvgpu" in p.stderr, p.stderr


# What a wrap imports, seen at its exec: the console script's `main` run in an interpreter without site (-S:
# nothing of the environment's .pth files), whose os.execvpe prints sys.modules instead of replacing it.
# (json is not used there: it imports re)
_AT_EXEC = """\
import os, sys
def at_exec(file, args, env):
    print(" ".join(sorted(sys.modules)), flush=True)
    os._exit(0)
os.execvpe = at_exec
sys.argv = ["pyvgpu", "wrap", *sys.argv[1:]]
from pyvgpu.entry import main
main()
"""
# pathlib with what it pulls in (urllib.parse, ipaddress, fnmatch, re and its enum): several milliseconds of a
# wrap's start; a wrap's paths are text (os.path), a group name is checked without a pattern
_NOT_ON_A_WRAPS_PATH = {"pathlib", "urllib", "urllib.parse", "ipaddress", "fnmatch", "ntpath", "re", "enum"}


@pytest.mark.parametrize("args", [["--memory", "4G", "--sm", "30"], ["-g", "imports", "-m", "8M"],
                                  ["--region", "@T/r.region", "-m", "8M"], ["-m", "8M", "--devices", "0"]],
                         ids=["sm", "group", "region", "devices"])
@pytest.mark.parametrize("driver", [True, False], ids=["driver", "no-driver"])
def test_a_wrap_imports_neither_pathlib_nor_re(env, tmp_path, args, driver):
    e = dict(env, XDG_RUNTIME_DIR=str(tmp_path / "run"))
    if not driver:  # as on a machine without a GPU: the wrap says so in one line, and runs the program
        e["PYVGPU_REAL_LIBCUDA"] = str(tmp_path / "no-such-libcuda.so.1")
    args = [a.replace("@T", str(tmp_path)) for a in args] + ["--", "true"]
    # the first wrap with a runtime directory chooses the callback library the long way (once): warm it
    warm = run([*PYVGPU, "wrap", "-m", "8M", "--", "true"], env=e)
    assert warm.returncode == 0, warm.stderr
    p = run([sys.executable, "-S", "-c", _AT_EXEC, *args], env=e)
    at_exec = set(p.stdout.split())
    assert p.returncode == 0 and "pyvgpu.ops.wrap" in at_exec and "pyvgpu.group.region" in at_exec, p.stderr
    bare = run([sys.executable, "-S", "-c", "import sys; print(' '.join(sorted(sys.modules)))"], env=e)
    assert "sys" in bare.stdout.split() and not _NOT_ON_A_WRAPS_PATH & set(bare.stdout.split())  # else no test
    unwanted = _NOT_ON_A_WRAPS_PATH - ({"re", "enum"} if "--devices" in args else set())  # its entries: patterns
    assert not unwanted & at_exec, sorted(unwanted & at_exec)
