"""Bounded work per request (issue 29, item 3): the topology search, the registration size, and what the
scheduler's HTTP listener accepts (docs/security.md, the cluster table)."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import textwrap
import threading
import time
from itertools import combinations

import pytest
from cluster_helpers import ctr, gpu, node, nodelist, pod, podlist
from test_cluster_extender import Ext, registered

from pyvgpu.cluster.core import policy
from pyvgpu.cluster.core.usage import node_infos

# --- the topology search -----------------------------------------------------------------------------------


def _old_sets(ids, n, scores):
    """The search as it was before issue 29 (every set, sorted): the reference for <= 16 GPUs."""
    combos = list(combinations(range(len(ids)), n))
    total = [sum(policy.pair(scores, ids[a], ids[b]) for a, b in combinations(c, 2)) for c in combos]
    return [combos[k] for k in sorted(range(len(combos)), key=lambda k: -total[k])]


def test_up_to_16_gpus_the_topology_search_answers_as_before():
    rnd = random.Random(29)
    for _ in range(40):
        m = rnd.randint(2, 16)
        n = rnd.randint(2, m)
        ids = [f"GPU-{i}" for i in range(m)]
        scores = {a: {b: rnd.choice((0, 10, 20, 100, 200)) for b in ids if b != a} for a in ids}
        assert list(policy.linked_sets(ids, n, scores)) == _old_sets(ids, n, scores), (m, n)


def test_a_64_gpu_node_and_an_8_gpu_topology_pod_are_decided_in_bounded_memory():
    """Before: C(64, 8) = 4.4e9 combinations built in a list (24 GB, then the OOM killer). The decision runs
    in a child capped at 1 GiB of address space: the old code dies of MemoryError there."""
    code = textwrap.dedent("""
        import resource, sys
        sys.path[:0] = [%r]
        from cluster_helpers import ctr, gpu, node, nodelist, pod, podlist
        from pyvgpu.cluster.core.config import ClusterConfig
        from pyvgpu.cluster.core.decide import decide
        from pyvgpu.cluster.core import keys
        ids = [f"GPU-{i:02d}" for i in range(64)]
        scores = {a: {b: (100 if int(a[4:]) // 8 == int(b[4:]) // 8 else 10) for b in ids if b != a} for a in ids}
        nodes = nodelist(node("big", [gpu(u, i, numa=0) for i, u in enumerate(ids)], scores=scores))
        p = pod("p", containers=[ctr(gpus=8)], annotations={keys.GPU_POLICY: keys.TOPOLOGY})
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        d = decide(nodes, podlist(), p, ClusterConfig())
        got = sorted(int(x.split(",")[0][4:]) for x in d.annotations[keys.POD_TO_ALLOCATE].split(":") if x.strip(";"))
        print(got)
    """) % str(__import__("pathlib").Path(__file__).parent)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got) == 8 and len({g // 8 for g in got}) == 1  # one fully linked block of 8


def test_a_registration_of_too_many_gpus_is_refused_with_the_reason():
    many = node("huge", [gpu(f"GPU-{i}", i) for i in range(200)])
    (info,) = node_infos(nodelist(many), podlist())
    assert "200 GPUs" in (info.error or "") and "128" in info.error


# --- the HTTP listener -------------------------------------------------------------------------------------


@pytest.fixture
def ext(kube, api):
    api.put_node(registered("node-a", ["GPU-a0"]))
    e = Ext(kube)
    e.synced(api)
    yield e
    e.close()


def _raw(ext, head: bytes, body: bytes = b"", shut: bool = True, timeout: float = 15) -> bytes:
    s = socket.create_connection(("127.0.0.1", ext.srv.port), timeout=timeout)
    try:
        s.sendall(head + body)
        if shut:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
    finally:
        s.close()


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1."), f"the connection was dropped without an answer: {answer[:200]!r}"
    return int(answer.split(b" ", 2)[1])


FILTER = json.dumps({"Pod": pod("p", containers=[ctr()]), "NodeNames": ["node-a"]}).encode()


def test_a_body_over_the_limit_is_413_before_it_is_read(ext):
    """Before: up to 256 MiB were read and parsed (a 46 MB body: 6.2 s and 960 MB)."""
    head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (5 << 20)
    assert _status(_raw(ext, head)) == 413


@pytest.mark.parametrize("length", [b"-1", b"abc", b"1e3"])
def test_a_negative_or_non_numeric_length_is_400(ext, length):
    """Before: -1 read the body to EOF (past the limit) and answered 200; 'abc' dropped the connection."""
    head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n"
    answer = _raw(ext, head, FILTER)
    assert _status(answer) == 400 and b"Content-Length" in answer


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000,
                                  b'{"Pod": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b"}"])
def test_deep_nesting_is_400_with_the_reason(ext, body):
    head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    answer = _raw(ext, head, body)
    assert _status(answer) == 400 and b"nest" in answer


@pytest.mark.parametrize("containers", [["x"], [1, 2], "abc", [{"resources": "x"}], [{"resources": {"limits": 3}}]])
def test_a_review_whose_containers_are_not_objects_is_400(ext, containers):
    """Before: AttributeError, and the connection dropped."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u", "operation": "CREATE",
                          "object": {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": containers}}}}
    body = json.dumps(review).encode()
    head = b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    answer = _raw(ext, head, body)
    assert _status(answer) == 400 and b"containers" in answer


def test_an_idle_connection_is_closed_after_the_socket_timeout(ext):
    ext.srv.httpd.timeout_s = 0.5
    s = socket.create_connection(("127.0.0.1", ext.srv.port), timeout=5)
    try:
        s.sendall(b"POST /filter HTTP/1.1\r\n")  # and then nothing
        assert s.recv(100) == b""  # the server hung up; before, this waited (and the client timed out)
    finally:
        s.close()


def test_connections_beyond_the_cap_are_closed_not_queued_as_threads(ext):
    srv = ext.srv.httpd
    srv.open_connections = threading.BoundedSemaphore(2)
    idle = [socket.create_connection(("127.0.0.1", ext.srv.port), timeout=10) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        while srv.open_connections._value and time.monotonic() < deadline:  # both accepted, holding threads
            time.sleep(0.05)
        third = socket.create_connection(("127.0.0.1", ext.srv.port), timeout=10)
        assert third.recv(10) == b""  # closed unanswered
        third.close()
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the idle ones' threads end, their places free again
        try:
            if _raw(ext, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200"):
                break
        except OSError:  # still at the cap: closed before our request was written (a loaded machine)
            pass
        time.sleep(0.1)
    else:
        raise AssertionError("the server did not take connections again")
