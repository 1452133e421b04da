"""One HTTP/1.1 exchange with the API server, written and read here on a connection of the client's pool.

Why: `http.client` parses every answer's headers through the `email` package and urllib3 wraps each answer
in an HTTPResponse; for the small JSON answers of a bind's calls that was most of a call's CPU, spent in
the scheduler's interpreter beside its filters (docs/cluster.md, "Where the time goes"). The connection
itself (TCP, TLS with the client's CA and certificates, its timeouts) is still made, checked for a drop
and kept by the kubernetes client's urllib3 pool, so what the API server sees is the same request.

Only single objects and one node's pods travel here: the cluster-wide lists (the informer's) stay on
urllib3's path, whose time limit is per read, since a list of a large cluster takes longer than one
call's deadline and more than MAX_BODY.

Bounds: the whole exchange (connect, write, read) has one deadline; an answer's status line and headers
are at most MAX_HEAD bytes, its body at most MAX_BODY. Numbers (status, Content-Length, chunk sizes) are
read only in the form HTTP/1.1 gives them. A connection is used again only after an answer read exactly
to its end that did not ask to close it; any error closes it.
"""

from __future__ import annotations

import re
import socket
import time
from typing import Any

MAX_HEAD = 64 * 1024
MAX_BODY = 64 << 20  # an object is at most ~1.5 MiB (etcd's limit); one node's pods a few MiB
_RECV = 256 * 1024
_BREAKS = re.compile(r"[\r\n\0]")
_STATUS = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: (.*))?")
_DECIMAL = re.compile(r"[0-9]{1,19}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")


class WireError(OSError):
    """The exchange failed below HTTP: a timeout, a closed connection, an answer that is not HTTP/1.x."""


def usable(pool: Any) -> bool:
    """Whether `pool` (a urllib3 connection pool) lends connections the way exchange() takes them."""
    return all(hasattr(pool, a) for a in ("_get_conn", "_put_conn", "_validate_conn", "host", "port", "scheme"))


def host_header(pool: Any) -> str:
    """The Host header http.client would send for the pool's server (the port left out when it is the
    scheme's default; an IPv6 address in brackets)."""
    host = pool.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    default = 443 if pool.scheme == "https" else 80
    return host if pool.port in (None, default) else f"{host}:{pool.port}"


def exchange(pool: Any, method: str, target: str, headers: dict[str, str], body: bytes | None,
             timeout: float) -> tuple[int, str, bytes]:
    """Send one request on a connection of `pool` and read its answer: (status, reason, body).
    Raises WireError (or another OSError of the socket) when no complete answer came within `timeout`."""
    deadline = time.monotonic() + timeout
    conn = pool._get_conn(timeout=timeout)
    keep = False
    try:
        if conn.sock is None:
            conn.timeout = timeout  # the connect's own limit (urllib3 sets it per request the same way)
            pool._validate_conn(conn)  # https: connects and verifies now
            if conn.sock is None:
                conn.connect()
        sock = conn.sock
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header(pool)}", "Accept-Encoding: identity"]
        if _BREAKS.search("".join(f"{k}{v}" for k, v in headers.items())):
            # one header must stay one line (http.client refused these too)
            bad = next(k for k, v in headers.items() if _BREAKS.search(f"{k}{v}"))
            raise WireError(f"the request header {bad} holds a line break; fix the client's configuration")
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        sock.settimeout(_left(deadline))
        sock.sendall(data)  # one write: headers and body leave together
        reader = _Reader(sock, deadline)
        status, reason, payload, keep = reader.answer()
        keep = keep and not reader.buf  # bytes past the answer's end: not a connection to trust again
        return status, reason, payload
    finally:
        if not keep:
            conn.close()
        pool._put_conn(conn)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise WireError("timed out")
    return left


