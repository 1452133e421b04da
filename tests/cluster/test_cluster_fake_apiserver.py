"""The test API server's preconditions, as kube-apiserver's: a Binding's metadata.uid and
metadata.resourceVersion, where given, must be the pod's (pkg/registry/core/pod/storage/storage.go,
BindingREST; checked before the pod's own "already assigned", which is a conflict on pods/binding), and a
merge patch carrying a non-empty metadata.resourceVersion applies only to that version (an empty one is
none). Each failure is 409 with a Status body. Spoken to in plain HTTP, so what is checked is the server,
not pyvgpu's client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from fake_apiserver import gpu_container, pod

POD = "/api/v1/namespaces/default/pods/p"


def _call(api, method: str, path: str, body: dict, ctype: str = "application/json") -> tuple[int, dict]:
    req = urllib.request.Request(api.url + path, data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _binding(uid: str | None = None, rv: str | None = None, node: str = "n1") -> dict:
    meta = {"name": "p", "namespace": "default"}
    if uid is not None:
        meta["uid"] = uid
    if rv is not None:
        meta["resourceVersion"] = rv
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta, "target": {"kind": "Node", "name": node}}


def _bind(api, **kw) -> tuple[int, dict]:
    return _call(api, "POST", POD + "/binding", _binding(**kw))


def _patch(api, meta: dict) -> tuple[int, dict]:
    return _call(api, "PATCH", POD, {"metadata": meta}, "application/merge-patch+json")


def _conflict(status: int, body: dict, *words: str, resource: str = "pods") -> None:
    assert status == 409, body
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == 409
    assert body["reason"] == "Conflict" and body["details"] == {"name": "p", "kind": resource}
    assert body["message"].startswith(f'Operation cannot be fulfilled on {resource} "p": ')
    for w in words:
        assert w in body["message"], body["message"]


def test_a_binding_at_another_resource_version_is_refused_and_changes_nothing(api):
    made = api.put_pod(pod("p", [gpu_container()]))
    uid, rv = made["metadata"]["uid"], made["metadata"]["resourceVersion"]
    api.put_pod(made | {"metadata": made["metadata"] | {"labels": {"edited": "yes"}}})  # a newer version
    status, body = _bind(api, uid=uid, rv=rv)
    _conflict(status, body, f"Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in "
                            f"object meta: {int(rv) + 1}")
    got = api.get_pod("default", "p")
    assert not got["spec"].get("nodeName") and got["metadata"]["resourceVersion"] == str(int(rv) + 1)
    assert api.bindings == []


def test_a_binding_of_another_uid_is_refused_the_uid_checked_first(api):
    made = api.put_pod(pod("p", [gpu_container()]))
    status, body = _bind(api, uid="not-the-uid", rv="1")  # both wrong: the UID is named
    _conflict(status, body, f"UID in precondition: not-the-uid, UID in object meta: {made['metadata']['uid']}")
    assert api.bindings == []


def test_a_binding_whose_preconditions_hold_binds_and_one_without_them_too(api):
    made = api.put_pod(pod("p", [gpu_container()]))
    status, body = _bind(api, uid=made["metadata"]["uid"], rv=made["metadata"]["resourceVersion"])
    assert status == 201 and body["status"] == "Success"
    got = api.get_pod("default", "p")
    assert got["spec"]["nodeName"] == "n1" and int(got["metadata"]["resourceVersion"]) > \
        int(made["metadata"]["resourceVersion"])
    api.put_pod(pod("p", [gpu_container()], uid=made["metadata"]["uid"]))  # unbound again, a new version
    assert _bind(api)[0] == 201  # no preconditions: none checked (kube-scheduler's own binder sends the UID only)


def test_a_binding_of_a_bound_pod_is_refused_at_its_current_version_too(api):
    made = api.put_pod(pod("p", [gpu_container()], node_name="n0"))
    status, body = _bind(api, uid=made["metadata"]["uid"], rv=made["metadata"]["resourceVersion"])
    # kube-apiserver's assignPod wraps this plain error as a conflict on the subresource, pods/binding
    _conflict(status, body, 'pod p is already assigned to node "n0"', resource="pods/binding")


def test_a_patch_carrying_a_resource_version_applies_only_to_that_version(api):
    made = api.put_pod(pod("p", [gpu_container()]))
    rv = made["metadata"]["resourceVersion"]
    api.put_pod(made | {"metadata": made["metadata"] | {"labels": {"edited": "yes"}}})
    status, body = _patch(api, {"resourceVersion": rv, "annotations": {"a": "b"}})
    _conflict(status, body, "the object has been modified")
    assert "a" not in api.get_pod("default", "p")["metadata"]["annotations"]
    now = api.get_pod("default", "p")["metadata"]["resourceVersion"]
    status, body = _patch(api, {"resourceVersion": now, "annotations": {"a": "b"}})
    assert status == 200 and body["metadata"]["annotations"]["a"] == "b"
    assert int(body["metadata"]["resourceVersion"]) > int(now)  # the server's version, not the patch's
    assert _patch(api, {"annotations": {"c": "d"}})[0] == 200  # without one: unconditional


def test_a_patch_with_an_empty_resource_version_is_unconditional(api):
    """kube-apiserver parses an empty resourceVersion as 0, which the generic store takes as no precondition
    for an object whose strategy allows unconditional updates (pods): only a non-empty, differing one is 409."""
    made = api.put_pod(pod("p", [gpu_container()]))
    api.put_pod(made | {"metadata": made["metadata"] | {"labels": {"edited": "yes"}}})  # a newer version
    status, body = _patch(api, {"resourceVersion": "", "annotations": {"a": "b"}})
    assert status == 200 and body["metadata"]["annotations"]["a"] == "b", body
    assert body["metadata"]["resourceVersion"] != ""  # the server's version, not the patch's empty one
