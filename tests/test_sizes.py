"""The size, share and device grammar, in-process: every form, both ways.

The same grammar reads --memory, `limits set --memory` and HAMi's variables, so
what HAMi's device plugin writes (``CUDA_DEVICE_MEMORY_LIMIT_0=8192m``) is here too.
It has one implementation, shim/src/pv_grammar.c and pv_env.c: the shim reads the
variables with it inside a program that has no interpreter, and pyvgpu/group/limits.py
reaches it through pyvgpu/native/grouplib.py. The environment cases run through the
shim's own start-up reader (``grouplib.read_env``, pv_read_env), the rest through
limits.py.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from pyvgpu.errors import PyvgpuError
from pyvgpu.group import limits as lim
from pyvgpu.host import devices
from pyvgpu.native import grouplib

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


class Grammar:
    """The grammar as the tests below call it: sizes and shares through limits.py, the environment through
    the reader the shim runs at its start."""

    def size(self, text: str, where: str) -> int:
        return lim.parse_size(text, where)

    def percent(self, text: str, where: str) -> int:
        return lim.parse_percent(text, where)

    def env(self, env: dict[str, str]) -> tuple[list[int], list[int], int, int, bool]:
        """(memory per device, share per device, policy, batch ns, turns) as a process reads its variables."""
        got = grouplib.read_env(env)
        return got["memory"], got["sm"], got["policy"], got["batch_ns"], got["turns"]


@pytest.fixture
def grammar():
    return Grammar()


@pytest.mark.parametrize("text,expect", [
    # bytes: a bare number, or B
    ("1073741824", GiB), ("4096", 4096), ("4096B", 4096), ("1", 1),
    # the single letter, any case, binary (HAMi's meaning; HAMi's device plugin writes "<MiB>m")
    ("4G", 4 * GiB), ("4g", 4 * GiB), ("512M", 512 * MiB), ("8192m", 8 * GiB), ("64k", 64 * KiB),
    ("64K", 64 * KiB), ("1T", TiB), ("1t", TiB),
    # Kubernetes' binary suffixes, and IEC's
    ("4Gi", 4 * GiB), ("512Mi", 512 * MiB), ("64Ki", 64 * KiB), ("1Ti", TiB), ("4GiB", 4 * GiB),
    ("512MiB", 512 * MiB), ("4gib", 4 * GiB), ("4GI", 4 * GiB),
    # decimals, rounded down to a whole byte
    ("4.5G", 4 * GiB + 512 * MiB), ("4.5Gi", 4 * GiB + 512 * MiB), ("0.5G", 512 * MiB), (".5G", 512 * MiB),
    ("4.", 4), ("1.5", 1), ("0.1K", 102), ("2730.6666666666665m", 2863311530),
    # spaces around and between, as Python's str.strip() and regex \\s see them (ASCII separators too)
    (" 4G ", 4 * GiB), ("4 G", 4 * GiB), ("4 GiB", 4 * GiB), ("\t4G\n", 4 * GiB), ("\x1c4G\x1f", 4 * GiB),
    ("4\x0bG", 4 * GiB),
    # 30 digits on each side of the point, exactly rounded down
    ("0." + "9" * 30 + "K", 1023), ("1" + "0" * 18, 10 ** 18), ("1.0009765625K", 1025),
])
def test_every_size_form(grammar, text, expect):
    assert grammar.size(text, "--memory") == expect


@pytest.mark.parametrize("text,message", [
    ("4GB", "'4GB' is ambiguous"), ("4gb", "write 4G or 4Gi"), ("512MB", "or 512000000 (bytes)"),
    ("4kB", "write 4K or 4Ki"), ("1TB", "1000000000000 (bytes) for decimal"), ("4.5GB", "or 4500000000 (bytes)"),
])
def test_decimal_units_are_refused_with_what_to_write(grammar, text, message):
    with pytest.raises(PyvgpuError, match="ambiguous") as e:
        grammar.size(text, "--memory")
    assert str(e.value).startswith(f"--memory: '{text}' is ambiguous (Kubernetes reads")
    assert message in str(e.value)


@pytest.mark.parametrize("text", ["", " ", "G", "Gi", "4X", "4P", "4Gx", "-1", "+4G", "4e9", "1e+06m", "0x10",
                                  "4_000", "4,5G", "4..5G", "4.5.1G", "1" * 31, "1." + "0" * 31, "4 G B"])
def test_what_is_not_a_size(grammar, text):
    with pytest.raises(PyvgpuError, match="is not a size; give a number of bytes, or a number with a binary unit"):
        grammar.size(text, "--memory")


@pytest.mark.parametrize("text,char", [("４G", "FULLWIDTH DIGIT FOUR"), ("²", "SUPERSCRIPT TWO"), ("4Ｇ", "FULLWIDTH"),
                                       ("٤G", "ARABIC-INDIC DIGIT FOUR"), ("4\u00a0G", "NO-BREAK SPACE")])
def test_non_ascii_is_refused_with_the_character_named(grammar, text, char):
    with pytest.raises(PyvgpuError, match="write sizes with ASCII digits") as e:
        grammar.size(text, "--memory")
    assert char in str(e.value)
    first = next(c for c in text if not c.isascii())
    assert str(e.value).startswith(f"--memory: {text!r} has the character {first!r} (")
    assert f"U+{ord(first):04X}); write sizes" in str(e.value)


def test_zero_and_too_large(grammar):
    for text in ("0", "0G", "0.0001", "0.4"):
        with pytest.raises(PyvgpuError, match="would refuse every allocation"):
            grammar.size(text, "--memory")
    assert grammar.size("8388607T", "x") == 8388607 * TiB
    assert grammar.size("8388607.999999999999T", "x") == int(Fraction("8388607.999999999999") * TiB)
    assert grammar.size("9223372036854775807", "x") == (1 << 63) - 1
    for text in ("8388608T", "9223372036854775808", "9" * 30, "8388608.0T"):
        with pytest.raises(PyvgpuError, match="too large"):
            grammar.size(text, "x")


def test_a_cap_below_the_floor_is_refused_with_the_reason():
    env: dict[str, str] = {}
    assert lim.MIN_MEMORY == 64 * MiB
    assert lim.parse_cap("64M", "--memory", env) == 64 * MiB
    with pytest.raises(PyvgpuError) as e:
        lim.parse_cap("4096", "--memory", env)  # meant as MiB, read as bytes
    msg = str(e.value)
    assert "4 KiB is below the smallest memory cap, 64 MiB" in msg and "a CUDA context alone takes more" in msg
    assert "a bare number is bytes: did you mean 4096M or 4096Mi?" in msg
    with pytest.raises(PyvgpuError, match="63 MiB is below the smallest memory cap, 64 MiB: .*; give a larger cap"):
        lim.parse_cap("63M", "--memory", env)
    # a simulated driver (the test suite's) lowers it
    assert lim.parse_cap("4M", "--memory", {"PYVGPU_MIN_MEMORY": "1M"}) == 4 * MiB
    with pytest.raises(PyvgpuError, match="PYVGPU_MIN_MEMORY: 'x' is not a size"):
        lim.parse_cap("4M", "--memory", {"PYVGPU_MIN_MEMORY": "x"})


def test_memory_option_and_hami_env_use_the_same_rules():
    env: dict[str, str] = {}
    m = lim.parse_memory_option("4.5Gi", env)
    assert m.default == 4 * GiB + 512 * MiB and m.per_device == {}
    m = lim.parse_memory_option("0=2Gi,1=512M", env)
    assert m.default is None and m.per_device == {0: 2 * GiB, 1: 512 * MiB}
    with pytest.raises(PyvgpuError, match=r"--memory .0=4096., device 0: 4 KiB is below"):
        lim.parse_memory_option("0=4096", env)
    with pytest.raises(PyvgpuError, match=r"--memory '１=2G': '１' has the character"):
        lim.parse_memory_option("１=2G", env)
    with pytest.raises(PyvgpuError, match=r"--memory '²=2G': '²' has the character"):
        lim.parse_memory_option("²=2G", env)
    # what HAMi's device plugin writes: MiB with a lower-case m, one variable per device
    hami = {"CUDA_DEVICE_MEMORY_LIMIT_0": "8192m", "CUDA_DEVICE_MEMORY_LIMIT_1": "3000m"}
    assert lim.memory_from_env(hami).per_device == {0: 8 * GiB, 1: 3000 * MiB}
    assert lim.memory_from_env({"CUDA_DEVICE_MEMORY_LIMIT": "2730.5m"}).default == 2730 * MiB + 512 * KiB
    # and what `pyvgpu wrap` writes for its members: bytes
    assert lim.memory_from_env(lim.memory_to_env(lim.MemoryLimits(4 * GiB, {1: 64 * MiB}))) == \
        lim.MemoryLimits(4 * GiB, {1: 64 * MiB})
    for env_, where in (({"CUDA_DEVICE_MEMORY_LIMIT": "4GB"}, "CUDA_DEVICE_MEMORY_LIMIT: '4GB' is ambiguous"),
                        ({"CUDA_DEVICE_MEMORY_LIMIT_0": "512"}, "CUDA_DEVICE_MEMORY_LIMIT_0: 512 B is below"),
                        ({"CUDA_DEVICE_MEMORY_LIMIT_²": "1G"}, "CUDA_DEVICE_MEMORY_LIMIT_²: '²' has the character")):
        with pytest.raises(PyvgpuError) as e:
            lim.memory_from_env(env_)
        assert str(e.value).startswith(where), str(e.value)


NONE = [0] * 16


@pytest.mark.parametrize("env,memory,sm", [
    ({}, NONE, NONE),
    ({"CUDA_DEVICE_MEMORY_LIMIT": "4G"}, [4 * GiB] * 16, NONE),
    # what HAMi's device plugin writes: MiB with a lower-case m, one variable per device, and the cores
    ({"CUDA_DEVICE_MEMORY_LIMIT_0": "8192m", "CUDA_DEVICE_MEMORY_LIMIT_1": "3000m", "CUDA_DEVICE_SM_LIMIT": "30"},
     [8 * GiB, 3000 * MiB] + [0] * 14, [30] * 16),
    # a device's own variable over the one for all
    ({"CUDA_DEVICE_MEMORY_LIMIT": "1G", "CUDA_DEVICE_MEMORY_LIMIT_2": "2G"}, [GiB] * 2 + [2 * GiB] + [GiB] * 13,
     NONE),
    ({"CUDA_DEVICE_MEMORY_LIMIT": "2730.5m"}, [2730 * MiB + 512 * KiB] * 16, NONE),
    # what `pyvgpu wrap` writes for its members: bytes
    (lim.memory_to_env(lim.MemoryLimits(4 * GiB, {1: 64 * MiB})), [4 * GiB, 64 * MiB] + [4 * GiB] * 14, NONE),
    # 0 is no share, as in HAMi; an empty variable is no variable
    ({"CUDA_DEVICE_SM_LIMIT": "0", "CUDA_DEVICE_SM_LIMIT_1": "50%", "CUDA_DEVICE_MEMORY_LIMIT": ""}, NONE,
     [0, 50] + [0] * 14),
    ({"CUDA_DEVICE_SM_LIMIT": " 40 ", "CUDA_DEVICE_SM_LIMIT_3": "0"}, NONE, [40] * 16),
    # a simulated driver (the test suite's) lowers the floor
    ({"CUDA_DEVICE_MEMORY_LIMIT_15": "4M", "PYVGPU_MIN_MEMORY": "1M"}, [0] * 15 + [4 * MiB], NONE),
])
def test_the_environment_is_read(grammar, env, memory, sm):
    got = grammar.env(env)
    assert got[:2] == (memory, sm)


@pytest.mark.parametrize("env,start", [
    ({"CUDA_DEVICE_MEMORY_LIMIT": "4GB"}, "CUDA_DEVICE_MEMORY_LIMIT: '4GB' is ambiguous"),
    ({"CUDA_DEVICE_MEMORY_LIMIT_0": "512"}, "CUDA_DEVICE_MEMORY_LIMIT_0: 512 B is below the smallest memory cap, "
                                            "64 MiB"),
    ({"CUDA_DEVICE_MEMORY_LIMIT": "4096"}, "CUDA_DEVICE_MEMORY_LIMIT: 4 KiB is below the smallest memory cap"),
    ({"CUDA_DEVICE_MEMORY_LIMIT": "63M"}, "CUDA_DEVICE_MEMORY_LIMIT: 63 MiB is below the smallest memory cap"),
    ({"CUDA_DEVICE_MEMORY_LIMIT_²": "1G"}, "CUDA_DEVICE_MEMORY_LIMIT_²: '²' has"),
    ({"CUDA_DEVICE_MEMORY_LIMIT_16": "1G"}, "CUDA_DEVICE_MEMORY_LIMIT_16: '16' is not a device index 0..15"),
    ({"CUDA_DEVICE_MEMORY_LIMIT_x": "1G"}, "CUDA_DEVICE_MEMORY_LIMIT_x: 'x' is not a device index"),
    ({"CUDA_DEVICE_MEMORY_LIMIT": "4M", "PYVGPU_MIN_MEMORY": "x"}, "PYVGPU_MIN_MEMORY: 'x' is not a size"),
    ({"CUDA_DEVICE_SM_LIMIT": "101"}, "CUDA_DEVICE_SM_LIMIT: '101' is not a compute share"),
    ({"CUDA_DEVICE_SM_LIMIT_1": "٣٠"}, "CUDA_DEVICE_SM_LIMIT_1: '٣٠' has"),
    ({"GPU_CORE_UTILIZATION_POLICY": "sometimes"}, "GPU_CORE_UTILIZATION_POLICY='sometimes' is not one of default, "
                                                   "force, disable"),
    ({"PYVGPU_SM_BATCH_MS": "2000"}, "PYVGPU_SM_BATCH_MS='2000': give whole milliseconds from 0 to 1000"),
    ({"PYVGPU_SM_BATCH_MS": "²"}, "PYVGPU_SM_BATCH_MS='²'"),
    ({"PYVGPU_SM_TURN": "yes"}, "PYVGPU_SM_TURN='yes': give 1"),
])
def test_the_environment_is_refused(grammar, env, start):
    with pytest.raises(PyvgpuError) as e:
        grammar.env(env)
    assert str(e.value).startswith(start), str(e.value)


@pytest.mark.parametrize("env,policy,batch_ns,turns", [
    ({}, 0, 10_000_000, True),
    ({"GPU_CORE_UTILIZATION_POLICY": " FORCE ", "PYVGPU_SM_BATCH_MS": "0", "PYVGPU_SM_TURN": "0"}, 1, 0, False),
    ({"GPU_CORE_UTILIZATION_POLICY": "disable", "PYVGPU_SM_BATCH_MS": " 250 ", "PYVGPU_SM_TURN": "1"}, 2,
     250_000_000, True),
    ({"GPU_CORE_UTILIZATION_POLICY": "", "PYVGPU_SM_BATCH_MS": "", "PYVGPU_SM_TURN": " "}, 0, 10_000_000, True),
])
def test_the_compute_variables(grammar, env, policy, batch_ns, turns):
    assert grammar.env(env)[2:] == (policy, batch_ns, turns)


@pytest.mark.parametrize("text,expect", [("30", 30), ("30%", 30), (" 30 ", 30), ("1", 1), ("100", 100), ("030", 30),
                                         ("30 %", 30)])
def test_sm_percent_forms(grammar, text, expect):
    assert grammar.percent(text, "--sm") == expect


@pytest.mark.parametrize("text,message", [
    ("0", "is not a compute share"), ("101", "is not a compute share"), ("30.5", "give a whole percent"),
    ("-5", "is not a compute share"), ("", "is not a compute share"), ("x", "is not a compute share"),
    ("²", "'²' has the character '²' (SUPERSCRIPT TWO"), ("３0", "FULLWIDTH DIGIT THREE"), ("30%%", "is not a"),
])
def test_sm_percent_refusals(grammar, text, message):
    with pytest.raises(PyvgpuError) as e:
        grammar.percent(text, "--sm")
    assert str(e.value).startswith(f"--sm: '{text}'")
    assert message in str(e.value)
    if not text.isascii():
        assert "write a compute share with ASCII digits" in str(e.value)


def test_sm_option_and_env():
    assert lim.parse_sm_option("0=30,1=50").per_device == {0: 30, 1: 50}
    with pytest.raises(PyvgpuError, match="'²' has the character"):
        lim.parse_sm_option("²=30")
    assert lim.sm_from_env({"CUDA_DEVICE_SM_LIMIT": "50"}).default == 50  # what HAMi's device plugin writes
    assert lim.sm_from_env({"CUDA_DEVICE_SM_LIMIT": "0"}).default is None  # 0: none, as in HAMi
    with pytest.raises(PyvgpuError, match="CUDA_DEVICE_SM_LIMIT_1: '٣٠' has the character"):
        lim.sm_from_env({"CUDA_DEVICE_SM_LIMIT_1": "٣٠"})
    with pytest.raises(PyvgpuError, match="PYVGPU_SM_BATCH_MS='²'"):
        lim.sm_batch_ns({"PYVGPU_SM_BATCH_MS": "²"})


@pytest.mark.parametrize("spec,message", [
    ("²", "'²' has the character '²' (SUPERSCRIPT TWO"), ("0,１", "FULLWIDTH DIGIT ONE"),
    ("GPU-８e1f", "FULLWIDTH DIGIT EIGHT"), ("x", "'x' is not a device"), ("GPU-zz", "'GPU-zz' is not a device"),
    ("0,,1", "give device indices or GPU UUIDs"), ("-1", "'-1' is not a device"),
])
def test_devices_entries_are_checked_before_nvml(spec, message):
    gpus = [devices.Gpu(0, "GPU-8e1f0000-0000-0000-0000-000000000000", "fake", 16 * GiB)]
    with pytest.raises(PyvgpuError) as e:
        devices.select(spec, {}, gpus=gpus)
    assert message in str(e.value) and str(e.value).startswith(f"--devices {spec!r}")
    assert [g.index for g in devices.select("GPU-8e1f", {}, gpus=gpus)] == [0]
    assert [g.index for g in devices.select(" 0 ", {}, gpus=gpus)] == [0]


def test_the_group_library_is_the_core_alone():
    """libpyvgpu_group.so, which pyvgpu's commands load, holds the group core and none of the shim: no hooked
    driver or NVML symbol, no dlsym override: loading it changes nothing in the process."""
    import subprocess

    lib = grouplib.path()
    names = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                           check=True).stdout.split()
    exported = {n for n in names if n.startswith(("pyvgpu", "cu", "nvml", "dl"))}
    assert exported and all(n.startswith("pyvgpu_g_") for n in exported), sorted(exported)


@pytest.mark.parametrize("text,shown", [("4'G", "\"4'G\""), ("4\"G", "'4\"G'"), ("a\\b", "'a\\\\b'"),
                                        ("\x7f", "'\\x7f'"), ("\t", "'\\t'"), ("4\u00a0G", "'4\\xa0G'"),
                                        ("٤G", "'٤G'"), ("4\u2009G", "'4\\u2009G'")])
def test_values_are_shown_as_python_shows_them(text, shown):
    """A message shows a value as repr() does, also when C writes it: the shim's messages and the commands' are
    one text."""
    assert repr(text) == shown
    out = grouplib.ctypes.create_string_buffer(256)
    raw = text.encode()
    grouplib.lib().pyvgpu_g_repr(raw, len(raw), out, len(out))
    assert out.value.decode() == shown
