"""The API server's single-object calls written and read without http.client (pyvgpu.cluster.api.wire):
the same requests, the answers' bodies and errors as before, every exchange bounded in time and size, a
connection used again only after a complete answer."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest
from fake_apiserver import node

from pyvgpu.cluster.api import wire
from pyvgpu.cluster.api.kube import Kube, KubeError, KubeUnreachable


def test_calls_go_through_wire_with_the_clients_headers(api, kube, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("http.client read an answer")

    monkeypatch.setattr(http.client.HTTPResponse, "begin", refuse)
    api.put_node(node("n1", {"a": "1"}))
    assert kube.get_node("n1")["metadata"]["annotations"] == {"a": "1"}
    kube.patch_node("n1", {"metadata": {"annotations": {"b": "2"}}})
    assert api.get_node("n1")["metadata"]["annotations"] == {"a": "1", "b": "2"}
    with api.cond:
        seen = [h for h in api.headers_seen if h[1] == "/api/v1/nodes/n1"]
    assert [(m, ctype) for m, _, _, ctype in seen] == [("GET", None), ("PATCH", "application/merge-patch+json")]
    assert seen[0][2] and seen[0][2].startswith("Bearer ") and seen[1][2] == seen[0][2]  # the credentials
    with pytest.raises(KubeError) as e:
        kube.get_node("missing")
    assert e.value.not_found and 'nodes "missing" not found' in str(e.value)
    # a conditional write on an old version is the API server's 409, as before
    with pytest.raises(KubeError) as e:
        kube.patch_node("n1", {"metadata": {"resourceVersion": "1", "annotations": {"c": "3"}}})
    assert e.value.conflict


class RawServer:
    """A server on localhost that answers each request with the bytes `answer(n)` gives (n: the request's
    number), then closes the connection when `close_after` says so."""

    def __init__(self, answer, close_after=lambda n: False) -> None:
        self.answer = answer
        self.close_after = close_after
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c: socket.socket) -> None:
        buf = b""
        with c:
            while True:
                while b"\r\n\r\n" not in buf:
                    got = c.recv(65536)
                    if not got:
                        return
                    buf += got
                head, _, buf = buf.partition(b"\r\n\r\n")
                lengths = [ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")]
                n = int(lengths[0]) if lengths else 0
                while len(buf) < n:
                    buf += c.recv(65536)
                buf = buf[n:]
                self.requests.append(head)
                k = len(self.requests)
                out = self.answer(k)
                if out is None:
                    time.sleep(30)
                    return
                c.sendall(out)
                if self.close_after(k):
                    return

    def kube(self, tmp_path, timeout: float = 5.0) -> Kube:
        cfg = tmp_path / "raw-kubeconfig.json"
        cfg.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "raw",
            "clusters": [{"name": "raw", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "raw", "user": {"token": "t0ken"}}],
            "contexts": [{"name": "raw", "context": {"cluster": "raw", "user": "raw"}}]}))
        return Kube(str(cfg), timeout=timeout)

    def close(self) -> None:
        self.sock.close()


def _ok(body: bytes, extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            .encode() + body)


NODE = json.dumps({"metadata": {"name": "n1"}}).encode()


def test_chunked_and_close_delimited_answers_are_read_whole(tmp_path):
    half = len(NODE) // 2
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x;ext=1\r\n%s\r\n%x\r\n%s\r\n0\r\nX-Trailer: y\r\n\r\n" % (half, NODE[:half], len(NODE) - half,
                                                                               NODE[half:]))
    answers = {1: chunked, 2: _ok(NODE), 3: b"HTTP/1.0 200 OK\r\n\r\n" + NODE}
    srv = RawServer(lambda n: answers.get(n, _ok(NODE)), close_after=lambda n: n == 3)
    try:
        kube = srv.kube(tmp_path)
        for _ in range(3):
            assert kube.get_node("n1") == {"metadata": {"name": "n1"}}
        assert srv.connections == 1  # one connection carried the three
        head = srv.requests[0].decode()
        assert head.startswith("GET /api/v1/nodes/n1 HTTP/1.1\r\n") and "authorization: bearer t0ken" in head.lower()
        assert f"Host: 127.0.0.1:{srv.port}" in head and "Accept: application/json" in head
        assert kube.get_node("n1") == {"metadata": {"name": "n1"}}  # the closed connection is replaced
        assert srv.connections == 2
    finally:
        srv.close()


def test_a_connection_the_server_closed_after_an_answer_is_not_used_again(tmp_path):
    srv = RawServer(lambda n: _ok(NODE, "Connection: close\r\n"), close_after=lambda n: True)
    try:
        kube = srv.kube(tmp_path)
        for _ in range(3):
            assert kube.get_node("n1")["metadata"]["name"] == "n1"
        assert srv.connections == 3
    finally:
        srv.close()


@pytest.mark.parametrize("answer, words", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\"", "closed the connection in the middle of an answer"),
    (b"", "closed the connection before answering"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not HTTP/1.x"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * (wire.MAX_HEAD + 10) + b"\r\n\r\n", "longer than"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (wire.MAX_BODY + 1), "over the limit"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}", "encoded 'gzip'"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not hexadecimal"),
    # numbers only in HTTP's own form (int() took these, a negative chunk size skipped the size check)
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\n{}\r\n0\r\n\r\n", "not hexadecimal"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n", "not hexadecimal"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}", "is not a number"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0_2\r\n\r\n{}", "is not a number"),
    (b"HTTP/1.1 \xb2\xb2\xb2 OK\r\nContent-Length: 2\r\n\r\n{}", "not HTTP/1.x"),  # digits, not ASCII ones
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "was not asked for"),
    (b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\n{}", "is not a field"),
])
def test_a_broken_answer_is_a_clear_unreachable_error(tmp_path, answer, words):
    srv = RawServer(lambda n: answer, close_after=lambda n: True)
    try:
        kube = srv.kube(tmp_path)
        with pytest.raises(KubeUnreachable) as e:
            kube.get_node("n1")
        assert str(e.value).startswith(f"get node n1: cannot reach the API server at http://127.0.0.1:{srv.port}")
        assert words in str(e.value)
    finally:
        srv.close()


def test_bytes_past_an_answers_end_are_never_read_as_the_next_answer(tmp_path):
    """An answer with more bytes than its Content-Length (or a body after a 204): the connection is not
    used again, so the extra bytes can never be taken for the next call's answer."""
    forged = json.dumps({"metadata": {"name": "forged"}}).encode()
    srv = RawServer(lambda n: _ok(NODE) + _ok(forged) if n == 1 else _ok(NODE))
    try:
        kube = srv.kube(tmp_path)
        assert kube.get_node("n1")["metadata"]["name"] == "n1"
        assert kube.get_node("n1")["metadata"]["name"] == "n1"
        assert srv.connections == 2
    finally:
        srv.close()


