"""The wrap request as one record end to end: the command line makes a WrapRequest, checked when it is made;
build_env and join_group read it (and the environment, in one place: ops.wrap.group_spec); the region is
made or joined from one GroupSpec (pyvgpu.group.spec), also checked when it is made."""

from __future__ import annotations

import dataclasses
import inspect
import os

import pytest

from pyvgpu.contract import layout as L
from pyvgpu.errors import PyvgpuError
from pyvgpu.group import limits as lim
from pyvgpu.group import region
from pyvgpu.group.spec import GroupSpec
from pyvgpu.ops import wrap
from pyvgpu.ops.wrap import WrapRequest

MiB = 1 << 20


@pytest.mark.parametrize("kw, says", [
    ({"memory": "4X"}, "--memory '4X': '4X' is not a size; give a number of bytes"),
    ({"memory": "4GB"}, "--memory '4GB': '4GB' is ambiguous"),
    ({"sm": "130"}, "--sm '130': '130' is not a compute share; give a whole percent from 1 to 100"),
    ({"group": "a/b"}, "--group 'a/b': a group name is 1-63 letters, digits, '.', '_' or '-'"),
])
def test_a_bad_size_share_or_group_name_is_refused_when_the_request_is_made(kw, says):
    with pytest.raises(PyvgpuError) as e:
        WrapRequest(**kw)
    assert says in str(e.value)


def test_the_request_keeps_its_text_and_what_it_parses_to():
    r = WrapRequest(memory="0=256M,1=1G", sm="30", group="")  # an empty --group= is no group, as before
    assert r.memory == "0=256M,1=1G" and r.sm == "30"
    assert r.memory_limits == lim.MemoryLimits(per_device={0: 256 * MiB, 1: 1 << 30})
    assert r.sm_shares == lim.SmLimits(default=30)
    assert WrapRequest().memory_limits is None and WrapRequest().sm_shares is None
    assert r == WrapRequest(memory="0=256M,1=1G", sm="30", group="")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.sm = "40"


def test_no_function_on_the_request_s_path_takes_loose_arguments():
    """CLI -> WrapRequest -> build_env / join_group / group_spec -> region.create_or_open / create: each
    takes the record (and at most a few more), never the request's fields one by one."""
    for fn in (wrap.build_env, wrap.join_group, wrap.group_spec, region.create_or_open, region.create,
               wrap.sm_limits_for):
        assert len(inspect.signature(fn).parameters) <= 5, fn.__name__
    assert list(inspect.signature(region.create_or_open).parameters) == ["path", "spec"]
    assert list(inspect.signature(wrap.group_spec).parameters) == ["env", "request"]


def test_a_group_spec_is_checked_when_made_and_frozen():
    s = GroupSpec("g", [64 * MiB, 0, 32 * MiB], sm=[30] * L.MAX_DEVICES, priority=L.PRIORITY_HIGH, sm_borrow=1)
    assert s.limits == lim.MemoryLimits(per_device={0: 64 * MiB, 2: 32 * MiB})  # a region's list, as its values
    assert s.sm.as_list() == [30] * L.MAX_DEVICES and s.sm_borrow is True and s.visible == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.priority = L.PRIORITY_LOW
    for kw, says in (
            ({"priority": 7, "priority_source": "CUDA_TASK_PRIORITY"},
             "CUDA_TASK_PRIORITY: priority 7 is not 0 (high) or 1 (low)"),
            ({"limits": [1] * (L.MAX_DEVICES + 1), "limits_source": "--memory"},
             "--memory: 17 devices' memory cap given, a group has at most 16"),
            ({"limits": lim.MemoryLimits(per_device={16: MiB}), "limits_source": "--memory 16=1M"},
             "--memory 16=1M: there is no device 16 in a group (devices 0-15)"),
            ({"limits": [-1]}, "CUDA_DEVICE_MEMORY_LIMIT: a memory cap of -1 on device 0 is negative; give 0 or more"),
            ({"sm": lim.SmLimits(default=150), "sm_source": "--sm"},
             "--sm: a compute share of 150% is over 100%; give a percent from 1 to 100"),
            ({"sm": [30, 0, 120], "sm_source": "CUDA_DEVICE_SM_LIMIT_2"},
             "CUDA_DEVICE_SM_LIMIT_2: a compute share of 120% on device 2 is over 100%"),
            ({"n_physical": -2}, "n_physical -2 is not a count of devices")):
        with pytest.raises(PyvgpuError) as e:
            GroupSpec("g", **kw)
        assert says in str(e.value), kw


def test_create_or_open_makes_the_region_a_spec_describes_and_checks_a_joiner_s(tmp_path):
    p = tmp_path / "s.region"
    spec = GroupSpec("s", lim.MemoryLimits(default=64 * MiB), lim.SmLimits(per_device={1: 40}),
                     priority=L.PRIORITY_HIGH, sm_borrow=True, n_physical=2, limits_source="--memory 64M")
    r = region.create_or_open(p, spec)
    assert r.name == "s" and r.limits() == [64 * MiB] * L.MAX_DEVICES and r.sm_limits()[:3] == [0, 40, 0]
    assert (r.header.priority, r.header.sm_borrow, r.header.n_physical) == (L.PRIORITY_HIGH, 1, 2)
    r.close()
    region.create_or_open(p, GroupSpec("s")).close()  # asks nothing: joins whatever the group has
    with pytest.raises(PyvgpuError, match=r"--memory 128M"):
        region.create_or_open(p, GroupSpec("s", lim.MemoryLimits(default=128 * MiB), limits_source="--memory 128M"))
    with pytest.raises(PyvgpuError, match=r"--sm-cap"):
        region.create_or_open(p, GroupSpec("s", sm_borrow=False, borrow_source="--sm-cap"))


def test_group_spec_is_where_the_options_meet_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PYVGPU_MIN_MEMORY", "1M")  # options are read against the process's own floor
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # the named group's file, the test's own
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "8M", "CUDA_DEVICE_MEMORY_LIMIT_1": "4M", "CUDA_TASK_PRIORITY": "0",
           "PYVGPU_MIN_MEMORY": "1M"}
    path, spec, mps_shares = wrap.group_spec(dict(env), WrapRequest(region_path=str(tmp_path / "e.region")))
    assert path == str(tmp_path / "e.region") and not os.path.exists(path)  # chosen, not yet made (text)
    assert spec.name == "e" and spec.limits == lim.MemoryLimits(default=8 * MiB, per_device={1: 4 * MiB})
    assert (spec.limits_source, spec.priority, spec.priority_source) == ("CUDA_DEVICE_MEMORY_LIMIT", 0,
                                                                          "CUDA_TASK_PRIORITY")
    assert spec.sm_borrow is None and not mps_shares

    got = dict(env)  # an option replaces the variables it stands for, in the program's environment too
    _, spec, _ = wrap.group_spec(got, WrapRequest(memory="16M", priority="low", group="opt", sm_borrow=True))
    assert spec.name == "opt" and spec.limits == lim.MemoryLimits(default=16 * MiB)
    assert (spec.limits_source, spec.priority, spec.priority_source, spec.sm_borrow, spec.borrow_source) == (
        "--memory 16M", L.PRIORITY_LOW, "--priority low", True, "--sm-borrow")
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in got and "CUDA_DEVICE_MEMORY_LIMIT_1" not in got
