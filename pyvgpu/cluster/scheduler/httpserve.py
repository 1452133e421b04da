"""A bounded HTTP(S) listener for the scheduler: who may call which verb, and how much one request may cost.

Every request is bounded in bytes (MAX_BODY; 413 above it), in time (a socket timeout on every read and
write, so an idle or trickling client loses its thread after SOCKET_TIMEOUT_S), in nesting (MAX_DEPTH) and
in threads (MAX_CONNECTIONS open at once).
The TLS handshake runs in the connection's own thread, never in the accept loop: one client that opens a
TCP connection and says nothing cannot hold up the API server's admission calls. The listen backlog is
sized for kube-scheduler's parallelism (it calls filter and bind from many goroutines at once).

Authentication. The extender verbs (/filter, /prioritize, /bind) can bind pods and move GPUs, so they are
served without credentials only on a loopback listener (kube-scheduler runs in the same pod and calls
127.0.0.1). Anywhere else a caller must show the bearer token of --token-file or, over TLS, a client
certificate signed by --client-ca-file. The webhook, health and metrics paths answer anyone: the webhook
only computes a patch for the object it is given, and metrics are counters.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
import ssl
import threading
from http.server import ThreadingHTTPServer
from typing import Any

MAX_BODY = 4 << 20  # a filter for 5000 nodes by name is ~100 KB; a NodeList of 500 full nodes ~3 MB
MAX_DEPTH = 64  # a pod or node object nests ~10 deep
SOCKET_TIMEOUT_S = 10.0
BACKLOG = 128  # kube-scheduler runs up to 16 binds and many filters at once; 5 (Python's default) reset ours
MAX_CONNECTIONS = 512  # open at once (a thread each); more are closed at once rather than grow without bound
EXTENDER_VERBS = frozenset({"/filter", "/prioritize", "/bind"})


class BadRequest(Exception):
    """A request refused before it reaches a verb; `code` is the HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def read_body(headers: Any, rfile: Any, limit: int = MAX_BODY) -> bytes:
    """The request body, exactly Content-Length bytes of it. Raises BadRequest (400, 411, 413)."""
    if headers.get("Transfer-Encoding"):
        raise BadRequest(411, "chunked request bodies are not accepted: send a Content-Length")
    raw = headers.get("Content-Length")
    if raw is None:
        raise BadRequest(411, "a POST needs a Content-Length header")
    text = raw.strip()
    if not text.isdigit() or not text.isascii():
        raise BadRequest(400, f"Content-Length {raw!r}: expected a whole number of bytes, 0 or more")
    n = int(text)
    if n > limit:
        raise BadRequest(413, f"request body of {n} bytes is over the limit of {limit}")
    data = rfile.read(n)
    if len(data) < n:
        raise BadRequest(400, f"the request body ended after {len(data)} of its {n} bytes")
    return data


_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'"[]{}')


def _depth_ok(raw: bytes, limit: int) -> bool:
    """Whether valid JSON `raw` nests at most `limit` deep: its brackets outside strings, counted (a
    filter's body is mostly a list of node names; walking the parsed objects cost a pass over every one).
    In valid JSON a backslash appears only in a string, as an escape: the escaped backslashes go first
    (left to right, as a reader pairs them), then the escaped quotes; every quote left opens or closes a
    string, so the pieces between quotes alternate outside, inside, outside. Each step is a C-speed pass
    over the bytes (a regular expression over every string cost more than parsing the body)."""
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"")
    if b'\\"' in raw:
        raw = raw.replace(b'\\"', b"")
    outside = b"".join(raw.translate(None, _NOT_STRUCTURE).split(b'"')[::2])
    if len(outside) <= 2 * limit:  # fewer brackets than twice the limit cannot nest deeper than it
        return True
    depth = 0
    for c in outside:
        if c in b"[{":
            depth += 1
            if depth > limit:
                return False
        else:
            depth -= 1
    return True


def parse_object(raw: bytes, limit: int = MAX_DEPTH) -> dict:
    """A JSON object from a body. Raises BadRequest(400) with the reason for anything else."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest(400, f"the JSON nests deeper than {limit} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, f"expected a JSON object, got {type(body).__name__}")
    if not _depth_ok(raw if isinstance(raw, bytes) else raw.encode(), limit):
        raise BadRequest(400, f"the JSON nests deeper than {limit} levels")
    return body


def load_token(path: str | None) -> str | None:
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        token = f.read().strip()
    if len(token) < 16:
        raise ValueError(f"{path}: the token is {len(token)} characters; use at least 16 (e.g. openssl rand -hex 32)")
    return token


class BoundedServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a sized backlog, per-socket timeouts, the TLS handshake in the worker
    thread, and the credentials the extender verbs need on this listener."""

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, tls: ssl.SSLContext | None = None,
                 token: str | None = None, timeout_s: float = SOCKET_TIMEOUT_S) -> None:
        self.tls = tls
        self.token = token
        self.timeout_s = timeout_s
        self.open_connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.loopback = is_loopback(address[0])
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        sock.settimeout(self.timeout_s)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.open_connections.acquire(blocking=False):
            self.shutdown_request(request)  # MAX_CONNECTIONS open: this one is closed unanswered
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.open_connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.open_connections.release()

    def finish_request(self, request: Any, client_address: Any) -> None:  # runs in the connection's thread
        if self.tls is None:
            return super().finish_request(request, client_address)
        try:
            conn = self.tls.wrap_socket(request, server_side=True)  # the handshake, bounded by the timeout
        except (OSError, ssl.SSLError):
            return
        try:
            self.RequestHandlerClass(conn, client_address, self)
        finally:
            conn.close()

    def may_call_extender(self, handler: Any) -> bool:
        """Whether this connection may call /filter, /prioritize or /bind (see the module's text)."""
        if self.loopback and self.tls is None:
            return True
        if self.token is not None:
            got = handler.headers.get("Authorization") or ""
            if hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode()):
                return True
        if self.tls is not None and self.tls.verify_mode != ssl.CERT_NONE:
            try:
                return bool(handler.connection.getpeercert())
            except (AttributeError, ValueError):
                return False
        return False


def tls_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The server's TLS context; with a client CA, a client certificate is asked for (CERT_OPTIONAL: the API
    server calls the webhook without one) and verified when shown."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(client_ca)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx
