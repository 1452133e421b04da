"""Binds that do not land on a pod changed under them (issue 30, item 14): the annotation patch is
conditional on the version the bind decided on, also when the pod was read fresh, and the Binding on the
version that patch made (kube-apiserver refuses a Binding whose metadata.resourceVersion or uid is not the
pod's with 409). Another writer is put between the bind's calls by a hook of the test API server."""

from __future__ import annotations

from fake_apiserver import gpu_container, pod
from test_cluster_bindpath import _ready
from test_cluster_extender import bind_args, filter_args

from pyvgpu.cluster.api import events
from pyvgpu.cluster.core import keys

POD = "/api/v1/namespaces/default/pods/p"
THEIRS = {keys.POD_NODE: "node-0", keys.POD_TO_ALLOCATE: "GPU-a1,NVIDIA,8192,100:;",
          keys.POD_ALLOCATED: "GPU-a1,NVIDIA,8192,100:;", keys.POD_BIND_TIME: "1", keys.POD_BIND_PHASE: "allocating"}


def _before_first(api, method: str, path: str, change) -> list:
    """Change pod p at the API server just before the first `method` on `path` is served; the returned list
    counts the requests of that kind."""
    seen: list = []

    def hook(m, p_):
        if m == method and p_ == path:
            seen.append(1)
            if len(seen) == 1:
                with api.cond:
                    obj = api.pods[("default", "p")]
                    change(obj)
                    api._bump("pod", "MODIFIED", obj)
        return None

    api.hooks.append(hook)
    return seen


def _labelled(obj):  # a user's edit
    obj["metadata"]["annotations"]["team.example/owner"] = "x"


def _another_schedulers(obj):  # another replica chose other GPUs for the pod
    obj["metadata"]["annotations"].update(THEIRS)


def _fresh_only(e, monkeypatch):
    """The bind reads the pod fresh (the cache has not seen it yet)."""
    monkeypatch.setattr(e.s, "_cached_pod", lambda ns, name, uid: None)


def _not_bound(api, e):
    got = api.get_pod("default", "p")
    assert not got["spec"].get("nodeName") and api.bindings == []
    assert keys.NODE_LOCK not in api.get_node("node-0")["metadata"]["annotations"]
    assert e.s.inflight.promise(("default", "p")) is None  # its promise ended with the failed bind
    assert e.s.metrics.bind_total.labels("conflict")._value.get() == 1
    api.wait_for(lambda: any(ev.get("reason") == events.BINDING_FAILED for ev in api.k8s_events),
                 what="the BindingFailed event")
    return got["metadata"]["annotations"]


def test_a_pod_edited_between_its_annotation_write_and_its_binding_is_not_bound(kube, api, monkeypatch):
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 8192, 100)]))
    try:
        _fresh_only(e, monkeypatch)
        assert e.post("filter", filter_args(p, ["node-0"]))["NodeNames"] == ["node-0"]
        assert e.s.inflight.promise(("default", "p")) is not None
        posts = _before_first(api, "POST", POD + "/binding", _labelled)
        out = e.post("bind", bind_args(p, "node-0"))
        assert "pod default/p changed while it was being bound" in out["Error"] and "HTTP 409" in out["Error"]
        assert "ResourceVersion in precondition" in out["Error"] and len(posts) == 1
        annos = _not_bound(api, e)
        # the edit stays; the annotations this bind wrote were taken back, so no GPU counts them
        assert annos["team.example/owner"] == "x" and annos[keys.POD_BIND_PHASE] == keys.BIND_FAILED
        assert keys.POD_TO_ALLOCATE not in annos and keys.POD_NODE not in annos
        e.synced(api)
        both = api.put_pod(pod("both", [gpu_container("main", 2, 8192, 100)]))
        assert e.post("filter", filter_args(both, ["node-0"]))["NodeNames"] == ["node-0"]
    finally:
        e.close()


def test_another_schedulers_annotations_written_before_the_binding_are_left_as_they_are(kube, api, monkeypatch):
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        _fresh_only(e, monkeypatch)
        _before_first(api, "POST", POD + "/binding", _another_schedulers)
        out = e.post("bind", bind_args(p, "node-0"))
        assert "changed while it was being bound" in out["Error"]
        annos = _not_bound(api, e)
        assert {k: annos.get(k) for k in THEIRS} == THEIRS  # not ours to take back
    finally:
        e.close()


