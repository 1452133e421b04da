"""Pod annotations only the scheduler writes (issue 29, item 2): the webhook refuses them from anyone else,
usage counts only pods pyvgpu's scheduler placed, and Allocate takes only such pods and skips a broken one
instead of failing the node (docs/security.md, the cluster table)."""

from __future__ import annotations

import pytest
from cluster_helpers import gpu, node, nodelist, pod, podlist
from fake_apiserver import pod as api_pod
from test_cluster_plugin import U0, U1, Node, binding_pod

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.core.usage import node_infos
from pyvgpu.cluster.scheduler import webhook

SCHED_SA = "system:serviceaccount:gpu-system:pyvgpu-scheduler"
NODE_SA = "system:serviceaccount:gpu-system:pyvgpu-node"
WRITERS = frozenset({SCHED_SA, NODE_SA})


def _review(op: str, user: str, obj: dict, old: dict | None = None, **kw) -> dict:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r1", "operation": op, "object": obj, "oldObject": old,
                        "userInfo": {"username": user}}}
    return webhook.review(body, ClusterConfig(), "pyvgpu-scheduler", **kw)["response"]


def _decoy(**annos) -> dict:
    return pod("decoy", containers=[], annotations=annos, scheduler="none")


# --- the webhook -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [keys.POD_NODE, keys.POD_ALLOCATED, keys.POD_TO_ALLOCATE, keys.POD_BIND_PHASE,
                                 keys.POD_BIND_TIME])
def test_a_pod_creator_cannot_create_a_pod_with_allocation_annotations(key):
    r = _review("CREATE", "alice", _decoy(**{key: "x"}))
    assert r["allowed"] is False and key in r["status"]["message"]


def test_a_pod_creator_cannot_change_them_on_update_but_may_change_other_things():
    old = pod("p", node_name="n1", allocated=f"{U0},NVIDIA,1024,0:;")
    new = pod("p", node_name="n1", allocated=f"{U1},NVIDIA,1024,0:;")
    r = _review("UPDATE", "alice", new, old, writers=WRITERS)
    assert r["allowed"] is False and keys.POD_ALLOCATED in r["status"]["message"]
    labelled = pod("p", node_name="n1", allocated=f"{U0},NVIDIA,1024,0:;")
    labelled["metadata"]["labels"] = {"team": "a"}
    assert _review("UPDATE", "alice", labelled, old, writers=WRITERS)["allowed"] is True
    # the scheduler's bind and the node agent's Allocate write them
    assert _review("UPDATE", SCHED_SA, new, old, writers=WRITERS)["allowed"] is True
    assert _review("UPDATE", NODE_SA, new, old, writers=WRITERS)["allowed"] is True


def test_the_user_policy_annotations_stay_open():
    r = _review("CREATE", "alice", pod("p", annotations={keys.GPU_POLICY: "binpack"}, containers=[]))
    assert r["allowed"] is True


def test_the_chart_routes_updates_to_the_webhook_and_names_the_writers():
    from test_cluster_chart import _cli_params, by_kind, container, one, render

    docs = render()
    hook = by_kind(docs, "MutatingWebhookConfiguration")[0]["webhooks"][0]
    assert set(hook["rules"][0]["operations"]) == {"CREATE", "UPDATE"}
    ext = container(one(docs, "Deployment", "scheduler"), "extender")
    writers = _cli_params(ext["args"])["annotation_writers"]
    sa = {d["metadata"]["name"] for d in by_kind(docs, "ServiceAccount")}
    assert len(writers) == 2 and {w.rsplit(":", 1)[1] for w in writers} == sa
    plugin = container(one(docs, "DaemonSet", "node"), "device-plugin")
    assert _cli_params(plugin["args"])["scheduler_names"] == ["pyvgpu-scheduler"]  # whose pods Allocate serves


# --- usage -----------------------------------------------------------------------------------------------


def test_a_pod_no_pyvgpu_scheduler_placed_does_not_poison_or_fill_a_node():
    """Before: a never-scheduled pod with `hami.io/vgpu-node: n1` and a garbage allocation made n1 refuse
    every GPU pod; with a valid one it filled n1's GPUs."""
    nodes = nodelist(node("n1", [gpu(U0)]))
    (n1,) = node_infos(nodes, podlist(_decoy(**{keys.POD_NODE: "n1", keys.POD_ALLOCATED: "garbage"})))
    assert n1.error is None
    full = pod("fill", node_name="n1", allocated=f"{U0},NVIDIA,81920,100:;", scheduler="default-scheduler")
    (n1,) = node_infos(nodes, podlist(full))
    assert (n1.devices[0].used, n1.devices[0].usedmem) == (0, 0)
    (n1,) = node_infos(nodes, podlist(pod("ours", node_name="n1", allocated=f"{U0},NVIDIA,1000,10:;")))
    assert (n1.devices[0].used, n1.devices[0].usedmem) == (1, 1000)


# --- Allocate --------------------------------------------------------------------------------------------


@pytest.fixture
def plugin_node(tmp_path, kube):
    n = Node(tmp_path, kube)
    yield n
    n.close()


def test_a_decoy_pod_cannot_hijack_allocate(plugin_node, api):
    """Before: a decoy bound by hand (spec.nodeName) with an init container that never ends and an older
    bind-time made the victim's container get the decoy's GPU, 64 MiB and 1%."""
    annos = {keys.POD_NODE: "node-a", keys.POD_BIND_PHASE: "allocating", keys.POD_BIND_TIME: "1",
             keys.POD_TO_ALLOCATE: f"{U1},NVIDIA,64,1:;"}
    api.put_pod(api_pod("decoy", [{"name": "c", "image": "x"}], namespace="evil", annotations=annos,
                        node_name="node-a", scheduler="default-scheduler"))
    api.put_pod(binding_pod("victim", to_allocate=f"{U0},NVIDIA,4096,30:;;"))
    (c,) = plugin_node.allocate([f"{U0}::0"]).container_responses
    env = dict(c.envs)
    assert env["CUDA_VISIBLE_DEVICES"] == U0 and env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"


def test_an_undecodable_candidate_is_skipped_and_marked_failed_not_the_whole_node(plugin_node, api):
    """Before: one pod with `vgpu-devices-to-allocate: 1,1` failed every Allocate on the node."""
    annos = {keys.POD_NODE: "node-a", keys.POD_BIND_PHASE: "allocating", keys.POD_BIND_TIME: "1",
             keys.POD_TO_ALLOCATE: "1,1"}
    api.put_pod(api_pod("broken", [{"name": "c", "image": "x"}], annotations=annos, node_name="node-a"))
    api.put_pod(binding_pod("victim", to_allocate=f"{U0},NVIDIA,4096,30:;;"))
    (c,) = plugin_node.allocate([f"{U0}::0"]).container_responses
    assert dict(c.envs)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert api.get_pod("default", "broken")["metadata"]["annotations"][keys.POD_BIND_PHASE] == keys.BIND_FAILED
    (ev,) = [e for e in api.k8s_events if e["involvedObject"]["name"] == "broken"]
    assert ev["reason"] == "AllocationUnreadable" and ev["type"] == "Warning" and "1,1" in ev["message"]