class _Reader:
    """An HTTP/1.1 answer read off a socket within a deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = bytearray()
        self.started = False  # a byte of the answer came: a close now is in the middle of it

    def _fill(self, want: int = _RECV) -> bool:
        self.sock.settimeout(_left(self.deadline))
        chunk = self.sock.recv(max(_RECV, min(want, 1 << 22)))
        if not chunk:
            return False
        self.started = True
        self.buf += chunk
        return True

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill(n - len(self.buf)):
                raise WireError("the API server closed the connection in the middle of an answer")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _line(self, limit: int) -> bytes:
        start = 0
        while True:
            i = self.buf.find(b"\r\n", start)
            if i >= 0:
                return self._take(i + 2)[:-2]
            if len(self.buf) > limit:
                raise WireError(f"an answer's header line is longer than {limit} bytes")
            start = max(0, len(self.buf) - 1)
            if not self._fill():
                raise WireError("the API server closed the connection in the middle of an answer" if self.started
                                else "the API server closed the connection before answering")

    def answer(self) -> tuple[int, str, bytes, bool]:
        """(status, reason, body, whether the connection may carry another request)."""
        while True:
            status, reason, version, fields = self._head()
            if status >= 200 or status == 101:  # 1xx interim answers (never asked for) are skipped
                break
        if status == 101:
            raise WireError("the API server switched protocols, which was not asked for")
        coding = fields.get("content-encoding", "identity").strip().lower()
        if coding != "identity":
            raise WireError(f"the answer is encoded {coding!r}, which was not asked for")
        close = version == "HTTP/1.0" or "close" in fields.get("connection", "").lower()
        if status in (204, 304):
            return status, reason, b"", not close
        if "transfer-encoding" in fields:
            codings = [c.strip().lower() for c in fields["transfer-encoding"].split(",")]
            if codings != ["chunked"]:
                raise WireError(f"the answer's Transfer-Encoding {fields['transfer-encoding'][:80]!r} was not "
                                "asked for (only chunked is read)")
            # with a Content-Length beside it the framing is in doubt: read as chunked, then not used again
            return status, reason, self._chunked(), not close and "content-length" not in fields
        if "content-length" in fields:
            if not _DECIMAL.fullmatch(fields["content-length"]):
                raise WireError(f"Content-Length {fields['content-length'][:40]!r} is not a number")
            n = int(fields["content-length"])
            if not 0 <= n <= MAX_BODY:
                raise WireError(f"an answer of {n} bytes is over the limit of {MAX_BODY}")
            return status, reason, self._take(n), not close
        while self._fill():  # no length: the body ends with the connection
            if len(self.buf) > MAX_BODY:
                raise WireError(f"an answer is over the limit of {MAX_BODY} bytes")
        body, self.buf = bytes(self.buf), bytearray()
        return status, reason, body, False

    def _head(self) -> tuple[int, str, str, dict[str, str]]:
        first = self._line(MAX_HEAD)
        m = _STATUS.fullmatch(first)
        if m is None:
            raise WireError(f"the answer is not HTTP/1.x: {first[:80]!r}")
        used = len(first) + 2
        fields: dict[str, str] = {}
        while True:
            line = self._line(MAX_HEAD - used)
            used += len(line) + 2
            if used > MAX_HEAD:
                raise WireError(f"an answer's headers are longer than {MAX_HEAD} bytes")
            if not line:
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep or not name or name != name.strip():  # a folded line, or a space before the colon
                raise WireError(f"an answer's header line is not a field: {line[:80]!r}")
            key = name.strip().lower()
            fields[key] = f"{fields[key]}, {value.strip()}" if key in fields else value.strip()
        version = first[:8].decode("latin-1")
        return int(m.group(1)), (m.group(2) or b"").decode("latin-1"), version, fields

    def _chunked(self) -> bytes:
        out = bytearray()
        while True:
            size_line = self._line(1024).split(b";", 1)[0].strip()
            if not _HEX.fullmatch(size_line):
                raise WireError(f"a chunk size {size_line[:40]!r} is not hexadecimal")
            size = int(size_line, 16)
            if size == 0:
                break
            if len(out) + size > MAX_BODY:
                raise WireError(f"an answer is over the limit of {MAX_BODY} bytes")
            out += self._take(size)
            if self._take(2) != b"\r\n":
                raise WireError("a chunk does not end with CRLF")
        used = 0
        while True:  # trailers, then the empty line
            line = self._line(MAX_HEAD)
            used += len(line) + 2
            if not line:
                break
            if used > MAX_HEAD:
                raise WireError(f"an answer's trailers are longer than {MAX_HEAD} bytes")
        return bytes(out)
