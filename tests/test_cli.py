"""The command line: help, doctor, warmup, bench (figures printed, never asserted as timings)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import PYVGPU, run

import pyvgpu
from pyvgpu.contract import hooks


def test_version_and_help(env):
    p = run([*PYVGPU, "--version"], env=env)
    assert p.returncode == 0 and p.stdout.strip() == f"pyvgpu {pyvgpu.__version__}"
    p = run([*PYVGPU, "wrap", "--help"], env=env)
    assert p.returncode == 0 and "--on-error" in p.stdout and "--stats" in p.stdout
    p = run([*PYVGPU], env=env)  # no command: the help, as a usage error (click prints it on stderr)
    assert "wrap" in p.stdout + p.stderr and "doctor" in p.stdout + p.stderr


def test_wrap_without_a_program(env):
    p = run([*PYVGPU, "wrap"], env=env)
    assert p.returncode == 2 and "PROGRAM" in p.stderr


def test_doctor_on_the_fake_driver(env):
    p = run([*PYVGPU, "doctor", "--json"], env=env)
    checks = {c["name"]: c for c in json.loads(p.stdout)}
    assert checks["shim built"]["ok"]
    assert checks["CUDA driver found"]["ok"] and "CUDA 13.0" in checks["CUDA driver found"]["detail"]
    assert checks["NVML found"]["ok"]
    assert "libpython embeddable" not in checks  # nothing embeds an interpreter any more
    # the packaged library, or one tuned for this CPU where the user's cache holds one for these sources (a
    # `pyvgpu warmup`, or a build of the same tree that compiled there: the tests share that cache)
    detail = checks["compiled callbacks"]["detail"]
    assert checks["compiled callbacks"]["ok"] and ("libpyvgpu_callbacks.so" in detail or "tuned for this CPU" in detail)
    assert p.returncode == 0


def test_doctor_without_a_driver(env):
    env["LD_LIBRARY_PATH"] = "/nonexistent"
    p = run([*PYVGPU, "doctor"], env=env)
    assert p.returncode == 1
    assert "[FAIL] CUDA driver found" in p.stdout and "fix:" in p.stdout


def test_wrap_without_a_driver_says_so_in_one_line_and_runs_the_program(env):
    env["LD_LIBRARY_PATH"] = "/nonexistent"
    p = run([*PYVGPU, "wrap", "--", sys.executable, "-c", "print('ran')"], env=env)
    assert p.returncode == 0 and p.stdout == "ran\n", p.stderr
    (line,) = p.stderr.splitlines()
    assert line.startswith("pyvgpu: no CUDA driver (libcuda.so.1 does not load")
    assert "the program runs without a GPU. Fix: install the NVIDIA driver, or put its directory on " \
           "LD_LIBRARY_PATH (`pyvgpu doctor` checks it)" in line
    env["LD_LIBRARY_PATH"] = str(Path(env["PYVGPU_SCHED"]).parent)  # a directory without a driver, not missing
    p = run([*PYVGPU, "wrap", "--", sys.executable, "-c", "print('ran')"], env=env)
    assert p.returncode == 0 and p.stdout == "ran\n" and len(p.stderr.splitlines()) == 1


def test_the_first_wrap_compiles_nothing(env, tmp_path):
    """An empty user cache: the packaged callbacks serve the first program at once."""
    env["PYVGPU_CACHE_DIR"] = str(tmp_path / "new-user-cache")
    p = run([*PYVGPU, "wrap", "--memory", "4M", "--", sys.executable, "-c", "print('ran')"], env=env)
    assert p.returncode == 0 and p.stdout == "ran\n", p.stderr
    assert p.stderr == ""
    assert not (tmp_path / "new-user-cache").exists()


def test_warmup_compiles_for_this_cpu_into_the_given_dir(env, tuned_cache):
    """`pyvgpu warmup` (run once by the tuned_cache fixture) compiles with progress and an estimate."""
    import llvmlite.binding as llvm

    from pyvgpu.host import cpuid

    m = json.loads((tuned_cache.parent / "warmup.json").read_text())
    assert m["library"].startswith(str(tuned_cache)) and m["origin"] == "cache"
    assert m["tuned"] and m["cpu"] == llvm.get_host_cpu_name() and m["cpu_id"] == f"{cpuid.cpu_id():016x}"
    assert m["callbacks"] == sum(1 for e in hooks.ENTRIES if e.policy)
    err = (tuned_cache.parent / "warmup.stderr").read_text()
    assert "compiling the callbacks for this CPU (`pyvgpu warmup`); about" in err
    assert "callbacks compiled" in err and "s left" in err
    env["PYVGPU_CACHE_DIR"] = str(tuned_cache)
    p = run([*PYVGPU, "warmup", "--json"], env=env)  # there already: nothing compiled
    assert p.returncode == 0 and json.loads(p.stdout) == m and "compiling" not in p.stderr


def test_bench_overhead_runs_on_the_fake(env, tmp_path):
    out = tmp_path / "o.json"
    p = run([*PYVGPU, "bench", "overhead", "--rounds", "1", "--samples", "20", "--output", str(out)], env=env)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    for op in ("launch", "alloc_free"):
        s = r["ops"][op]
        assert s["raw_ns"] > 0 and s["hook_ns"] > 0 and s["ratio"] > 0
    assert "ratio" in p.stdout and f"wrote {out}" in p.stderr
    assert "note: no GPU here" in p.stdout  # the fake's ratios say nothing about a GPU's
    from pyvgpu.native import cache

    assert r["callbacks"] == cache.read()["library"] and f"callbacks: {r['callbacks']}" in p.stdout
    # --json: the same result on stdout, and nothing else there
    p = run([*PYVGPU, "bench", "overhead", "--rounds", "1", "--samples", "20", "--json"], env=env)
    assert p.returncode == 0, p.stderr
    assert set(json.loads(p.stdout)["ops"]) == set(r["ops"])
    assert (r["ops"]["launch"]["goal"], r["ops"]["alloc_free"]["goal"]) == (1.01, 1.02)
    # under a share a launch is charged, paced and timed: its goal is 1.05 (the table printed 1.01)
    p = run([*PYVGPU, "bench", "overhead", "--rounds", "1", "--samples", "20", "--sm", "99", "--json"], env=env)
    assert p.returncode == 0, p.stderr
    ops = json.loads(p.stdout)["ops"]
    assert (ops["launch"]["goal"], ops["alloc_free"]["goal"]) == (1.05, 1.02)


# --- wrap parses like `docker run` ----------------------------------------------------------------

PY = sys.executable
SHOW = ("import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('CUDA_DEVICE_MEMORY_LIMIT'), "
        "os.environ.get('CUDA_DEVICE_SM_LIMIT')]))")


def shown(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("wrap_args,argv,cap", [
    # everything after PROGRAM is the program's, untouched: no cap from its -m
    ([PY, "-c", SHOW, "-m", "2G"], ["-m", "2G"], None),
    ([PY, "-c", SHOW, "--memory", "2G", "--sm", "30", "--help"], ["--memory", "2G", "--sm", "30", "--help"],
     None),
    # `--` before PROGRAM is allowed, and a `--` after PROGRAM is the program's
    (["--", PY, "-c", SHOW, "-m", "2G"], ["-m", "2G"], None),
    (["--memory", "64M", "--", PY, "-c", SHOW, "--", "x"], ["--", "x"], str(64 << 20)),
    (["--memory", "64M", PY, "-c", SHOW, "--", "-m", "2G"], ["--", "-m", "2G"], str(64 << 20)),
    (["-m", "64M", PY, "-c", SHOW], [], str(64 << 20)),
])
def test_wrap_gives_everything_after_program_to_the_program(env, wrap_args, argv, cap):
    got_argv, got_cap, got_sm = shown(run([*PYVGPU, "wrap", *wrap_args], env=env))
    assert got_argv == argv and got_cap == cap and got_sm is None


@pytest.mark.parametrize("wrap_args,bad,suggest", [
    (["--memroy", "4G", PY, "-c", "print('ran')"], "--memroy", "--memory"),
    (["--memory", "64M", "--sm30", PY, "-c", "print('ran')"], "--sm30", None),
    (["-x", "--", PY, "-c", "print('ran')"], "-x", None),
])
def test_wrap_refuses_an_unknown_option_before_program(env, wrap_args, bad, suggest):
    p = run([*PYVGPU, "wrap", *wrap_args], env=env)
    assert p.returncode == 2 and "ran" not in p.stdout
    assert f"No such option: {bad}" in p.stderr and "program not found" not in p.stderr
    if suggest:
        assert suggest in p.stderr.split(f"No such option: {bad}")[1]


def test_help_has_one_grammar(env):
    """No typer type placeholders (<bool>, <str>, <int>), extras visible, completion offered, the usage line."""
    p = run([*PYVGPU, "--help"], env=env)
    assert "--install-completion" in p.stdout
    for cmd in (["wrap"], ["status"], ["top"], ["exporter"], ["warmup"], ["doctor"], ["limits", "set"],
                ["bench", "overhead"], ["bench", "startup"], ["bench", "sm"], ["bench", "matrix"], ["bench", "vpmm"],
                ["bench", "schedule"],
                ["group", "ls"], ["group", "rm"]):
        p = run([*PYVGPU, *cmd, "--help"], env=env)
        assert p.returncode == 0, p.stderr
        assert "<" not in p.stdout.replace("<=", ""), (cmd, p.stdout)
        assert "on|off" not in p.stdout, cmd  # on/off settings are flag pairs (--sm-borrow/--sm-cap) everywhere
        assert run([*PYVGPU, *cmd, "-h"], env=env).stdout == p.stdout  # -h is --help
        if cmd[0] == "bench" or cmd[0] in ("status", "doctor", "warmup"):
            assert "--json " in p.stdout
    assert "pip install 'pyvgpu[bench]'" in run([*PYVGPU, "bench", "sm", "--help"], env=env).stdout
    assert "Usage: pyvgpu wrap [OPTIONS] [--] PROGRAM [ARGS]..." in run([*PYVGPU, "wrap", "--help"], env=env).stdout


def test_the_quick_start_example_runs_or_says_what_it_needs(env):
    """examples/train.py (the README's quick start): trains, or names what is missing."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "train.py"
    p = run([PY, str(example), "--steps", "2", "--width", "8", "--batch", "4"], env=env, timeout=600)
    try:
        import torch  # noqa: F401
    except ImportError:
        assert p.returncode == 2 and "needs PyTorch: pip install torch" in p.stderr
    else:
        assert p.returncode == 0, p.stderr
        assert "2 steps in" in p.stdout and "loss" in p.stdout


# --- typer's documented style, and what the docs promise -----------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _commands(group=None, path=()):
    """Every (path, click command) of the `pyvgpu` command line."""
    import typer

    from pyvgpu.cli import app

    group = group or typer.main.get_command(app)
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_every_option_is_annotated_with_its_true_type():
    """`Annotated[T, typer.Option(...)]` everywhere; an option that may be None says so in its type."""
    import inspect
    import types
    import typing

    import typer.models

    for path, cmd in _commands():
        sig = inspect.signature(cmd.callback.__wrapped__ if hasattr(cmd.callback, "__wrapped__") else cmd.callback)
        hints = typing.get_type_hints(cmd.callback, include_extras=True)
        for name, param in sig.parameters.items():
            assert not isinstance(param.default, typer.models.ParameterInfo), (path, name)  # the old style
            hint = hints[name]
            assert typing.get_origin(hint) is typing.Annotated, (path, name)
            if param.default is None:
                t = typing.get_args(hint)[0]
                assert typing.get_origin(t) in (typing.Union, types.UnionType) and type(None) in typing.get_args(t), \
                    (path, name, t)


# Options that name a file or directory; --png takes '' for "no plot" (scripts/gpu_check.sh), which a Path cannot.
NOT_A_PATH = {(("bench", "sm"), "png"), (("bench", "matrix"), "png")}  # '' means no plot


def test_every_option_that_names_a_file_is_a_path():
    """PATH, FILE and DIR options are typed Path (list[Path] when repeatable), never text."""
    import typing
    from pathlib import Path

    named = []
    for path, cmd in _commands():
        hints = typing.get_type_hints(cmd.callback, include_extras=True)
        for p in cmd.params:
            if not any(w in str(p.metavar or "") for w in ("PATH", "FILE", "DIR")) or (path, p.name) in NOT_A_PATH:
                continue
            t = typing.get_args(hints[p.name])[0]
            args = [a for a in typing.get_args(t) if a is not type(None)] or [t]
            inner = typing.get_args(args[0]) if typing.get_origin(args[0]) is list else args
            assert inner == [Path] or inner == (Path,), (path, p.name, t)
            named.append(p.opts[0])
    assert {"--region", "--stats-file", "--state-dir", "--kubeconfig", "--nodes", "--runtime-dir",
            "--tls-cert-file", "--python", "--output"} <= set(named)


def test_a_gpu_policy_is_its_words_and_keeps_hamis_spelling():
    from pyvgpu.cluster.cli import GpuPolicies, GpuPolicy
    from pyvgpu.cluster.core.request import gpu_policy_of
    from pyvgpu.errors import PyvgpuError

    for text in ("spread", "binpack", "numa", "binpack,topology-aware", "binpack,", " mutex , numa"):
        got = GpuPolicies(text)
        assert got.words and all(isinstance(w, GpuPolicy) for w in got.words) and got == text
        gpu_policy_of(str(got), "--gpu-policy")  # what the scheduler is given reads as the text would
    assert GpuPolicies("binpack,topology-aware").words == (GpuPolicy.binpack, GpuPolicy.topology_aware)
    for bad in ("", ",", "pack", "binpack,pack"):
        with pytest.raises(PyvgpuError, match="--gpu-policy .*: use spread, binpack"):
            GpuPolicies(bad)


def test_a_priority_pair_is_two_priorities_as_given():
    from pyvgpu.cli.common import Priority, PriorityPair

    assert PriorityPair("high,low").priorities == (Priority.high, Priority.low) and PriorityPair("0, 1") == "0, 1"
    assert PriorityPair("0, 1").priorities == (Priority.high, Priority.low)  # HAMi's numbers


def test_explain_reads_its_files_and_stdin_by_path(env, tmp_path):
    """--nodes/--pods/--pod are Paths; '-' still reads stdin, and --gpu-policy reaches the decision."""
    nodes, pods = tmp_path / "nodes.json", tmp_path / "pods.json"
    nodes.write_text(json.dumps({"kind": "NodeList", "items": []}))
    pods.write_text(json.dumps({"kind": "PodList", "items": []}))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d", "uid": "u1"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    p = run([*PYVGPU, "cluster", "explain", "--nodes", str(nodes), "--pods", str(pods), "--pod", "-", "--json",
             "--gpu-policy", "binpack,topology-aware"], env=env, input=json.dumps(pod))
    assert p.returncode == 0, p.stderr
    assert isinstance(json.loads(p.stdout), dict)
    p = run([*PYVGPU, "cluster", "explain", "--nodes", str(tmp_path / "none.json"), "--pods", str(pods), "--pod",
             "-"], env=env, input="{}")
    assert p.returncode == 2 and f"--nodes {tmp_path / 'none.json'}: cannot read it" in p.stderr, p.stderr


