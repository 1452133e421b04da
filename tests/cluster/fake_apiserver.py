"""A small Kubernetes API server for the tests: only what pyvgpu's cluster components call.

    GET    /api/v1/nodes[?watch=true&resourceVersion=R&timeoutSeconds=T]     list or watch nodes
    GET    /api/v1/nodes/NAME
    PATCH  /api/v1/nodes/NAME                                                 JSON merge patch only
    GET    /api/v1/pods[?fieldSelector=spec.nodeName=N][&watch=true...]      list or watch pods
    GET    /api/v1/resourcequotas[?watch=true...]                            list or watch ResourceQuotas
    GET    /api/v1/namespaces/NS/pods/NAME
    GET    /apis/coordination.k8s.io/v1/namespaces/NS/leases/NAME                 a Lease (put_lease)
    PATCH  /api/v1/namespaces/NS/pods/NAME                                    JSON merge patch only
    POST   /api/v1/namespaces/NS/pods/NAME/binding
    POST   /api/v1/namespaces/NS/events                                      kept in k8s_events

It keeps objects with resourceVersions, honours metadata.resourceVersion in a patch (409 Conflict on a
mismatch, as the real one does), honours a Binding's preconditions as kube-apiserver does (metadata.uid and
metadata.resourceVersion, where given, must be the pod's, else 409 Conflict: pkg/registry/core/pod/storage/
storage.go, BindingREST.Create and setPodHostAndAnnotations, checked by storage.Preconditions before the bound
pod's own checks), refuses a binding of a bound pod, and streams watch events as the real one does (chunked
JSON lines). Any other request is answered 404 and recorded in `unexpected`, which the
tests check is empty: the client code under test is the production one, and this is all it uses.

`stop()` closes the listening socket and every open connection (the API server is down);
`start()` on the same port brings it back.
"""

from __future__ import annotations

import bisect
import copy
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

# the objects' builders live beside this module; the tests and the live bench take them from here
from fake_objects import gpu_container, merge_patch, node, pod

__all__ = ["FakeApiServer", "gpu_container", "merge_patch", "node", "pod", "precondition_failed"]