def test_a_close_between_header_lines_is_in_the_middle_of_an_answer(tmp_path):
    """The message says whether the API server had started answering: a request it may have carried out
    must never read as one it never saw."""
    srv = RawServer(lambda n: b"HTTP/1.1 200 OK\r\n", close_after=lambda n: True)
    try:
        with pytest.raises(KubeUnreachable) as e:
            srv.kube(tmp_path).get_node("n1")
        assert "in the middle of an answer" in str(e.value)
    finally:
        srv.close()


def test_cluster_wide_lists_are_not_read_by_wire(api, kube, monkeypatch):
    """The informer's lists (the whole cluster's nodes, pods, quotas) take longer than one call's deadline on
    a large cluster and can be larger than wire's bound: urllib3 reads them, with its limit per read."""
    def refuse(*a, **k):
        raise AssertionError("a cluster-wide list went through wire")

    api.put_node(node("n1", {"a": "1"}))
    monkeypatch.setattr(wire, "exchange", refuse)
    assert [n["metadata"]["name"] for n in kube.list_nodes()["items"]] == ["n1"]
    assert kube.list_pods()["items"] == []
    kube.list_quotas()
    with pytest.raises(AssertionError, match="through wire"):
        kube.list_pods(node="n1")  # one node's pods (a bind's fresh read) still do


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(tmp_path):
    srv = RawServer(lambda n: _ok(NODE))
    try:
        kube = srv.kube(tmp_path)
        kube._headers["User-Agent"] = "x\r\nX-Injected: 1"
        with pytest.raises(KubeUnreachable) as e:
            kube.get_node("n1")
        assert "User-Agent" in str(e.value) and "line break" in str(e.value) and srv.requests == []
    finally:
        srv.close()