def test_every_option_has_one_sentence_of_help():
    """Details go to docs/manual.md and docs/cluster.md, not into --help."""
    import re

    for path, cmd in _commands():
        for p in cmd.params:
            if p.opts[0].startswith("-"):
                assert p.help and p.help.endswith(".") and not re.search(r"[.;!?] [A-Z]", p.help), (path, p.name)


def test_every_choice_is_an_enum_of_the_librarys_values_and_completes():
    from pyvgpu.bench import sm, vpmm_workloads
    from pyvgpu.cli import bench, common
    from pyvgpu.cluster.cli import GpuPolicy, NodePolicy
    from pyvgpu.cluster.core import keys
    from pyvgpu.group import limits, mps
    from pyvgpu.ops import wrap
    from pyvgpu.vpmm.torch_startup import ALLOCATORS

    for kind, values in ((common.Mode, mps.MODES), (common.Priority, limits.PRIORITIES),
                         (common.Allocator, ALLOCATORS), (common.OnError, wrap.ON_ERROR_CHOICES),
                         (bench.SmWorkload, sm.WORKLOADS), (bench.Neighbour, sm.NEIGHBOURS),
                         (bench.VpmmWorkload, ("trace", *vpmm_workloads.WORKLOADS, "all")),
                         (NodePolicy, (keys.BINPACK, keys.SPREAD)), (GpuPolicy, keys.GPU_POLICY_WORDS)):
        assert tuple(m.value for m in kind) == tuple(values), kind
    import typer

    cmds = dict(_commands())
    for path, option, typed, want in ((("wrap",), "--mode", "h", ["hami-core"]),
                                      (("wrap",), "--priority", "", ["high", "low"]),
                                      (("bench", "sm"), "--workload", "m", ["matmul", "mlp"]),
                                      (("cluster", "scheduler"), "--gpu-policy", "binpack,t",
                                       ["binpack,topology-aware"])):
        cmd = cmds[path]
        param = next(p for p in cmd.params if option in p.opts)
        ctx = typer.Context(cmd)
        assert [c.value for c in param.shell_complete(ctx, typed)] == want, (path, option)


