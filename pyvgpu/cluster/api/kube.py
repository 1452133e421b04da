"""The Kubernetes API, through the official `kubernetes` client, as plain dicts.

The client's configuration (kubeconfig or in-cluster), credentials (its refresh hook and auth settings)
and connection pool (TLS, client certificates, proxy) carry every call. Watches go through the client's
`Watch`; the single-object calls (get, list, patch, create) are sent on the same pool with the headers
the generated `CoreV1Api` methods would send, without their per-call argument validation and
serialisation, which cost more CPU than the HTTP exchange itself (a bind makes five such calls:
docs/cluster.md, "Where the time goes"); where the pool is the server's own (no proxy), the exchange is
written and read by pyvgpu.cluster.api.wire on the pool's connections, without http.client. Objects come
back as the JSON the API server sent (what `kubectl get -o json` prints, which is what the scheduling
core reads). Every call has a timeout; nothing
here retries: the callers decide how long to keep trying (the device plugin's Allocate, the node agent's
loop, the scheduler's informer each say so).

Errors: `KubeUnreachable` when the API server cannot be reached (connection refused, timed out),
`KubeError` with the HTTP status otherwise (`.status` 404: not found, 409: a resourceVersion conflict).
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

from pyvgpu.cluster.api import wire
from pyvgpu.contract import envspec
from pyvgpu.errors import PyvgpuError

MERGE_PATCH = "application/merge-patch+json"


class KubeError(PyvgpuError):
    """The API server answered with an error."""

    def __init__(self, what: str, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{what}: HTTP {status} {reason}" + (f": {message}" if message else ""))
        self.status = status
        self.reason = reason

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class KubeUnreachable(PyvgpuError):
    """The API server could not be reached at all."""


def _load_config(kubeconfig: str | None):
    """A client Configuration: the kubeconfig given, else in-cluster, else $KUBECONFIG / ~/.kube/config."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        if kubeconfig:
            if not os.path.exists(kubeconfig):
                raise PyvgpuError(f"--kubeconfig {kubeconfig}: no such file; give the path of a kubeconfig, or "
                                  "leave it out inside a pod (the service account is used)")
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        elif os.environ.get(envspec.KUBERNETES_SERVICE_HOST.name):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(client_configuration=cfg)
    except config.ConfigException as e:
        raise PyvgpuError(f"cannot configure the Kubernetes client: {e}; give --kubeconfig PATH, or run inside "
                          "a pod with a service account") from None
    cfg.retries = False  # one try per call: the callers bound their own retries
    return cfg