class FakeApiServer:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 0
        self.nodes: dict[str, dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.quotas: dict[tuple[str, str], dict] = {}  # ResourceQuotas
        self.leases: dict[tuple[str, str], dict] = {}  # coordination.k8s.io/v1 Leases (kube-scheduler's election)
        self.events: list[tuple[int, str, str, dict]] = []  # (rv, kind, type, object)
        # indexes, as a real API server keeps them (a watch or a field selector does not scan everything):
        self._events_of: dict[str, list[tuple[int, str, str, dict]]] = {}  # events by kind, rv ascending
        self._on_node: dict[str, dict[tuple[str, str], None]] = {}  # pods by spec.nodeName
        self._node_of: dict[tuple[str, str], str] = {}
        self.requests: list[tuple[str, str]] = []
        # (method, path, Authorization, Content-Type) of each request: what the client sent beside the body
        self.headers_seen: list[tuple[str, str, str | None, str | None]] = []
        self.unexpected: list[str] = []
        self.patches: list[tuple[str, dict]] = []  # (path, patch) in order
        self.bindings: list[tuple[str, str, str]] = []  # (namespace, name, node)
        self.k8s_events: list[dict] = []  # core/v1 Events written (POST .../namespaces/NS/events)
        self.hooks: list = []  # callables (method, path) -> (status, body) | None, for failure injection
        self.port = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._conns: set[socket.socket] = set()
        self.stopping = False

    # -- life ----------------------------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        owner = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def process_request(self, request, client_address):
                with owner.cond:
                    owner._conns.add(request)
                super().process_request(request, client_address)

            def shutdown_request(self, request):
                with owner.cond:
                    owner._conns.discard(request)
                super().shutdown_request(request)

        self.stopping = False
        self._httpd = Server(("127.0.0.1", self.port), _handler(self))
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        """The API server goes down: no new connection is accepted, open ones are cut."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            conns = list(self._conns)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "test-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }))
        return path

    # -- the store (tests call these directly) --------------------------------------------------------------

    def _bump(self, kind: str, typ: str, obj: dict) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        event = (self.rv, kind, typ, copy.deepcopy(obj))
        self.events.append(event)
        self._events_of.setdefault(kind, []).append(event)
        if kind == "pod":
            m = obj["metadata"]
            key = (m.get("namespace", "default"), m["name"])
            node = "" if typ == "DELETED" else (obj.get("spec") or {}).get("nodeName", "")
            old = self._node_of.pop(key, None)
            if old is not None:
                self._on_node[old].pop(key, None)
            self._node_of[key] = node
            self._on_node.setdefault(node, {})[key] = None
        self.cond.notify_all()

    def events_after(self, kind: str, rv: int) -> list[tuple[int, str, str, dict]]:
        """The events of `kind` after resourceVersion `rv` (call it holding `cond`)."""
        events = self._events_of.get(kind, [])
        return events[bisect.bisect_right(events, rv, key=lambda e: e[0]):]

    def pods_on(self, node: str) -> list[dict]:
        """The pods whose spec.nodeName is `node` ("" : unbound), through the index (holding `cond`)."""
        out = [self.pods.get(k) for k in self._on_node.get(node, ())]
        return [p for p in out if p is not None and (p.get("spec") or {}).get("nodeName", "") == node]

    def put_node(self, obj: dict) -> dict:
        with self.cond:
            typ = "MODIFIED" if obj["metadata"]["name"] in self.nodes else "ADDED"
            obj = copy.deepcopy(obj)
            self.nodes[obj["metadata"]["name"]] = obj
            self._bump("node", typ, obj)
            return copy.deepcopy(obj)

    def put_pod(self, obj: dict) -> dict:
        with self.cond:
            m = obj["metadata"]
            key = (m.get("namespace", "default"), m["name"])
            typ = "MODIFIED" if key in self.pods else "ADDED"
            obj = copy.deepcopy(obj)
            self.pods[key] = obj
            self._bump("pod", typ, obj)
            return copy.deepcopy(obj)

    def put_quota(self, obj: dict) -> dict:
        with self.cond:
            m = obj["metadata"]
            key = (m.get("namespace", "default"), m["name"])
            typ = "MODIFIED" if key in self.quotas else "ADDED"
            obj = copy.deepcopy(obj)
            self.quotas[key] = obj
            self._bump("resourcequota", typ, obj)
            return copy.deepcopy(obj)

    def put_lease(self, namespace: str, name: str, holder: str | None, duration_s: int = 15,
                  renew_time: str = "2026-01-01T00:00:00.000000Z") -> dict:
        """Write a Lease as kube-scheduler's leader election does (holderIdentity `<hostname>_<uuid>`)."""
        with self.cond:
            self.rv += 1
            spec = {"leaseDurationSeconds": duration_s, "renewTime": renew_time}
            if holder is not None:
                spec["holderIdentity"] = holder
            obj = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": spec,
                   "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self.rv)}}
            self.leases[(namespace, name)] = obj
            return copy.deepcopy(obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self.cond:
            obj = self.pods.pop((namespace, name))
            self._bump("pod", "DELETED", obj)

    def get_node(self, name: str) -> dict:
        with self.cond:
            return copy.deepcopy(self.nodes[name])

    def get_pod(self, namespace: str, name: str) -> dict | None:
        with self.cond:
            p = self.pods.get((namespace, name))
            return copy.deepcopy(p) if p else None

    def wait_for(self, pred, timeout: float = 20.0, what: str = "a condition") -> None:
        """Wait until pred() (called under the store's lock) is true; fail after `timeout` seconds."""
        import time

        end = time.monotonic() + timeout
        with self.cond:
            while not pred():
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
                self.cond.wait(min(left, 0.1))


def _status(code: int, reason: str, message: str) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason,
            "message": message}


def _conflict(resource: str, name: str, why: str) -> dict:
    """A 409's Status as the real one words it (reason Conflict, details.name and details.kind)."""
    return _status(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {why}') \
        | {"details": {"name": name, "kind": resource}}


def precondition_failed(obj: dict, meta: dict) -> str:
    """Why a write whose metadata carries uid / resourceVersion preconditions may not change `obj` ("" when
    it may): each one given must equal the object's (storage.Preconditions.Check, the UID first)."""
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        want, have = meta.get(field), obj["metadata"].get(field)
        if want and want != have:
            return f"Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}"
    return ""


def _handler(api: FakeApiServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else each answer waits ~40 ms for the client's delayed ACK

        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def _route(self, method: str) -> None:
            u = urlparse(self.path)
            q = {k: v[-1] for k, v in parse_qs(u.query).items()}
            parts = [p for p in u.path.split("/") if p]
            with api.cond:
                api.requests.append((method, u.path))
                api.headers_seen.append((method, u.path, self.headers.get("Authorization"),
                                         self.headers.get("Content-Type")))
            if method == "PATCH" and self.headers.get("Content-Type") != "application/merge-patch+json":
                self._body()  # the real one reads other patch types too; the code under test sends only these
                return self._send(415, _status(415, "UnsupportedMediaType", "only merge patches are served here"))
            for hook in list(api.hooks):
                r = hook(method, u.path)
                if r is not None:
                    if method in ("PATCH", "POST"):
                        self._body()
                    return self._send(r[0], r[1])
            if parts[:3] == ["apis", "coordination.k8s.io", "v1"] and method == "GET" and len(parts) == 7 \
                    and parts[3] == "namespaces" and parts[5] == "leases":
                with api.cond:
                    lease = copy.deepcopy(api.leases.get((parts[4], parts[6])))
                if lease is None:
                    return self._send(404, _status(404, "NotFound", f'leases "{parts[6]}" not found'))
                return self._send(200, lease)
            if parts[:2] != ["api", "v1"]:
                return self._unexpected(method)
            rest = parts[2:]
            if method == "GET" and rest == ["nodes"]:
                return self._list_or_watch("node", q)
            if method == "GET" and rest == ["pods"]:
                return self._list_or_watch("pod", q)
            if method == "GET" and rest == ["resourcequotas"]:
                return self._list_or_watch("resourcequota", q)
            if len(rest) == 2 and rest[0] == "nodes" and method in ("GET", "PATCH"):
                return self._object("node", rest[1], None, method)
            if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "pods" and method in ("GET", "PATCH"):
                return self._object("pod", rest[3], rest[1], method)
            if len(rest) == 5 and rest[0] == "namespaces" and rest[2] == "pods" and rest[4] == "binding" \
                    and method == "POST":
                return self._binding(rest[1], rest[3])
            if len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "events" and method == "POST":
                body = self._body()
                with api.cond:
                    api.k8s_events.append(body)
                    api.cond.notify_all()
                return self._send(201, body)
            return self._unexpected(method)

        def _unexpected(self, method: str) -> None:
            with api.cond:
                api.unexpected.append(f"{method} {self.path}")
            self._send(404, _status(404, "NotFound", f"the test API server does not serve {method} {self.path}"))

        do_GET = lambda self: self._route("GET")  # noqa: E731
        do_PATCH = lambda self: self._route("PATCH")  # noqa: E731
        do_POST = lambda self: self._route("POST")  # noqa: E731
        do_PUT = lambda self: self._route("PUT")  # noqa: E731
        do_DELETE = lambda self: self._route("DELETE")  # noqa: E731

        def _select(self, kind: str, q: dict) -> list[dict]:
            store = {"node": api.nodes, "pod": api.pods, "resourcequota": api.quotas}[kind]
            sel = q.get("fieldSelector")
            if sel:
                field, _, value = sel.partition("=")
                if kind != "pod" or field != "spec.nodeName":
                    raise ValueError(sel)
                return api.pods_on(value)
            return list(store.values())

        def _list_or_watch(self, kind: str, q: dict) -> None:
            if q.get("watch") in ("true", "1", "True"):
                return self._watch(kind, q)
            with api.cond:
                try:
                    objs = copy.deepcopy(self._select(kind, q))
                except ValueError:
                    return self._send(400, _status(400, "BadRequest", f"unsupported field selector {q}"))
                body = {"apiVersion": "v1", "kind": {"node": "NodeList", "pod": "PodList",
                                                     "resourcequota": "ResourceQuotaList"}[kind],
                        "metadata": {"resourceVersion": str(api.rv)}, "items": objs}
            self._send(200, body)

        def _watch(self, kind: str, q: dict) -> None:
            import time

            since = int(q.get("resourceVersion") or 0)
            end = time.monotonic() + float(q.get("timeoutSeconds") or 30)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while True:
                    with api.cond:
                        batch = api.events_after(kind, since)
                        if not batch:
                            left = end - time.monotonic()
                            if left <= 0 or api.stopping:
                                break
                            api.cond.wait(min(left, 0.1))
                            continue
                    for rv, _, typ, obj in batch:
                        line = (json.dumps({"type": typ, "object": obj}) + "\n").encode()
                        self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                        since = rv
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True

        def _object(self, kind: str, name: str, namespace: str | None, method: str) -> None:
            key = name if kind == "node" else (namespace, name)
            if method == "PATCH":
                ctype = self.headers.get("Content-Type", "")
                patch = self._body()
                if ctype != "application/merge-patch+json":
                    return self._send(415, _status(415, "UnsupportedMediaType", f"the test server takes JSON "
                                                                                f"merge patches, got {ctype}"))
            with api.cond:
                store = api.nodes if kind == "node" else api.pods
                obj = store.get(key)
                if obj is None:
                    return self._send(404, _status(404, "NotFound", f'{kind}s "{name}" not found'))
                if method == "GET":
                    return self._send(200, copy.deepcopy(obj))
                # an empty (or absent) resourceVersion is no precondition: kube-apiserver parses "" as 0, and
                # the generic store's Update writes an object of version 0 unconditionally where the strategy
                # allows it, as pods' does (apiserver pkg/storage APIObjectVersioner, pkg/registry/generic/
                # registry/store.go Store.Update)
                want = ((patch.get("metadata") or {}).get("resourceVersion"))
                if want and want != obj["metadata"]["resourceVersion"]:
                    return self._send(409, _conflict(f"{kind}s", name, "the object has been modified; please apply "
                                                                       "your changes to the latest version and try "
                                                                       "again"))
                if isinstance(patch.get("metadata"), dict):
                    patch["metadata"].pop("resourceVersion", None)
                api.patches.append((self.path, copy.deepcopy(patch)))
                new = merge_patch(obj, patch)
                store[key] = new
                api._bump(kind, "MODIFIED", new)
                out = copy.deepcopy(new)
            self._send(200, out)

        def _binding(self, namespace: str, name: str) -> None:
            body = self._body()
            with api.cond:
                obj = api.pods.get((namespace, name))
                if obj is None:
                    return self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
                # a failed precondition is the storage's conflict on "pods"; "already assigned" is a plain
                # error that BindingREST's assignPod wraps as a conflict on "pods/binding"
                why = precondition_failed(obj, body.get("metadata") or {})
                if why:
                    return self._send(409, _conflict("pods", name, why))
                if (obj.get("spec") or {}).get("nodeName"):
                    why = f"pod {name} is already assigned to node \"{obj['spec']['nodeName']}\""
                    return self._send(409, _conflict("pods/binding", name, why))
                target = (body.get("target") or {}).get("name")
                obj.setdefault("spec", {})["nodeName"] = target
                api.bindings.append((namespace, name, target))
                api._bump("pod", "MODIFIED", obj)
            self._send(201, _status(201, "", "") | {"status": "Success"})

    return Handler