def test_a_cached_pod_edited_before_its_binding_is_bound_again_on_a_fresh_read(kube, api):
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        posts = _before_first(api, "POST", POD + "/binding", _labelled)
        assert e.post("bind", bind_args(p, "node-0")) == {"Error": ""}
        assert len(posts) == 2  # the first Binding was refused; the second, on the version written then, landed
        got = api.get_pod("default", "p")
        annos = got["metadata"]["annotations"]
        assert got["spec"]["nodeName"] == "node-0" and api.bindings == [("default", "p", "node-0")]
        assert annos["team.example/owner"] == "x" and annos[keys.POD_BIND_PHASE] == keys.BIND_ALLOCATING
        assert annos[keys.POD_TO_ALLOCATE].startswith("GPU-a") and annos[keys.POD_NODE] == "node-0"
        assert keys.NODE_LOCK not in api.get_node("node-0")["metadata"]["annotations"]
    finally:
        e.close()


def test_the_annotation_patch_of_a_pod_read_fresh_is_conditional_on_the_version_read(kube, api, monkeypatch):
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        _fresh_only(e, monkeypatch)
        read = api.get_pod("default", "p")["metadata"]["resourceVersion"]
        patches = _before_first(api, "PATCH", POD, _labelled)
        out = e.post("bind", bind_args(p, "node-0"))
        assert "changed while it was being bound" in out["Error"]
        assert f"the patch conditional on resourceVersion {read} got 409" in out["Error"]
        assert len(patches) == 1  # refused, so nothing to take back
        annos = _not_bound(api, e)
        assert annos["team.example/owner"] == "x" and keys.POD_TO_ALLOCATE not in annos
        assert not [pt for path, pt in api.patches if path == POD]
    finally:
        e.close()


def test_no_binding_without_the_version_the_annotation_write_made(kube, api):
    # an answer to the patch that names no resourceVersion: the Binding could not be conditional, so none
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        api.hooks.append(lambda m, p_: (200, {"kind": "Pod", "metadata": {"name": "p"}})
                         if m == "PATCH" and p_ == POD else None)
        out = e.post("bind", bind_args(p, "node-0"))
        assert "no metadata.resourceVersion to make the Binding conditional on" in out["Error"]
        assert not [r for r in api.requests if r == ("POST", POD + "/binding")]
        assert not api.get_pod("default", "p")["spec"].get("nodeName")
        assert e.s.inflight.promise(("default", "p")) is None
    finally:
        e.close()


def _between_undo_read_and_patch(api, times: int) -> list:
    """After the bind's Binding, change pod p just before each of the first `times` patches of it (the
    undo's, conditional on the version its read returned) is served; the returned list counts those patches."""
    state = {"binding": False}
    patches: list = []

    def hook(m, p_):
        if m == "POST" and p_ == POD + "/binding":
            state["binding"] = True
        elif m == "PATCH" and p_ == POD and state["binding"]:
            patches.append(1)
            if len(patches) <= times:
                with api.cond:
                    obj = api.pods[("default", "p")]
                    obj["metadata"].setdefault("labels", {})["touched"] = str(len(patches))
                    api._bump("pod", "MODIFIED", obj)
        return None

    api.hooks.append(hook)
    return patches


def test_an_undo_refused_by_an_unrelated_write_reads_the_pod_again_and_takes_back(kube, api, monkeypatch):
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        _fresh_only(e, monkeypatch)
        _before_first(api, "POST", POD + "/binding", _labelled)  # the Binding is refused
        undo = _between_undo_read_and_patch(api, times=1)
        out = e.post("bind", bind_args(p, "node-0"))
        assert "changed while it was being bound" in out["Error"]
        annos = _not_bound(api, e)
        assert len(undo) == 2  # the first undo patch got 409; the second, on a fresh read, landed
        assert annos[keys.POD_BIND_PHASE] == keys.BIND_FAILED
        assert keys.POD_NODE not in annos and keys.POD_TO_ALLOCATE not in annos
        assert api.get_pod("default", "p")["metadata"]["labels"]["touched"] == "1"
        assert e.s.metrics.undo_failed._value.get() == 0
    finally:
        e.close()


def test_an_undo_refused_twice_is_logged_and_counted(kube, api, monkeypatch, caplog):
    e, (p,) = _ready(kube, api, pod("p", [gpu_container("main", 1, 1000, 10)]))
    try:
        _fresh_only(e, monkeypatch)
        _before_first(api, "POST", POD + "/binding", _labelled)
        undo = _between_undo_read_and_patch(api, times=2)
        with caplog.at_level("WARNING", logger="pyvgpu.cluster.scheduler"):
            out = e.post("bind", bind_args(p, "node-0"))
        assert "changed while it was being bound" in out["Error"]
        annos = _not_bound(api, e)
        assert len(undo) == 2  # once again on a fresh read, no more
        assert annos[keys.POD_NODE] == "node-0" and annos[keys.POD_TO_ALLOCATE]  # left: counted, never under
        assert e.s.metrics.undo_failed._value.get() == 1
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert any("could not take back" in m and "pod default/p" in m and "409" in m for m in said), said
    finally:
        e.close()
