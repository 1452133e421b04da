"""The Kubernetes API, through the official `kubernetes` client, as plain dicts.

Every call goes through `kubernetes.client.CoreV1Api` with `_preload_content=False`, so objects come
back as the JSON the API server sent (what `kubectl get -o json` prints, which is what the scheduling
core reads) without the client's model classes. Every call has a timeout; nothing here retries: the
callers decide how long to keep trying (the device plugin's Allocate, the node agent's loop, the
scheduler's informer each say so).

Errors: `KubeUnreachable` when the API server cannot be reached (connection refused, timed out),
`KubeError` with the HTTP status otherwise (`.status` 404: not found, 409: a resourceVersion conflict).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

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

    # -- plumbing ------------------------------------------------------------------------------------------

    def _call(self, what: str, fn, *args, timeout: float | None = None, **kwargs) -> Any:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        kwargs.setdefault("_request_timeout", timeout or self.timeout)
        try:
            resp = fn(*args, _preload_content=False, **kwargs)
        except ApiException as e:
            raise _api_error(what, e.status or 0, e.reason or "", e.body) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeUnreachable(f"{what}: cannot reach the API server at {self.server} ({_why(e)})") from None
        status = getattr(resp, "status", 200)
        try:
            data = resp.data
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeUnreachable(f"{what}: the API server at {self.server} stopped answering ({_why(e)})") from None
        if not 200 <= status < 300:
            raise _api_error(what, status, getattr(resp, "reason", "") or "", data)
        try:
            return json.loads(data) if data else {}
        except ValueError:
            raise KubeError(what, status, "not JSON", data[:200].decode(errors="replace")) from None

    # -- nodes ---------------------------------------------------------------------------------------------

    def get_node(self, name: str) -> dict:
        return self._call(f"get node {name}", self.api.read_node, name)

    def list_nodes(self) -> dict:
        return self._call("list nodes", self.api.list_node)

    def patch_node(self, name: str, patch: dict) -> dict:
        """A JSON merge patch (RFC 7386); put metadata.resourceVersion in it to make it conditional."""
        return self._call(f"patch node {name}", self.api.patch_node, name, patch, _content_type=MERGE_PATCH)

    # -- pods ----------------------------------------------------------------------------------------------

    def list_pods(self, node: str | None = None) -> dict:
        """Every pod, or the pods bound to `node` (a field selector the API server indexes)."""
        kw = {"field_selector": f"spec.nodeName={node}"} if node else {}
        return self._call(f"list pods{f' on node {node}' if node else ''}", self.api.list_pod_for_all_namespaces,
                          **kw)

    def list_quotas(self) -> dict:
        """Every namespace's ResourceQuotas (pyvgpu.cluster.core.quota reads their GPU limits)."""
        return self._call("list resourcequotas", self.api.list_resource_quota_for_all_namespaces)

    def get_pod(self, namespace: str, name: str) -> dict:
        return self._call(f"get pod {namespace}/{name}", self.api.read_namespaced_pod, name, namespace)

    def patch_pod(self, namespace: str, name: str, patch: dict) -> dict:
        return self._call(f"patch pod {namespace}/{name}", self.api.patch_namespaced_pod, name, namespace, patch,
                          _content_type=MERGE_PATCH)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Create the pod's Binding to `node` (what kube-scheduler does, done here by the extender's bind)."""
        meta = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self._call(f"bind pod {namespace}/{name} to node {node}", self.api.create_namespaced_pod_binding, name,
                   namespace, body)

    def create_event(self, namespace: str, body: dict) -> dict:
        """Write one core/v1 Event (pyvgpu.cluster.api.events)."""
        return self._call(f"create event in {namespace}", self.api.create_namespaced_event, namespace, body)

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


def _why(e: BaseException) -> str:
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