def test_an_api_server_error_answer_keeps_its_status_and_message(tmp_path):
    body = json.dumps({"kind": "Status", "code": 503, "message": "etcd is unavailable"}).encode()
    srv = RawServer(lambda n: b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    try:
        with pytest.raises(KubeError) as e:
            srv.kube(tmp_path).patch_node("n1", {"metadata": {"annotations": {"a": None}}})
        assert e.value.status == 503 and str(e.value) == \
            "patch node n1: HTTP 503 Service Unavailable: etcd is unavailable"
    finally:
        srv.close()


def test_an_answer_that_never_comes_ends_at_the_timeout(tmp_path):
    # the server reads the request, then trickles nothing: the call's one deadline ends it
    srv = RawServer(lambda n: None)
    try:
        kube = srv.kube(tmp_path, timeout=0.5)
        t = time.monotonic()
        with pytest.raises(KubeUnreachable) as e:
            kube.get_node("n1")
        assert time.monotonic() - t < 5 and "timed out" in str(e.value)
    finally:
        srv.close()


def test_a_trickled_answer_ends_at_the_calls_deadline_not_per_read(tmp_path):
    # one byte every 0.1 s: each read is quick, the whole answer is not
    class Trickle(RawServer):
        def _conn(self, c):
            with c:
                c.recv(65536)
                try:
                    for b in _ok(b"x" * 100):
                        c.sendall(bytes([b]))
                        time.sleep(0.1)
                except OSError:
                    return

    srv = Trickle(lambda n: b"")
    try:
        kube = srv.kube(tmp_path, timeout=0.5)
        t = time.monotonic()
        with pytest.raises(KubeUnreachable) as e:
            kube.get_node("n1")
        assert time.monotonic() - t < 3 and "timed out" in str(e.value)
    finally:
        srv.close()


class TlsServer(RawServer):
    def __init__(self, answer, cert, key) -> None:
        import ssl

        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        super().__init__(answer)

    def _conn(self, c: socket.socket) -> None:
        try:
            t = self.ctx.wrap_socket(c, server_side=True)
        except OSError:
            c.close()
            return
        super()._conn(t)

    def kube_tls(self, tmp_path, ca) -> Kube:
        cfg = tmp_path / "tls-kubeconfig.json"
        cluster = {"server": f"https://127.0.0.1:{self.port}"}
        if ca is not None:
            cluster["certificate-authority"] = str(ca)
        cfg.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "tls",
            "clusters": [{"name": "tls", "cluster": cluster}],
            "users": [{"name": "tls", "user": {"token": "t0ken"}}],
            "contexts": [{"name": "tls", "context": {"cluster": "tls", "user": "tls"}}]}))
        return Kube(str(cfg), timeout=5)


def test_tls_through_the_clients_pool_verifies_the_server(tmp_path, tls_cert):
    # in a cluster the API server is https: the pool's connection makes the TLS handshake with the
    # kubeconfig's CA, and an untrusted server is refused before any request is written
    srv = TlsServer(lambda n: _ok(NODE), *tls_cert)
    try:
        kube = srv.kube_tls(tmp_path, tls_cert[0])
        assert kube.get_node("n1") == {"metadata": {"name": "n1"}}
        assert kube.get_node("n1") == {"metadata": {"name": "n1"}}
        assert srv.connections == 1 and len(srv.requests) == 2
        with pytest.raises(KubeUnreachable) as e:
            srv.kube_tls(tmp_path, None).get_node("n1")
        assert "CERTIFICATE_VERIFY_FAILED" in str(e.value) and len(srv.requests) == 2
        assert "certificate verify failed" in str(e.value)  # and why, as the client said before
    finally:
        srv.close()
