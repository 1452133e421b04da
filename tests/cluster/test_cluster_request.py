"""Reading a pod's request: resources, HAMi's defaults, annotations, and input errors that name the field."""

from __future__ import annotations

import pytest
from cluster_helpers import ctr, pod

from pyvgpu.cluster.core.config import ClusterConfig, ResourceNames
from pyvgpu.cluster.core.errors import ClusterInputError
from pyvgpu.cluster.core.model import ContainerRequest
from pyvgpu.cluster.core.request import parse_quantity, pod_request


def one(c: dict, cfg: ClusterConfig | None = None) -> ContainerRequest:
    return pod_request(pod(containers=[c]), cfg).containers[0]


def test_limits_are_read():
    assert one(ctr(gpus=2, mem=8192, cores=30)) == ContainerRequest("main", 2, 8192, 100, 30)


def test_requests_are_the_fallback():
    c = ctr(gpus=1, mem=4096, cores=20, requests=True)
    assert one(c) == ContainerRequest("main", 1, 4096, 100, 20)
    c["resources"]["limits"] = {"nvidia.com/gpumem": "2048"}  # a limit wins over a request, per resource
    assert one(c) == ContainerRequest("main", 1, 2048, 100, 20)


def test_hami_defaults():
    c = one(ctr(gpus=1))
    # no memory: 100% of the GPU; no cores then: 100, the GPU alone (HAMi v2.10 defaultExclusiveCoreIfNeeded)
    assert (c.memreq, c.mem_percentage, c.coresreq) == (0, 100, 100)
    assert one(ctr(gpus=1, mem=1000)).coresreq == 0  # memory asked: the default, 0 cores
    assert c.memory_on(81920) == 81920
    p = one(ctr(gpus=1, pct=25))
    assert p.memory_on(81920) == 20480 and p.memory_on(15360) == 3840
    assert one(ctr(gpus=1, mem=1000, pct=25)).memory_on(81920) == 1000  # MiB asked win over a percentage
    assert one(ctr(gpus=1, pct=0)).mem_percentage == 100  # 0% means "not asked", as in HAMi


def test_configured_defaults():
    cfg = ClusterConfig(default_memory=2048, default_cores=10, memory_factor=2)
    c = one(ctr(gpus=1), cfg)
    assert (c.memreq, c.coresreq) == (2048, 100)  # no memory named: exclusive, whatever defaultMemory says
    assert one(ctr(gpus=1, mem=100), cfg).coresreq == 10
    c = one(ctr(gpus=1), ClusterConfig(default_memory=2048, default_cores=10, exclusive_core_default=False))
    assert (c.memreq, c.coresreq) == (2048, 10)
    assert one(ctr(gpus=1, mem=100), cfg).memreq == 200


def test_memory_or_cores_without_count_get_the_default_count():
    assert one(ctr(gpus=None, mem=1024)).nums == 1
    assert one(ctr(gpus=None, mem=1024), ClusterConfig(default_gpu_num=0)).nums == 0
    assert one({"name": "cpu"}).nums == 0
    assert one(ctr(gpus=0, mem=10)).nums == 0


def test_resource_names_are_configurable():
    names = ResourceNames(count="example.com/vgpu", memory="example.com/vmem", memory_percentage="x/p",
                          cores="example.com/vcores")
    c = {"name": "main", "resources": {"limits": {"example.com/vgpu": "1", "example.com/vmem": "512",
                                                  "example.com/vcores": "5"}}}
    assert one(c, ClusterConfig(resources=names)) == ContainerRequest("main", 1, 512, 100, 5)
    assert one(c).nums == 0


@pytest.mark.parametrize("value, expect", [("8192", 8192), (8192, 8192), ("8k", 8000), ("1Ki", 1024),
                                           ("2e3", 2000), ("1.0", 1), ("+3", 3)])
def test_quantities(value, expect):
    assert parse_quantity(value, "f", "ctx", "1") == expect