def test_every_choice_survives_older_typers_second_conversion():
    """typer before 0.29 (pyproject allows 0.12 on) converts an Enum option's parsed value once more, looking
    it up by ``str(value).lower()`` among the values; a member whose ``str()`` is "Kind.member" became None
    there (`bench vpmm --workload decode` failed with "'NoneType' object has no attribute 'value'" on a GPU
    machine with such a typer). Every choice of every command is a ``Choice``, whose ``str()`` is its value."""
    import enum
    import typing

    from pyvgpu.cli.common import Choice

    seen = set()
    for path, cmd in _commands():
        hints = typing.get_type_hints(cmd.callback, include_extras=True)
        for p in cmd.params:
            if p.name not in hints:
                continue
            kind = typing.get_args(hints[p.name])[0]  # Annotated[kind, option]
            for k in typing.get_args(kind) or (kind,):  # kind | None
                if isinstance(k, type) and issubclass(k, enum.Enum):
                    assert issubclass(k, Choice), (path, p.name, k)
                    seen.add(k)
    assert len(seen) >= 8 and seen <= set(Choice.__subclasses__()), seen
    seen |= set(Choice.__subclasses__())  # and the choices read inside an option's text (--gpu-policy's words)
    for kind in seen:
        lookup = {str(m.value).lower(): m for m in kind}  # the older typers' table
        for m in kind:
            assert lookup.get(str(m).lower()) is m, (kind, m)


