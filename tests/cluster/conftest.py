"""Fixtures for the Kubernetes-facing tests: a test API server and the production client on it."""

from __future__ import annotations

import pytest
from fake_apiserver import FakeApiServer


@pytest.fixture
def api():
    server = FakeApiServer().start()
    yield server
    server.stop()
    assert server.unexpected == [], f"the code under test called what the test API server does not serve: " \
                                    f"{server.unexpected}"


@pytest.fixture
def kubeconfig(api, tmp_path):
    return api.kubeconfig(tmp_path / "kubeconfig.json")


@pytest.fixture
def kube(kubeconfig):
    from pyvgpu.cluster.api.kube import Kube

    return Kube(str(kubeconfig), timeout=5)


@pytest.fixture
def tls_cert(tmp_path):
    """A self-signed certificate and key for 127.0.0.1 (the openssl command makes them)."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key
