"""What a plain `pyvgpu wrap` does before its exec, kept small: records without dataclasses
(pyvgpu/contract/record.py), the layouts the hook table sizes made at first use (pyvgpu/contract/layout.py),
and the choice of the callback library made without loading one (pyvgpu.native.cache.choose).

These check what is imported and chosen, never how long it takes: the figures come from
`pyvgpu bench startup --concurrent N` (docs/measurements.md)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys

import pytest

from pyvgpu.contract.record import field, record
from pyvgpu.native import cache, cblib


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


def test_the_wrap_chooses_the_packaged_library_as_ensure_does(tmp_path):
    d = tmp_path / "cache"
    assert cache.choose(d) == cache.ensure(d)["library"] == str(cache.packaged_path())
    assert not d.exists()  # nothing to compile: the cache is not touched


def test_the_wrap_chooses_the_tuned_library_as_ensure_does(tmp_path, tuned_cache, capfd):
    d = tmp_path / "c"
    shutil.copytree(tuned_cache, d)
    (lib,) = d.glob("callbacks-*.so")
    assert cache.choose(d) == cache.ensure(d)["library"] == str(lib)
    lib.unlink()  # a corrupt one: the same fallback, with the same warning, as ensure's
    lib.write_bytes(b"garbage")
    capfd.readouterr()
    assert cache.choose(d) == str(cache.packaged_path())
    said = capfd.readouterr().err
    assert cache.ensure(d)["library"] == str(cache.packaged_path())
    assert said and said == capfd.readouterr().err and str(lib) in said


def test_a_library_is_named_only_when_its_table_holds_the_key(tmp_path, monkeypatch):
    """A library of other sources (its table holds another key) never passes as one of these."""
    lib = tmp_path / cblib.FILE_NAME
    shutil.copy(cache.packaged_path(), lib)
    shutil.copy(cblib.hash_path(cache.packaged_path()), cblib.hash_path(lib))
    key = cache.cache_key()
    assert cache._fits(lib, key) and not cache._fits(lib, "0" * len(key))
    lib.chmod(0o777)  # writable by others: never named
    assert not cache._fits(lib, key)
    lib.chmod(0o755)
    cblib.hash_path(lib).write_text("0" * 64 + "\n")  # bytes that do not match their hash
    assert not cache._fits(lib, key)
    assert not cache._fits(tmp_path / "missing.so", key)
    monkeypatch.setattr(cache, "packaged_path", lambda: lib)  # a corrupt packaged one: ensure's error, as before
    for choose in (cache.choose, lambda d: cache.ensure(d)["library"]):
        with pytest.raises(cblib.CorruptLibrary, match="does not match the hash beside it"):
            choose(tmp_path / "cache")
