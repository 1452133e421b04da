"""The extender's HTTP server (pyvgpu.cluster.scheduler.extender's verbs over HTTP and HTTPS) and `run()`, which
`pyvgpu cluster scheduler` starts. Who may call what: pyvgpu.cluster.scheduler.httpserve."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from pyvgpu.cluster.api.kube import Kube
from pyvgpu.cluster.core.config import ClusterConfig
from pyvgpu.cluster.scheduler import httpserve
from pyvgpu.cluster.scheduler.extender import HANDSHAKE_S, Scheduler, log


def _handler(s: Scheduler):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "pyvgpu-scheduler"
        # kube-scheduler keeps its connection alive: with Nagle's algorithm on, the body (a second small
        # write after the headers) waits for the client's delayed ACK, many times the decision itself
        # (docs/cluster.md, "Measured")
        disable_nagle_algorithm = True

        def log_message(self, fmt, *args):
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else (json.dumps(body).encode() if ctype == "application/json"
                                                         else str(body).encode())
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            path = self.path.split("?")[0]
            if path == "/healthz":
                return self._send(200, "ok", "text/plain")
            if path == "/readyz":
                ready = s.informer.ready.is_set()
                s.metrics.ready.set(1 if ready else 0)
                return self._send(200 if ready else 503, "ok" if ready else "the cache has not listed nodes and "
                                                                           "pods yet", "text/plain")
            if path == "/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

                s.metrics.ready.set(1 if s.informer.ready.is_set() else 0)
                return self._send(200, generate_latest(s.metrics.registry), CONTENT_TYPE_LATEST)
            self._send(404, f"no such path {path}; see `pyvgpu cluster scheduler --help`", "text/plain")

        def do_POST(self):  # noqa: N802
            path = self.path.split("?")[0].rstrip("/")
            verbs = {"/filter": s.filter, "/prioritize": s.prioritize_body, "/bind": s.bind, "/webhook": s.admit,
                     "/mutate": s.admit}
            fn = verbs.get(path)
            try:
                raw = httpserve.read_body(self.headers, self.rfile)
            except httpserve.BadRequest as e:
                self.close_connection = True
                return self._send(e.code, f"pyvgpu scheduler {path}: {e}", "text/plain")
            if fn is None:
                return self._send(404, f"no such verb {path}: use /filter, /prioritize, /bind or /webhook",
                                  "text/plain")
            if path in httpserve.EXTENDER_VERBS and not self.server.may_call_extender(self):
                return self._send(403, f"pyvgpu scheduler {path}: the extender verbs are served to kube-scheduler "
                                       "on localhost; on this port they need the bearer token of --token-file or a "
                                       "client certificate signed by --client-ca-file", "text/plain")
            try:
                out = fn(httpserve.parse_object(raw))
            except httpserve.BadRequest as e:
                return self._send(e.code, f"pyvgpu scheduler {path}: bad request: {e}", "text/plain")
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                return self._send(400, f"pyvgpu scheduler {path}: bad request: {e}", "text/plain")
            self._send(200, out)

    return Handler


class Server:
    """The HTTP listener of the extender verbs, on localhost unless `host` says otherwise (then a token is
    required), and with a certificate an HTTPS one for the webhook, health and metrics
    (pyvgpu.cluster.scheduler.httpserve says who may call what)."""

    def __init__(self, scheduler: Scheduler, port: int, host: str = "127.0.0.1", tls_port: int | None = None,
                 cert: str | None = None, key: str | None = None, token_file: str | None = None,
                 client_ca: str | None = None, tls_host: str = "0.0.0.0") -> None:
        self.scheduler = scheduler
        token = httpserve.load_token(token_file)
        if not httpserve.is_loopback(host) and token is None:
            raise ValueError(f"--address {host} exposes /filter, /prioritize and /bind beyond localhost: give "
                             "--token-file (a bearer token callers must send), or keep the default 127.0.0.1")
        self.httpd = httpserve.BoundedServer((host, port), _handler(scheduler), token=token)
        self.port = self.httpd.server_address[1]
        self.httpsd = None
        if tls_port is not None:
            ctx = httpserve.tls_context(cert, key, client_ca)
            self.httpsd = httpserve.BoundedServer((tls_host, tls_port), _handler(scheduler), tls=ctx, token=token)
            self.tls_port = self.httpsd.server_address[1]

    def start(self) -> None:
        for srv in (self.httpd, self.httpsd):
            if srv is not None:
                threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()

    def stop(self) -> None:
        for srv in (self.httpd, self.httpsd):
            if srv is not None:
                srv.shutdown()
                srv.server_close()


def run(kubeconfig: str | None, port: int, name: str, cfg: ClusterConfig, lock_expire_s: float,
        tls_port: int | None = None, cert: str | None = None, key: str | None = None, address: str = "127.0.0.1",
        token_file: str | None = None, client_ca: str | None = None, writers: tuple[str, ...] = (),
        leader_lease: tuple[str, str] | None = None) -> None:
    """`leader_lease`: (namespace, name) of the Lease the replicas' kube-schedulers elect their leader with;
    only the replica whose kube-scheduler holds it asks the nodes for their handshake
    (pyvgpu.cluster.scheduler.leader). None: this replica is the only one."""
    from pyvgpu.cluster.scheduler.leader import LeaseLeader
    from pyvgpu.cluster.signals import stop_on_signals

    stop = stop_on_signals()
    kube = Kube(kubeconfig)
    leader = LeaseLeader(kube, *leader_lease) if leader_lease else None
    s = Scheduler(kube, cfg, name, lock_expire_s, handshake_s=HANDSHAKE_S, leader=leader)
    s.annotation_writers = frozenset(writers)
    if not writers:
        log.warning("no --annotation-writer: the webhook refuses every change to the hami.io allocation "
                    "annotations, also the node agent's; name the scheduler's and the node agent's service accounts")
    srv = Server(s, port, address, tls_port=tls_port, cert=cert, key=key, token_file=token_file, client_ca=client_ca)
    s.start(stop)
    srv.start()
    log.info("extender on %s:%d%s, scheduler name %s, API server %s", address, srv.port,
             f", webhook over TLS on {tls_port}" if tls_port else "", name, kube.server)
    stop.wait()
    srv.stop()