def test_a_bad_choice_gets_the_librarys_one_line_message_on_every_path(env):
    for args, says in ((["wrap", "--priority", "mid", "--", "true"], "--priority: 'mid' is not a priority; give high"),
                       (["bench", "sm", "--workload", "fft"], "--workload 'fft' is not one of spin, graph, matmul"),
                       (["bench", "sm", "--mode", "mig"], "--mode 'mig' is not one of hami-core, mps"),
                       (["cluster", "scheduler", "--port", "1", "--node-policy", "pack"],
                        "--node-policy 'pack': use binpack or spread"),
                       (["cluster", "scheduler", "--port", "1", "--gpu-policy", "binpack,pack"],
                        "--gpu-policy 'binpack,pack': use spread, binpack, topology-aware, mutex or numa, or a comma "
                        "list of them"),
                       (["cluster", "explain", "--nodes", "n", "--pods", "p", "--pod", "x", "--gpu-policy", " , "],
                        "--gpu-policy ' , ': use spread"),
                       (["bench", "sm", "--priorities", "high"], "--priorities 'high': give two, one per group"),
                       (["bench", "sm", "--priorities", "high,mid"], "--priorities: 'mid' is not a priority")):
        for entry in (PYVGPU, [sys.executable, "-m", "pyvgpu.cli"]):
            p = run([*entry, *args], env=env)
            assert p.returncode == 2 and p.stderr.startswith("pyvgpu: ") and says in p.stderr, (args, p.stderr)
            assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_every_option_the_docs_and_the_gpu_script_give_a_command_exists():
    """`pyvgpu bench sm --seconds 4` and the like, in docs/*.md, README.md and scripts/gpu_check.sh: each
    option exists on that command (an option that docs promise and the command lacks is a bug)."""
    import re
    import shlex

    cmds = dict(_commands())
    checked, missing = [], []
    for f in [ROOT / "README.md", ROOT / "scripts" / "gpu_check.sh", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for m in re.finditer(r"pyvgpu ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?([^`|;&)\n]*)", line):
                path = (m[1], m[2]) if (m[1], m[2]) in cmds else (m[1],)
                if path not in cmds:
                    continue
                rest = m[3] if len(path) == 2 else f"{m[2] or ''} {m[3]}"
                try:
                    words = shlex.split(rest)
                except ValueError:
                    words = rest.split()
                opts = {o: p for p in cmds[path].params for o in (*p.opts, *p.secondary_opts)}
                i = 0
                while i < len(words) and words[i] != "--":
                    w = words[i]
                    name = w.split("=")[0].rstrip(".,:'\"")
                    if re.fullmatch(r"--[a-z][a-z-]*", name) and name != "--help":
                        checked.append(name)
                        if name not in opts:
                            missing.append(f"{f.relative_to(ROOT)}:{n}: pyvgpu {' '.join(path)} {name}")
                        elif "=" not in w and not opts[name].is_flag:
                            i += 1  # its value
                    elif not w.startswith("-") and path == ("wrap",):
                        break  # PROGRAM: the rest is the program's
                    i += 1
    assert not missing, missing
    assert "--seconds" in checked and len(checked) > 50  # the scan reads what it should
    sm = next(p for p in cmds[("bench", "sm")].params if p.name == "seconds")
    assert sm.opts == ["--seconds"]