class Kube:
    """The few API calls pyvgpu's cluster components make."""

    def __init__(self, kubeconfig: str | None = None, timeout: float = 10.0) -> None:
        from kubernetes import client

        self.timeout = timeout
        self.configuration = _load_config(kubeconfig)
        self.server = self.configuration.host
        self.api = client.CoreV1Api(client.ApiClient(self.configuration))
        _throttle_refresh(self.configuration)
        self._headers = {**self.api.api_client.default_headers, "Accept": "application/json",
                         "User-Agent": self.api.api_client.user_agent}
        self._pool = None  # the connection pool of self.server (see _pool_of_server)

    def _pool_of_server(self) -> tuple[Any, str] | None:
        """The client's pool of connections to the API server, and the server URL's path (a prefix of every
        request's path), or None where the client goes through a proxy (then its pool manager chooses). Taken
        once, not looked up per call: the manager parsed and normalised every call's URL to find this same
        pool, a part of each of bind's calls."""
        import urllib3

        got = self._pool
        if got is not None and got[0].pool is not None:  # a closed pool's connections are gone: taken again
            return got
        manager = self.api.api_client.rest_client.pool_manager
        if type(manager) is not urllib3.PoolManager:
            return None
        got = self._pool = (manager.connection_from_url(self.server), urllib3.util.parse_url(self.server).path or "")
        return got

    # -- plumbing ------------------------------------------------------------------------------------------

    def _request(self, what: str, method: str, path: str, query: dict | None = None, body: Any = None,
                 content_type: str = "application/json", timeout: float | None = None, bulk: bool = False) -> Any:
        """One call on the client's connection pool, with the client's credentials: what the generated
        CoreV1Api method for `path` sends (the Accept, User-Agent and default headers, the bearer token
        of the auth settings, refreshed by the client's hook), and the answer's JSON. `bulk`: a
        cluster-wide list, read by urllib3 (its time limit is per read, and its size is the cluster's),
        not by wire.py."""
        import urllib3

        headers = dict(self._headers)
        for auth in self.configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        target = path + (f"?{urlencode(query)}" if query else "")
        try:
            pool = self._pool_of_server()
            if pool is None:
                resp = self.api.api_client.rest_client.pool_manager.request(
                    method, self.server + target, body=data, headers=headers,
                    timeout=urllib3.Timeout(total=timeout or self.timeout), preload_content=True, retries=False)
                status, reason, payload = resp.status, resp.reason or "", resp.data
            elif not bulk and wire.usable(pool[0]):  # the same request, written and read without http.client (wire.py)
                status, reason, payload = wire.exchange(pool[0], method, pool[1] + target, headers, data,
                                                        timeout or self.timeout)
            else:  # what the manager does for a URL of this server, without finding the pool again
                resp = pool[0].urlopen(method, pool[1] + target, body=data, headers=headers,
                                       timeout=urllib3.Timeout(total=timeout or self.timeout), preload_content=True,
                                       retries=False, redirect=False, assert_same_host=False)
                status, reason, payload = resp.status, resp.reason or "", resp.data
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeUnreachable(f"{what}: cannot reach the API server at {self.server} ({_why(e)})") from None
        if not 200 <= status < 300:
            raise _api_error(what, status, reason, payload)
        try:
            return json.loads(payload) if payload else {}
        except ValueError:
            raise KubeError(what, status, "not JSON", payload[:200].decode(errors="replace")) from None

    # -- nodes ---------------------------------------------------------------------------------------------

    def get_node(self, name: str) -> dict:
        return self._request(f"get node {name}", "GET", f"/api/v1/nodes/{_seg(name)}")

    def list_nodes(self) -> dict:
        return self._request("list nodes", "GET", "/api/v1/nodes", bulk=True)

    def patch_node(self, name: str, patch: dict) -> dict:
        """A JSON merge patch (RFC 7386); put metadata.resourceVersion in it to make it conditional."""
        return self._request(f"patch node {name}", "PATCH", f"/api/v1/nodes/{_seg(name)}", body=patch,
                             content_type=MERGE_PATCH)

    # -- pods ----------------------------------------------------------------------------------------------

    def list_pods(self, node: str | None = None) -> dict:
        """Every pod, or the pods bound to `node` (a field selector the API server indexes)."""
        return self._request(f"list pods{f' on node {node}' if node else ''}", "GET", "/api/v1/pods",
                             query={"fieldSelector": f"spec.nodeName={node}"} if node else None, bulk=not node)

    def list_quotas(self) -> dict:
        """Every namespace's ResourceQuotas (pyvgpu.cluster.core.quota reads their GPU limits)."""
        return self._request("list resourcequotas", "GET", "/api/v1/resourcequotas", bulk=True)

    def get_pod(self, namespace: str, name: str) -> dict:
        return self._request(f"get pod {namespace}/{name}", "GET",
                             f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}")

    def patch_pod(self, namespace: str, name: str, patch: dict) -> dict:
        return self._request(f"patch pod {namespace}/{name}", "PATCH",
                             f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}", body=patch,
                             content_type=MERGE_PATCH)

    def bind(self, namespace: str, name: str, uid: str, node: str, resource_version: str | None = None) -> None:
        """Create the pod's Binding to `node` (what kube-scheduler does, done here by the extender's bind).
        `uid` and `resource_version`, where given, are preconditions: the API server answers 409 Conflict when
        the pod's differ (pkg/registry/core/pod/storage/storage.go, BindingREST; kubernetes#105913)."""
        meta = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if resource_version:
            meta["resourceVersion"] = resource_version
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self._request(f"bind pod {namespace}/{name} to node {node}", "POST",
                      f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}/binding", body=body)

    def create_event(self, namespace: str, body: dict) -> dict:
        """Write one core/v1 Event (pyvgpu.cluster.api.events)."""
        return self._request(f"create event in {namespace}", "POST", f"/api/v1/namespaces/{_seg(namespace)}/events",
                             body=body)

    # -- leases (coordination.k8s.io/v1) -------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> dict:
        """The Lease kube-scheduler's leader election writes (pyvgpu.cluster.scheduler.leader reads it)."""
        return self._request(f"get lease {namespace}/{name}", "GET",
                             f"/apis/coordination.k8s.io/v1/namespaces/{_seg(namespace)}/leases/{_seg(name)}")

    # -- watch ---------------------------------------------------------------------------------------------

    def watch(self, kind: str, resource_version: str, timeout_seconds: int) -> Iterator[dict]:
        """Events {"type", "object"} of nodes or pods after `resource_version`, for at most
        `timeout_seconds` (the server ends the stream then). Raises KubeError 410 when the version is too
        old (list again), KubeUnreachable when the connection fails."""
        import urllib3
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        fn = {"node": self.api.list_node, "pod": self.api.list_pod_for_all_namespaces,
              "resourcequota": self.api.list_resource_quota_for_all_namespaces}[kind]
        w = watch.Watch()
        try:
            for event in w.stream(fn, resource_version=resource_version, timeout_seconds=timeout_seconds,
                                  allow_watch_bookmarks=True, deserialize=False,
                                  _request_timeout=(self.timeout, timeout_seconds + self.timeout)):
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    raise KubeError(f"watch {kind}s", int(obj.get("code") or 500), obj.get("reason") or "",
                                    obj.get("message") or "")
                yield event
        except ApiException as e:
            raise _api_error(f"watch {kind}s", e.status or 0, e.reason or "", e.body) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeUnreachable(f"watch {kind}s: the API server at {self.server} is unreachable ({_why(e)})") \
                from None
        finally:
            w.stop()


