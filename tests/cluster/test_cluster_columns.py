"""A request shape judged on every node's GPUs in arrays (pyvgpu.cluster.core.columns; issue 30, item 15)
gives the verdicts and brief reasons of the Python path (place.count_fit, place.brief_reason), whatever
the nodes hold: over-committed GPUs, unhealthy, cordoned or inconsistent ones, odd core totals, nodes of
no GPU or more than a row holds, MIG GPUs and broken registrations (those two go the Python way)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.columns import Columns
from pyvgpu.cluster.core.decide import decide_on
from pyvgpu.cluster.core.model import ContainerDevice, ContainerRequest, DeviceUsage, NodeInfo, PodRequest
from pyvgpu.cluster.core.usage import add_pod


@st.composite
def devices(draw, node: int):
    out = []
    for i in range(draw(st.sampled_from((0, 1, 2, 4, 8, 8, 9)))):
        total = draw(st.sampled_from((0, 100, 100, 200)))
        tmem = draw(st.sampled_from((0, 1000, 4000, 80000)))
        d = DeviceUsage(f"GPU-{node}-{i}", i, draw(st.integers(0, 4)), tmem, total, "NVIDIA A100", i % 2,
                        keys.MIG if draw(st.integers(0, 30)) == 0 else keys.HAMI_CORE, draw(st.integers(0, 9)) > 0,
                        used=draw(st.integers(0, 5)), usedmem=draw(st.sampled_from((0, 500, 1000, 3999, 4000, 90000))),
                        usedcores=draw(st.sampled_from((0, 30, 99, 100, 150, 200))),
                        cordoned=draw(st.integers(0, 9)) == 0,
                        problem="pods over the registration" if draw(st.integers(0, 15)) == 0 else None)
        out.append(d)
    return out


@st.composite
def cases(draw):
    nodes = []
    for n in range(draw(st.integers(1, 12))):
        if draw(st.integers(0, 20)) == 0:
            nodes.append(NodeInfo(f"n{n}", error="the registration cannot be read"))
        else:
            nodes.append(NodeInfo(f"n{n}", draw(devices(n))))
    memreq = draw(st.sampled_from((0, 0, 500, 1000, 4000, 80000)))
    ctr = ContainerRequest("main", draw(st.integers(1, 4)), memreq,
                           0 if memreq else draw(st.sampled_from((0, 25, 50, 100))),
                           draw(st.sampled_from((0, 0, 30, 50, 100))))
    req = PodRequest("ns", "p", (ctr,), node_policy=draw(st.sampled_from((keys.BINPACK, keys.SPREAD))),
                     gpu_policy="mutex" if draw(st.booleans()) else keys.SPREAD)
    return nodes, req


def _copy(nodes: list[NodeInfo]) -> list[NodeInfo]:
    return [NodeInfo(n.name, [d.copy() for d in n.devices], error=n.error) for n in nodes]


def _verdicts(d):
    return [(v.name, v.fits, v.score, v.reason) for v in d.nodes], d.node


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_columns_give_the_python_paths_verdicts_and_reasons(case):
    nodes, req = case
    plain = decide_on(_copy(nodes), req, brief=True)
    cols = Columns()
    judged_nodes = _copy(nodes)
    judged = decide_on(judged_nodes, req, brief=True, columns=cols)
    assert _verdicts(judged) == _verdicts(plain)
    # remembered: asked again, the same answer from the memo
    assert _verdicts(decide_on(judged_nodes, req, brief=True, columns=cols)) == _verdicts(plain)


def test_a_node_whose_usage_changed_is_written_again():
    devs = [DeviceUsage(f"GPU-{i}", i, 10, 4000, 100, "NVIDIA A100", 0, keys.HAMI_CORE, True) for i in range(2)]
    n = NodeInfo("n1", devs)
    cols = Columns()
    req = PodRequest("ns", "p", (ContainerRequest("main", 2, 3000, 0, 0),))
    assert decide_on([n], req, brief=True, columns=cols).node == "n1"
    assert len(cols) == 1
    add_pod(n, ((ContainerDevice("GPU-0", "NVIDIA", 3000, 0),),), 0)  # drops the memo, so the row is stale
    other = PodRequest("ns", "q", (ContainerRequest("main", 2, 2000, 0, 0),))
    d = decide_on([n], other, brief=True, columns=cols)
    assert d.node is None and "1 of 2 GPU(s) can take" in d.nodes[0].reason and "memory (1)" in d.nodes[0].reason
