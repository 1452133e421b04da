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
