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


def _wrap(env, *args, **kw):
    from helpers import PYVGPU, run

    return run([*PYVGPU, "wrap", *args], env=env, **kw)


def test_xdg_runtime_dir_that_is_a_file_is_named(env, tmp_path):
    f = tmp_path / "afile"
    f.write_text("")
    p = _wrap(dict(env, XDG_RUNTIME_DIR=str(f)), "-m", "64M", "--", "true")
    assert p.returncode == 2
    assert p.stderr == (f"pyvgpu: XDG_RUNTIME_DIR={f} is not a directory; set it to a directory of your own, or "
                        f"unset it (pyvgpu then keeps its groups in /tmp/pyvgpu-{__import__('os').getuid()})\n")


def test_warmup_that_cannot_write_its_cache_does_not_say_run_warmup(env, tmp_path):
    from helpers import PYVGPU, run

    f = tmp_path / "afile"
    f.write_text("")
    p = run([*PYVGPU, "warmup"], env=dict(env, PYVGPU_CACHE_DIR=str(f / "cache")))
    assert p.returncode == 2
    assert "`pyvgpu warmup` cannot write the callback cache" in p.stderr and "PYVGPU_CACHE_DIR" in p.stderr
    assert "run `pyvgpu warmup`" not in p.stderr and p.stderr.count("\n") == 1


def test_doctor_checks_the_callback_cache(env):
    from helpers import PYVGPU, run

    p = run([*PYVGPU, "doctor"], env=env)
    assert "callback cache: " in p.stdout


def test_a_join_with_other_devices_reads_well(env, tmp_path):
    e = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    assert _wrap(e, "-g", "d", "-m", "64M", "--", "true").returncode == 0
    p = _wrap(e, "-g", "d", "-d", "0", "--", "true")
    assert p.returncode == 2
    assert "uses every device CUDA sees (no --devices), but --devices 0 asks for 0" in p.stderr


def test_bench_vpmm_checks_cap_and_says_direct_ignores_it(env):
    from helpers import PYVGPU, run

    p = run([*PYVGPU, "bench", "vpmm", "--direct", "--cap", "banana"], env=env)
    assert p.returncode == 2 and "--cap banana: --direct replays the trace in this process" in p.stderr
    p = run([*PYVGPU, "bench", "vpmm", "--cap", "banana"], env=env)
    assert p.returncode == 2 and "--cap: 'banana' is not a size" in p.stderr


def test_ctrl_c_before_the_program_starts_prints_no_traceback(env, tmp_path):
    import signal
    import time

    e = dict(env, XDG_RUNTIME_DIR=str(tmp_path))
    # Ctrl-C as a terminal delivers it: a test run started in the background (`cmd &` in a script) hands its
    # children SIGINT ignored, and then the wrap never saw it
    p = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                          "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                          "from pyvgpu import entry; from pyvgpu.ops import wrap\n"
                          "def slow(*a, **k):\n    time.sleep(60)\n"
                          "wrap.build_env = slow\n"  # stands for a wrap still preparing the vGPU
                          "print('ready', flush=True)\n"
                          "entry.main(['wrap', '-m', '64M', '--', 'true'])\n"],
                         env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=tmp_path)  # the installed pyvgpu, not the source tree (as helpers.run does)
    assert p.stdout.readline() == "ready\n"
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert err == "pyvgpu: interrupted\n"


def test_a_context_above_the_cap_says_what_it_needs_and_the_fix(env, fake):
    from helpers import PYVGPU, run

    env = dict(env, FAKECUDA_CTX_BYTES="16M")  # the fake's context takes 16 MiB, as PyTorch's ~0.5 GiB on an H100
    p = run([*PYVGPU, "wrap", "--memory", "8M", "--", str(fake / "host_mem_linked"), "boundary", "1"], env=env)
    assert "FAIL p_retain(&g_ctx, d) -> 2" in p.stdout, p.stdout + p.stderr  # CUDA_ERROR_OUT_OF_MEMORY
    lines = [line for line in p.stderr.splitlines() if "CUDA context" in line]
    assert lines == ["pyvgpu: a CUDA context on device 0 needs 16 MiB of device memory, but the group's memory cap is "
                     "8 MiB (0 MiB in use); give a cap of at least 16 MiB (`pyvgpu wrap --memory`, or `pyvgpu limits "
                     "set --memory` for a running group)"], p.stderr