REFRESH_S = 1.0  # the client's credential refresh runs at most this often


def _throttle_refresh(cfg) -> None:
    """The client calls its credential refresh hook before every request; the hook re-applies the whole
    kubeconfig, whose host setter reads every proxy variable of the environment again: a millisecond or
    more per call, most of a bind's client time. Tokens live for minutes; once a second is enough."""
    hook = getattr(cfg, "refresh_api_key_hook", None)
    if hook is None:
        return
    lock = threading.Lock()
    last = [float("-inf")]

    def throttled(c) -> None:
        now = time.monotonic()
        if now - last[0] < REFRESH_S:
            return
        with lock:
            if now - last[0] < REFRESH_S:
                return
            hook(c)
            last[0] = time.monotonic()
            c.refresh_api_key_hook = throttled  # the kubeconfig loader's hook installs itself again

    cfg.refresh_api_key_hook = throttled


def _seg(name: str) -> str:
    """A name as one path segment (names of Kubernetes objects never need quoting; a bad one stays one segment)."""
    return quote(name, safe="")


def _why(e: BaseException) -> str:
    if isinstance(e, ssl.SSLCertVerificationError):  # wire's own TLS errors: the check that failed, and why
        return str(e)
    reason = getattr(e, "reason", None)
    return str(reason or e) or type(e).__name__


def _api_error(what: str, status: int, reason: str, body: Any) -> KubeError:
    message = ""
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = (body.decode(errors="replace") if isinstance(body, bytes) else str(body))[:200]
    return KubeError(what, status, reason, message)


def items(listing: dict) -> list[dict]:
    return listing.get("items") or []


def annotations(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("annotations") or {}
