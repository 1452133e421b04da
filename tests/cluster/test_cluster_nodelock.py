"""The node lock's short paths (the bind path's API calls): a lock written on the cache's copy of the node
without reading it first, released on the copy acquire wrote; either falls back to a read when the node
changed in between. Against the test API server through the official client."""

from __future__ import annotations

import pytest
from fake_apiserver import node

from pyvgpu.cluster.api import kube as kube_mod
from pyvgpu.cluster.api.nodelock import LOCK_KEY, LockBusy, NodeLock, lock_value


def _calls(api, method: str) -> int:
    return sum(1 for m, p in api.requests if m == method and p.startswith("/api/v1/nodes/"))


def test_acquire_on_a_current_cached_node_writes_without_a_read(api, kube):
    cached = api.put_node(node("n1"))
    lock = NodeLock(kube)
    written = lock.acquire("n1", "ml", "train", cached=cached)
    assert written["metadata"]["annotations"][LOCK_KEY].endswith(",ml,train")
    assert _calls(api, "GET") == 0 and _calls(api, "PATCH") == 1
    lock.release("n1", "ml", "train", locked=written)
    assert LOCK_KEY not in (api.get_node("n1")["metadata"].get("annotations") or {})
    assert _calls(api, "GET") == 0 and _calls(api, "PATCH") == 2


def test_a_node_changed_since_the_cache_saw_it_is_read_and_decided_again(api, kube):
    """The cache's watch behind another writer: the conditional write is refused (409), and the node is read
    and decided as without a cached copy. Before, the bind failed (a flaky extender test showed it: a lock
    taken over on the API server that the watch had not delivered yet)."""
    stale = api.put_node(node("n1"))
    api.put_node(node("n1", {"other": "change"}))
    written = NodeLock(kube).acquire("n1", "ml", "train", cached=stale)
    assert written["metadata"]["annotations"][LOCK_KEY].endswith(",ml,train")
    assert written["metadata"]["annotations"]["other"] == "change"
    assert _calls(api, "GET") == 1 and _calls(api, "PATCH") == 2


def test_a_node_locked_since_the_cache_saw_it_is_refused(api, kube):
    """Read again, a live holder's lock still refuses the bind: kube-scheduler tries again."""
    api.put_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other", "namespace": "ml"},
                 "spec": {"containers": []}})
    stale = api.put_node(node("n1"))
    api.put_node(node("n1", {LOCK_KEY: lock_value("ml", "other")}))
    with pytest.raises(LockBusy, match="locked by another bind"):
        NodeLock(kube).acquire("n1", "ml", "train", cached=stale)
    assert api.get_node("n1")["metadata"]["annotations"][LOCK_KEY].endswith(",ml,other")


def test_a_cached_node_showing_a_lock_is_read_first(api, kube):
    cached = api.put_node(node("n1", {LOCK_KEY: lock_value("ml", "other", now=0)}))  # expired long ago
    written = NodeLock(kube).acquire("n1", "ml", "train", cached=cached)
    assert written["metadata"]["annotations"][LOCK_KEY].endswith(",ml,train")
    assert _calls(api, "GET") == 1


def test_release_after_the_node_changed_reads_it_and_leaves_another_holder(api, kube):
    api.put_node(node("n1"))
    lock = NodeLock(kube)
    written = lock.acquire("n1", "ml", "train")
    api.put_node(node("n1", {LOCK_KEY: lock_value("ml", "other")}))  # taken over meanwhile
    lock.release("n1", "ml", "train", locked=written)
    assert api.get_node("n1")["metadata"]["annotations"][LOCK_KEY].endswith(",ml,other")


def test_the_client_refreshes_credentials_at_most_once_a_second(api, kube, monkeypatch):
    """The kubeconfig loader's refresh hook ran before every API call and re-read the environment's proxy
    variables each time; it is throttled, and stays so after it runs (it installs itself again)."""
    ran = []
    assert kube.configuration.refresh_api_key_hook is not None  # a kubeconfig with a token sets one
    clock = [1000.0]
    monkeypatch.setattr(kube_mod.time, "monotonic", lambda: clock[0])
    kube.configuration.refresh_api_key_hook = None
    kube_mod._throttle_refresh(kube.configuration)  # nothing to wrap: left as it is
    assert kube.configuration.refresh_api_key_hook is None

    def reinstalling(c):  # as the kubeconfig loader's hook does
        ran.append(1)
        c.refresh_api_key_hook = reinstalling

    kube.configuration.refresh_api_key_hook = reinstalling
    kube_mod._throttle_refresh(kube.configuration)
    api.put_node(node("n1"))
    for _ in range(5):
        kube.get_node("n1")
    assert len(ran) == 1
    clock[0] += 1.5
    kube.get_node("n1")
    kube.get_node("n1")
    assert len(ran) == 2


def test_the_cache_keeps_its_own_newer_write_of_a_node_over_an_older_watch_event():
    from pyvgpu.cluster.scheduler.informer import Informer

    inf = Informer(kube=None)
    n5 = node("n1", {LOCK_KEY: "x"})
    n5["metadata"]["resourceVersion"] = "5"
    n7 = node("n1")
    n7["metadata"]["resourceVersion"] = "7"
    inf.apply("node", "ADDED", n5)
    inf.assume_node(n7)  # the lock's release, as the API server answered it
    inf.apply("node", "MODIFIED", n5)  # the watch brings the lock's write late
    assert inf.nodes["n1"]["metadata"]["resourceVersion"] == "7"
