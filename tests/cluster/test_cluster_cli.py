"""`pyvgpu cluster explain` and `pyvgpu bench schedule`: output, JSON schema, exit codes, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import ctr, gpu, node, nodelist, pod, podlist
from typer.testing import CliRunner

from pyvgpu.cli import app

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "cluster"


def explain(*args: str):
    return CliRunner().invoke(app, ["cluster", "explain", *args])


def files(tmp_path: Path, nodes, pods, the_pod, pod_text: str | None = None) -> list[str]:
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    (tmp_path / "pods.json").write_text(json.dumps(pods))
    (tmp_path / "pod.yaml").write_text(pod_text if pod_text is not None else json.dumps(the_pod))
    return ["--nodes", str(tmp_path / "nodes.json"), "--pods", str(tmp_path / "pods.json"),
            "--pod", str(tmp_path / "pod.yaml")]


def test_the_documented_example():
    r = explain("--nodes", str(EXAMPLES / "nodes.json"), "--pods", str(EXAMPLES / "pods.json"),
                "--pod", str(EXAMPLES / "pod.yaml"))
    assert r.exit_code == 0, r.output
    assert "decision: gpu-a" in r.output
    assert "hami.io/vgpu-devices-to-allocate: GPU-a3,NVIDIA,20000,30:GPU-a2,NVIDIA,20000,30:;" in r.output
    assert "GPU 0 GPU-b0: memory: 7360 MiB free of 15360, needs 20000" in r.output
    assert 'hami.io/node-nvidia-register[0].devmem: expected an integer, got "80GB"' in r.output


def test_json_schema():
    r = explain("--nodes", str(EXAMPLES / "nodes.json"), "--pods", str(EXAMPLES / "pods.json"),
                "--pod", str(EXAMPLES / "pod.yaml"), "--json")
    assert r.exit_code == 0
    out = json.loads(r.stdout)
    assert out["node"] == "gpu-a"
    assert out["annotations"]["hami.io/vgpu-node"] == "gpu-a"
    assert out["annotations"]["hami.io/vgpu-devices-to-allocate"] == "GPU-a3,NVIDIA,20000,30:GPU-a2,NVIDIA,20000,30:;"
    assert [set(n) for n in out["nodes"]] == [{"name", "fits", "score", "reason"}] * 5
    assert [(n["name"], n["fits"]) for n in out["nodes"]] == [
        ("gpu-a", True), ("gpu-mig", True), ("cpu-1", False), ("gpu-b", False), ("gpu-c", False)]
    broken = next(n for n in out["nodes"] if n["name"] == "gpu-c")
    assert broken["score"] is None and "devmem" in broken["reason"]
    assert out["containers"][0]["devices"][0]["uuid"] == "GPU-a3"


def test_no_node_fits_still_exits_0(tmp_path):
    args = files(tmp_path, nodelist(node("n1", [gpu("GPU-a", mem=1000)])), podlist(),
                 pod(containers=[ctr(mem=2000)]))
    r = explain(*args, "--json")
    assert r.exit_code == 0
    out = json.loads(r.stdout)
    assert out["node"] is None and out["annotations"] == {} and out["nodes"][0]["fits"] is False
    r = explain(*args)
    assert r.exit_code == 0 and "no node fits; the pod stays Pending" in r.output


def test_a_node_whose_agent_stopped_answering_fits_nothing_as_in_the_scheduler(tmp_path):
    # issue 30, item 9 (HAMi CheckHealth): a handshake still Requesting 60 s after it was asked, on a node that
    # lists no allocatable GPUs, is a dead agent; explain judges it as the scheduler does, at --now or now
    from pyvgpu.cluster.core import keys

    stale = node("gone", [gpu("GPU-g")], annotations={keys.NODE_HANDSHAKE: "Requesting_2020-01-01 20:00:00"})
    args = files(tmp_path, nodelist(stale, node("ok", [gpu("GPU-o", mem=1000)])), podlist(),
                 pod(containers=[ctr(mem=2000)]))
    r = explain(*args, "--now", "2020-01-01T20:01:01Z", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["node"] is None
    gone = next(n for n in out["nodes"] if n["name"] == "gone")
    assert gone["fits"] is False and "has not answered the handshake" in gone["reason"] and "61 s" in gone["reason"]
    r = explain(*args, "--now", "2020-01-01T20:00:59")  # within the 60 s (a time without an offset is UTC)
    assert r.exit_code == 0 and "decision: gone" in r.output
    r = explain(*args, "--now", "2020-01-01T21:00:30+01:00")  # 20:00:30 UTC
    assert "decision: gone" in r.output
    r = explain(*args)  # judged now: years after the request
    assert "has not answered the handshake" in r.output and "decision: gone" not in r.output
    r = explain(*args, "--now", "tomorrow")
    assert r.exit_code == 2
    assert "--now tomorrow: not an RFC 3339 time; write one such as 2026-11-26T20:00:00Z" in r.output


def test_yaml_pod_and_policy_options(tmp_path):
    nodes = nodelist(node("n1", [gpu("GPU-1")]), node("n2", [gpu("GPU-2")]))
    pods = podlist(pod("old", node_name="n1", allocated="GPU-1,NVIDIA,1000,10:;"))
    yaml_pod = ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: m\n"
                "    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 100}}\n")
    args = files(tmp_path, nodes, pods, None, yaml_pod)
    assert json.loads(explain(*args, "--json").stdout)["node"] == "n1"
    assert json.loads(explain(*args, "--json", "--node-policy", "spread").stdout)["node"] == "n2"


@pytest.mark.parametrize("pod_text, words", [
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: m\n"
     "    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: abc}}\n", 'nvidia.com/gpumem: pod default/p, '
                                                                           'container "m": "abc" is not a whole'),
    ("metadata: {name: p, annotations: {hami.io/gpu-scheduler-policy: best}}\nspec: {containers: [{name: m}]}\n",
     "hami.io/gpu-scheduler-policy"),
    ("a: [1, 2\n", "neither JSON nor YAML (line"),
    ("---\na: 1\n---\nb: 2\n", "holds 2 YAML documents"),
    ("[]", "pod: expected a Pod object"),
])
def test_bad_pod_exits_2_naming_the_field(tmp_path, pod_text, words):
    r = explain(*files(tmp_path, nodelist(node("n1", [gpu("GPU-a")])), podlist(), None, pod_text))
    assert r.exit_code == 2
    assert r.output.startswith("pyvgpu: --pod ") and words in r.output


@pytest.mark.parametrize("nodes, pods, words", [
    ({"kind": "Something"}, podlist(), "--nodes "),
    (nodelist({"metadata": {}}), podlist(), "NodeList items[0].metadata.name: a Node without a name"),
    (nodelist(node("n1", [gpu("GPU-a")])), {"items": ["x"]}, "--pods "),
])
def test_bad_lists_exit_2_naming_the_file(tmp_path, nodes, pods, words):
    r = explain(*files(tmp_path, nodes, pods, pod()))
    assert r.exit_code == 2 and words in r.output


def test_lenient_reading_is_a_warning_not_an_exit(tmp_path):
    # HAMi reads numa-bind "sure" as false and schedules: explain does the same and says so
    pod_text = ("metadata: {name: p, annotations: {nvidia.com/numa-bind: sure}}\nspec:\n  containers:\n"
                "  - name: m\n    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpucores: 120}}\n")
    r = explain(*files(tmp_path, nodelist(node("n1", [gpu("GPU-a")])), podlist(), None, pod_text))
    assert r.exit_code == 0, r.output
    assert "warning: pod default/p: nvidia.com/numa-bind 'sure' is not a boolean; read as false" in r.output
    assert "nvidia.com/gpucores 120 is above 100; read as 100" in r.output
    assert "decision: n1" in r.output


def test_missing_file_and_bad_option(tmp_path):
    r = explain("--nodes", str(tmp_path / "none.json"), "--pods", str(tmp_path / "x"), "--pod", str(tmp_path / "y"))
    assert r.exit_code == 2 and "none.json: cannot read it: No such file" in r.output
    args = files(tmp_path, nodelist(), podlist(), pod())
    r = explain(*args, "--gpu-policy", "best")
    assert r.exit_code == 2 and "--gpu-policy 'best': use spread" in r.output  # one message, every command


def test_a_broken_node_does_not_hide_the_others(tmp_path):
    nodes = nodelist(node("bad", "[{"), node("good", [gpu("GPU-a")]))
    out = json.loads(explain(*files(tmp_path, nodes, podlist(), pod()), "--json").stdout)
    assert out["node"] == "good" and out["nodes"][1]["name"] == "bad" and "not valid JSON" in out["nodes"][1]["reason"]


def test_installed_command(tmp_path):
    exe = shutil.which("pyvgpu", path=str(Path(sys.executable).parent)) or shutil.which("pyvgpu")
    assert exe, "pyvgpu is not installed next to this Python"
    args = files(tmp_path, nodelist(node("n1", [gpu("GPU-a")])), podlist(), pod(containers=[ctr(mem="x")]))
    p = subprocess.run([exe, "cluster", "explain", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "nvidia.com/gpumem" in p.stderr and p.stdout == ""
    args = files(tmp_path, nodelist(node("n1", [gpu("GPU-a")])), podlist(), pod())
    p = subprocess.run([exe, "cluster", "explain", "--json", *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and json.loads(p.stdout)["node"] == "n1"


def test_bench_schedule_small_run(tmp_path):
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["bench", "schedule", "--sizes", "4,8", "--repeats", "1", "--arrivals", "60",
                                 "--pack-nodes", "2", "--json", "--output", str(out)])
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result == json.loads(out.read_text())
    assert [d["nodes"] for d in result["decisions"]] == [4, 8]
    assert {p["policy"] for p in result["packing"]} == {"binpack", "spread"}
    table = CliRunner().invoke(app, ["bench", "schedule", "--sizes", "4", "--repeats", "1", "--arrivals", "0"])
    assert table.exit_code == 0 and "one decision (median ms)" in table.output
    bad = CliRunner().invoke(app, ["bench", "schedule", "--sizes", "x"])
    assert bad.exit_code == 2 and "--sizes" in bad.output


def test_explain_counts_namespace_quotas(tmp_path):
    args = files(tmp_path, nodelist(node("n1", [gpu("GPU-a")])), podlist(), pod(containers=[ctr(mem=2000)]))
    (tmp_path / "quotas.json").write_text(json.dumps({"kind": "ResourceQuotaList", "items": [
        {"kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "default"},
         "spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}}}]}))
    r = explain(*args, "--quotas", str(tmp_path / "quotas.json"))
    assert r.exit_code == 0 and "no node fits" in r.output and "ResourceQuota allows 1000 MiB" in r.output
    assert "decision: n1" in explain(*args).output
    (tmp_path / "quotas.json").write_text('{"items": ["x"]}')
    r = explain(*args, "--quotas", str(tmp_path / "quotas.json"))
    assert r.exit_code == 2 and "--quotas" in r.output


def test_gpu_policy_option_takes_hamis_comma_lists(tmp_path):
    args = files(tmp_path, nodelist(node("n1", [gpu("GPU-a"), gpu("GPU-b", 1)])), podlist(),
                 pod(containers=[ctr(mem=1)]))
    r = explain(*args, "--json", "--gpu-policy", "binpack,mutex")
    assert r.exit_code == 0, r.output
    assert explain(*args, "--gpu-policy", "binpack,bestfit").exit_code == 2


def test_bench_schedule_decisions_see_the_pods_already_placed():
    """The bench's placed pods are the scheduler's own (its schedulerName), so the usage it decides on is theirs:
    a pod of no schedulerName would not count, and every decision would be on empty nodes."""
    import random

    from pyvgpu.bench import schedule as bench
    from pyvgpu.cluster.core.config import ClusterConfig
    from pyvgpu.cluster.core.usage import node_infos

    nodes, pods = bench.make_cluster(3, random.Random(1))
    assert pods and all(p["spec"]["schedulerName"] in ClusterConfig().scheduler_names for p in pods)
    infos = node_infos(nodes, pods, ClusterConfig())
    used = {n.name: sum(d.usedmem for d in n.devices) for n in infos}
    placed: dict[str, int] = {}
    for p in pods:
        mem = int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"])
        nums = int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        placed[p["spec"]["nodeName"]] = placed.get(p["spec"]["nodeName"], 0) + mem * nums
    assert used == {n["metadata"]["name"]: placed.get(n["metadata"]["name"], 0) for n in nodes}
    assert any(used.values())


def _capture(monkeypatch, module, attr: str) -> list:
    """Replace module.attr (what a daemon command runs) with one that records its arguments."""
    calls: list = []
    monkeypatch.setattr(module, attr, lambda *a, **kw: calls.append((a, kw)))
    return calls


def test_scheduler_leader_lease_reaches_the_extender(monkeypatch):
    from pyvgpu.cluster.scheduler import extender_server

    calls = _capture(monkeypatch, extender_server, "run")
    r = CliRunner().invoke(app, ["cluster", "scheduler", "--port", "8080",
                                 "--leader-lease", "gpu-system/kube-scheduler"])
    assert r.exit_code == 0, r.output
    assert calls[-1][1]["leader_lease"] == ("gpu-system", "kube-scheduler")
    r = CliRunner().invoke(app, ["cluster", "scheduler", "--port", "8080"])
    assert r.exit_code == 0, r.output
    assert calls[-1][1]["leader_lease"] is None


@pytest.mark.parametrize("value", ["kube-scheduler", "a/b/c", "/kube-scheduler", "gpu-system/", "/",
                                   "GPU-System/kube-scheduler", "gpu-system/kube scheduler", "-ns/kube-scheduler"])
def test_scheduler_refuses_a_leader_lease_that_is_not_namespace_slash_name(monkeypatch, value):
    from pyvgpu.cluster.scheduler import extender_server

    calls = _capture(monkeypatch, extender_server, "run")
    r = CliRunner().invoke(app, ["cluster", "scheduler", "--port", "8080", "--leader-lease", value])
    assert r.exit_code == 2 and not calls
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--leader-lease" in lines[0] and "NAMESPACE/NAME" in lines[0]


@pytest.mark.parametrize("command, runs", [("device-plugin", "device_plugin"), ("node-agent", "node_agent")])
def test_node_config_option_sets_the_node_options(monkeypatch, tmp_path, command, runs):
    from pyvgpu.cluster import extras
    from pyvgpu.cluster.node import daemon, nodeconfig

    monkeypatch.setattr(extras, "require", lambda *a, **kw: None)
    calls = _capture(monkeypatch, daemon, runs)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"nodeconfig": [{"name": "n1", "devicesplitcount": 4}]}))
    r = CliRunner().invoke(app, ["cluster", command, "--node-name", "n1", "--node-config", str(cfg)])
    assert r.exit_code == 0, r.output
    (opts,), _ = calls[-1]
    assert opts.node_config == cfg
    assert daemon.with_node_config(opts)[0].split == 4  # the file given is the one read
    # without the option: where HAMi's device plugin reads it and the chart mounts it (no file: nothing changes)
    r = CliRunner().invoke(app, ["cluster", command, "--node-name", "n1"])
    assert r.exit_code == 0, r.output
    assert calls[-1][0][0].node_config == nodeconfig.DEFAULT_PATH
    # a path given on purpose that is not there is refused, not read as "no settings"
    r = CliRunner().invoke(app, ["cluster", command, "--node-name", "n1", "--node-config", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "--node-config" in r.output and "no such file" in r.output
    assert len(calls) == 2
