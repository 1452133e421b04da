"""bench sm's load runner: a load that does not finish is killed, and the error says what it printed last."""

from __future__ import annotations

import sys

import pytest

from pyvgpu.bench.sm import _Run
from pyvgpu.errors import PyvgpuError


def test_a_load_that_does_not_finish_is_killed_and_its_last_words_are_kept():
    code = ("import sys, time; print('P 1 42', flush=True); "
            "print('stuck in a collective', file=sys.stderr, flush=True); time.sleep(60)")
    run = _Run([sys.executable, "-c", code], {}, None)
    with pytest.raises(PyvgpuError) as e:
        run.finish(timeout=3)
    msg = str(e.value)
    assert "did not finish in 3 s" in msg and "P 1 42" in msg and "stuck in a collective" in msg, msg
    assert run.proc.poll() is not None  # killed, not left running
