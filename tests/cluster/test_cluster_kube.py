"""pyvgpu.cluster.api.kube sends its single-object calls on the official client's connection pool with the
client's credentials, without the generated methods' per-call work (issue 30, item 14: a bind makes six of
these calls): each carries the kubeconfig's bearer token, a patch is a JSON merge patch, a name stays one
path segment, and errors read as before. Against the test API server."""

from __future__ import annotations

import pytest
from fake_apiserver import gpu_container, node, pod

from pyvgpu.cluster.api.kube import KubeError, KubeUnreachable


def test_every_call_carries_the_token_and_patches_are_merge_patches(api, kube):
    api.put_node(node("n1"))
    api.put_pod(pod("p", [gpu_container()]))
    kube.get_node("n1")
    kube.list_nodes()
    kube.patch_node("n1", {"metadata": {"annotations": {"a": "b"}}})
    assert kube.list_pods(node="n1")["items"] == []
    assert [p["metadata"]["name"] for p in kube.list_pods()["items"]] == ["p"]
    kube.list_quotas()
    kube.get_pod("default", "p")
    got = kube.patch_pod("default", "p", {"metadata": {"annotations": {"x": "y"}}})
    assert got["metadata"]["annotations"]["x"] == "y"
    kube.bind("default", "p", api.get_pod("default", "p")["metadata"]["uid"], "n1")
    kube.create_event("default", {"metadata": {"name": "e"}, "reason": "R"})
    assert api.get_pod("default", "p")["spec"]["nodeName"] == "n1"
    assert api.get_node("n1")["metadata"]["annotations"]["a"] == "b"
    assert len(api.headers_seen) == 10
    assert {auth for _, _, auth, _ in api.headers_seen} == {"Bearer test-token"}
    kinds = {m: {ct for mm, _, _, ct in api.headers_seen if mm == m} for m in ("GET", "PATCH", "POST")}
    assert kinds == {"GET": {None}, "PATCH": {"application/merge-patch+json"}, "POST": {"application/json"}}
    assert ("GET", "/api/v1/pods") in api.requests


def test_a_name_is_one_path_segment(api, kube):
    with pytest.raises(KubeError) as e:
        kube.get_pod("default", "a/../../nodes/n1")
    assert e.value.not_found
    assert api.requests[-1] == ("GET", "/api/v1/namespaces/default/pods/a%2F..%2F..%2Fnodes%2Fn1")


def test_errors_name_the_call_and_the_status(api, kube):
    with pytest.raises(KubeError, match=r"get pod default/gone: HTTP 404") as e:
        kube.get_pod("default", "gone")
    assert e.value.not_found
    api.put_node(node("n1"))
    stale = api.get_node("n1")["metadata"]["resourceVersion"]
    api.put_node(node("n1", {"changed": "yes"}))
    with pytest.raises(KubeError) as e:
        kube.patch_node("n1", {"metadata": {"resourceVersion": stale, "annotations": {"a": "b"}}})
    assert e.value.conflict
    api.stop()
    with pytest.raises(KubeUnreachable, match="get node n1: cannot reach the API server"):
        kube.get_node("n1")


def test_a_server_url_with_a_path_prefixes_every_call(api, tmp_path):
    """The pool is taken once per server; the server URL's own path (a proxy in front of the API server)
    still prefixes each call's path, as when the pool manager was handed the whole URL."""
    import json

    from pyvgpu.cluster.api.kube import Kube

    api.hooks.append(lambda method, path: (200, {"kind": "Node", "metadata": {"name": "n1"}})
                     if path.startswith("/prefix/") else None)
    path = api.kubeconfig(tmp_path / "kubeconfig.json")
    cfg = json.loads(path.read_text())
    cfg["clusters"][0]["cluster"]["server"] = api.url + "/prefix"
    path.write_text(json.dumps(cfg))
    kube = Kube(str(path), timeout=5)
    assert kube.get_node("n1")["metadata"]["name"] == "n1"
    assert kube.list_pods(node="n1")["metadata"]["name"] == "n1"
    assert api.requests == [("GET", "/prefix/api/v1/nodes/n1"), ("GET", "/prefix/api/v1/pods")]
    assert {auth for _, _, auth, _ in api.headers_seen} == {"Bearer test-token"}


def test_a_closed_pool_is_taken_again(api, kube):
    api.put_node(node("n1"))
    kube.get_node("n1")
    kube.api.api_client.rest_client.pool_manager.clear()  # closes the pools it holds, ours among them
    assert kube.get_node("n1")["metadata"]["name"] == "n1"


def test_a_binding_carries_the_uid_and_resource_version_given_as_preconditions(api, kube):
    made = api.put_pod(pod("p", [gpu_container()]))
    uid, rv = made["metadata"]["uid"], made["metadata"]["resourceVersion"]
    api.put_pod(made | {"metadata": made["metadata"] | {"labels": {"edited": "yes"}}})
    with pytest.raises(KubeError, match="ResourceVersion in precondition") as e:
        kube.bind("default", "p", uid, "n1", resource_version=rv)
    assert e.value.conflict and api.bindings == []
    kube.bind("default", "p", uid, "n1", resource_version=api.get_pod("default", "p")["metadata"]["resourceVersion"])
    assert api.bindings == [("default", "p", "n1")]