@pytest.mark.parametrize("c, field, words", [
    (ctr(gpus=1, mem="abc"), "nvidia.com/gpumem", '"abc" is not a whole number'),
    (ctr(gpus=1, mem="1.5"), "nvidia.com/gpumem", "not a whole number"),
    (ctr(gpus=1, mem="-1"), "nvidia.com/gpumem", "out of range"),
    (ctr(gpus="two"), "nvidia.com/gpu", '"two"'),
    (ctr(gpus="-1"), "nvidia.com/gpu", "out of range"),
    (ctr(gpus=1, pct=150), "nvidia.com/gpumem-percentage", "out of range"),
    (ctr(gpus=1, cores=-5), "nvidia.com/gpucores", "out of range"),
    (ctr(gpus=1, cores="30%"), "nvidia.com/gpucores", "not a whole number"),
    ({"name": "m", "resources": {"limits": {"nvidia.com/gpu": True}}}, "nvidia.com/gpu", "true"),
    ({"name": "m", "resources": {"limits": ["nvidia.com/gpu"]}}, "resources.limits", "map"),
])
def test_bad_resources_name_the_field(c, field, words):
    with pytest.raises(ClusterInputError) as e:
        one(c)
    assert e.value.field == field and words in str(e.value)
    assert 'container "' in str(e.value) and "pod default/new" in str(e.value)


def test_annotations():
    r = pod_request(pod(annotations={
        "hami.io/node-scheduler-policy": "spread", "hami.io/gpu-scheduler-policy": "binpack, topology-aware",
        "nvidia.com/use-gputype": "A100, H100", "nvidia.com/nouse-gputype": "T4",
        "nvidia.com/use-gpuuuid": "GPU-a,GPU-b", "nvidia.com/nouse-gpuuuid": "GPU-c",
        "nvidia.com/vgpu-mode": "hami-core,mps", "nvidia.com/numa-bind": "true"}))
    assert (r.node_policy, r.gpu_policy, r.topology) == ("spread", "binpack", True)
    assert r.use_types == ("A100", "H100") and r.nouse_types == ("T4",)
    assert r.use_uuids == ("GPU-a", "GPU-b") and r.nouse_uuids == ("GPU-c",)
    assert r.modes == ("hami-core", "mps") and r.numa_bind


def test_policy_defaults_and_config():
    r = pod_request(pod())
    assert (r.node_policy, r.gpu_policy, r.topology, r.numa_bind, r.modes) == ("binpack", "spread", False, False, ())
    r = pod_request(pod(), ClusterConfig(node_policy="spread", gpu_policy="topology-aware"))
    assert (r.node_policy, r.gpu_policy, r.topology) == ("spread", "spread", True)
    r = pod_request(pod(annotations={"hami.io/gpu-scheduler-policy": "topology-aware"}))
    assert (r.gpu_policy, r.topology) == ("spread", True)


@pytest.mark.parametrize("key, value", [
    ("hami.io/node-scheduler-policy", "pack"),
    ("hami.io/gpu-scheduler-policy", "best"),
    ("hami.io/gpu-scheduler-policy", "binpack,best"),
    ("nvidia.com/vgpu-mode", "vgpu"),
    ("hami.io/device-scoring-weights", "slot=1"),
])
def test_bad_annotations_name_the_key(key, value):
    with pytest.raises(ClusterInputError) as e:
        pod_request(pod(annotations={key: value}))
    assert e.value.field == key and str(e.value).startswith(f"{key}: pod default/new: ")


def test_init_containers_come_first():
    r = pod_request(pod(containers=[ctr("app", gpus=1)], init=[ctr("setup", gpus=1, mem=100)]))
    assert [(c.name, c.init) for c in r.containers] == [("setup", True), ("app", False)]


@pytest.mark.parametrize("bad, field", [
    ([], "pod"),
    ({"metadata": {}, "spec": {"containers": [{}]}}, "metadata.name"),
    ({"metadata": {"name": "p"}, "spec": {}}, "spec.containers"),
    ({"metadata": {"name": "p"}, "spec": {"containers": "x"}}, "spec.containers"),
    ({"metadata": {"name": "p", "annotations": ["x"]}, "spec": {"containers": [{}]}}, "metadata.annotations"),
])
def test_bad_pod_shapes(bad, field):
    with pytest.raises(ClusterInputError) as e:
        pod_request(bad)
    assert e.value.field == field
