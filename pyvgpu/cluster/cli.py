"""`pyvgpu cluster ...`: the scheduling core on the command line.

Only typer is imported here; the core is imported inside the commands, so registering them costs
`pyvgpu wrap` nothing. Options that several commands take are declared once, below; details of each
option are in docs/cluster.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pyvgpu.cli.common import Choice, choice
from pyvgpu.contract import envspec

cluster_app = typer.Typer(help="The cluster half, HAMi-compatible: the scheduler extender and webhook, the device "
                               "plugin and node agent (deploy/helm/pyvgpu runs them), and 'why is my pod Pending?' "
                               "offline, from kubectl dumps.", no_args_is_help=True)

DEFAULT_SCHEDULER = "pyvgpu-scheduler"


class NodePolicy(Choice):
    """The default node policy (HAMi's hami.io/node-scheduler-policy values)."""

    binpack = "binpack"
    spread = "spread"


def _check_node_policy(text: str) -> str:
    from pyvgpu.errors import PyvgpuError

    if text not in (NodePolicy.binpack.value, NodePolicy.spread.value):
        raise PyvgpuError(f"--node-policy {text!r}: use binpack or spread")
    return text


class GpuPolicy(Choice):
    """A word of a GPU policy (HAMi's hami.io/gpu-scheduler-policy words, pyvgpu.cluster.core.keys)."""

    binpack = "binpack"
    spread = "spread"
    topology_aware = "topology-aware"
    mutex = "mutex"
    numa = "numa"


GPU_POLICY_FIX = "use spread, binpack, topology-aware, mutex or numa, or a comma list of them"


class GpuPolicies(str):
    """--gpu-policy: one GPU policy word or HAMi's comma list of them, checked to be GpuPolicy words. The text
    as given is what the cluster core reads (by HAMi's rules a comma makes a chain of sort keys); ``words``
    are its GpuPolicy members."""

    words: tuple[GpuPolicy, ...]

    def __new__(cls, text: str) -> GpuPolicies:
        from pyvgpu.errors import PyvgpuError

        try:
            words = tuple(GpuPolicy(t.strip()) for t in text.split(",") if t.strip())
        except ValueError:
            words = ()
        if not words:
            raise PyvgpuError(f"--gpu-policy {text!r}: {GPU_POLICY_FIX}")
        got = super().__new__(cls, text)
        got.words = words
        return got


DEFAULT_GPU_POLICY = GpuPolicies(GpuPolicy.spread.value)


def _parse_gpu_policy(text: str | GpuPolicies) -> GpuPolicies:
    return text if isinstance(text, GpuPolicies) else GpuPolicies(text)


def _complete_gpu_policy(incomplete: str) -> list[str]:
    """The words of a GPU policy, after the comma list's words already written."""
    done, _, word = incomplete.rpartition(",")
    return [f"{done},{w.value}" if done else w.value for w in GpuPolicy if w.value.startswith(word)]


# The options the scheduler and `explain` share, written once.
NodePolicyOption = Annotated[NodePolicy, choice(NodePolicy, "--node-policy", check=_check_node_policy,
                                                help="The default node policy (a pod's "
                                                     "hami.io/node-scheduler-policy wins).")]
# One word or a comma list of them (binpack,topology-aware): parsed into GpuPolicy words, completed word by word.
GpuPolicyOption = Annotated[GpuPolicies, typer.Option("--gpu-policy", metavar="POLICY[,POLICY...]",
                                                      parser=_parse_gpu_policy, autocompletion=_complete_gpu_policy,
                                                      help="The default GPU policy: spread, binpack, topology-aware, "
                                                           "mutex, numa or a comma list (a pod's "
                                                           "hami.io/gpu-scheduler-policy wins).")]
SchedulerName = Annotated[str, typer.Option("--scheduler-name", metavar="NAME",
                                            help="The scheduler's name: pods of this schedulerName are "
                                                 "pyvgpu's.")]
Kubeconfig = Annotated[Path | None, typer.Option("--kubeconfig", metavar="PATH",
                                                 help="Kubeconfig of the API server (default: in-cluster, else "
                                                      "~/.kube/config).")]
NodeName = Annotated[str | None, typer.Option("--node-name", metavar="NAME",
                                              help="This node's name (default: $NODE_NAME).")]
StateDir = Annotated[Path, typer.Option("--state-dir", metavar="DIR",
                                        help="The node's shared state: turn file and per-container regions.")]
Split = Annotated[int, typer.Option("--split", metavar="N",
                                    help="Virtual devices per GPU: how many containers may share one (HAMi's "
                                         "deviceSplitCount).")]
HealthInterval = Annotated[float, typer.Option("--health-interval", metavar="SECONDS",
                                               help="How often NVML is asked whether each GPU is healthy.")]
NodeConfigPath = Annotated[Path | None, typer.Option("--node-config", metavar="PATH",
                                                     help="HAMi's device-plugin config.json with this node's "
                                                          "settings (default: /config/config.json, where the chart "
                                                          "mounts it, if it is there).")]


def _load(path: Path, option: str):
    """A JSON or YAML document from a file ('-': stdin). Errors name the option and the file."""
    import json
    import sys

    from pyvgpu.cluster.core.errors import ClusterInputError

    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except OSError as e:
        raise ClusterInputError(f"{option} {path}", f"cannot read it: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ClusterInputError(f"{option} {path}", "not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ClusterInputError(f"{option} {path}", f"neither JSON nor YAML{where}: "
                                                    f"{getattr(e, 'problem', None) or e}") from None
    if len(docs) != 1:
        raise ClusterInputError(f"{option} {path}", f"holds {len(docs)} YAML documents; give exactly one")
    return docs[0]


@cluster_app.command()
def explain(
    nodes: Annotated[Path, typer.Option("--nodes", metavar="FILE",
                                        help="The nodes: `kubectl get nodes -o json` output (JSON or YAML).")],
    pods: Annotated[Path, typer.Option("--pods", metavar="FILE",
                                       help="The pods whose GPUs count: `kubectl get pods -A -o json` output.")],
    pod: Annotated[Path, typer.Option("--pod", metavar="FILE",
                                      help="The pod to place: one Pod manifest, YAML or JSON ('-' reads stdin).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (schema: docs/cluster.md).")] = False,
    node_policy: NodePolicyOption = NodePolicy.binpack,
    gpu_policy: GpuPolicyOption = DEFAULT_GPU_POLICY,
    scheduler_name: SchedulerName = DEFAULT_SCHEDULER,
    quotas: Annotated[Path | None, typer.Option("--quotas", metavar="FILE",
                                                help="Namespace GPU quotas: `kubectl get resourcequotas -A -o json` "
                                                     "output.")] = None,
    now: Annotated[str | None, typer.Option("--now", metavar="TIME",
                                            help="Judge node liveness (the handshake) at this time, RFC 3339 such as "
                                                 "2026-11-26T20:00:00Z (UTC without an offset); default: now.")] = None,
) -> None:
    """Where would the scheduler put POD, and why not elsewhere? Prints the decision, the annotations it would
    write, and per node: fits or not, its score, and which container, GPU and limit refused it.

    A node whose agent has not answered the scheduler's handshake for 60 s and lists no allocatable GPUs fits
    nothing, as in the running scheduler; --now fixes the time it is judged at.

    Exits 0 for valid input, whether or not a node fits; 2 with a message naming the field for invalid input.

    Example: pyvgpu cluster explain --nodes nodes.json --pods pods.json --pod pod.yaml
    """
    import json

    from pyvgpu.cluster.core import explain as render
    from pyvgpu.cluster.core.config import ClusterConfig
    from pyvgpu.cluster.core.decide import decide
    from pyvgpu.cluster.core.errors import ClusterInputError

    try:
        cfg = ClusterConfig(node_policy=node_policy.value, gpu_policy=str(gpu_policy),
                            scheduler_names=(scheduler_name,))
        docs = {}
        for option, path in (("--nodes", nodes), ("--pods", pods), ("--pod", pod), ("--quotas", quotas)):
            docs[option] = _load(path, option) if path is not None else None
        at = _liveness_time(now)
        the_pod = docs["--pod"]
        if isinstance(the_pod, dict) and isinstance(the_pod.get("items"), list) and len(the_pod["items"]) == 1:
            the_pod = the_pod["items"][0]
        try:
            decision = decide(docs["--nodes"], docs["--pods"], the_pod, cfg, quotas=docs["--quotas"],
                              dead=_dead_nodes(docs["--nodes"], at, cfg))
        except ClusterInputError as e:
            # Name the file the field is in: the lists' errors start with NodeList / PodList.
            option, path = (("--nodes", nodes) if e.field.startswith("NodeList") else
                            ("--pods", pods) if e.field.startswith("PodList") else
                            ("--quotas", quotas) if e.field.startswith("ResourceQuotaList") else ("--pod", pod))
            raise ClusterInputError(f"{option} {path}: {e.field}", e.detail) from None
    except ClusterInputError as e:
        typer.echo(f"pyvgpu: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(render.to_json(decision), indent=1) if as_json else render.to_text(decision))


def _liveness_time(now: str | None) -> float:
    """--now as seconds since the epoch (the current time when not given)."""
    import time
    from datetime import datetime, timezone

    from pyvgpu.cluster.core.errors import ClusterInputError

    if now is None:
        return time.time()
    try:
        at = datetime.fromisoformat(now.strip())
    except ValueError:
        raise ClusterInputError(f"--now {now}", "not an RFC 3339 time; write one such as 2026-11-26T20:00:00Z") \
            from None
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


def _dead_nodes(nodes, at: float, cfg) -> dict[str, str]:
    """The nodes the running scheduler takes for gone at `at` (pyvgpu.cluster.scheduler.liveness)."""
    from pyvgpu.cluster.core.usage import items
    from pyvgpu.cluster.scheduler.liveness import dead

    out = {}
    for n in items(nodes, "Node"):
        try:
            why = dead(n, at, resource=cfg.resources.count)
            if why:
                out[str((n.get("metadata") or {}).get("name") or "")] = why
        except (AttributeError, TypeError):  # a malformed node: the decision names its field
            continue
    return out


def _node_options(node_name: str | None, **kw):
    import os

    from pyvgpu.cluster.node.daemon import NodeOptions
    from pyvgpu.errors import PyvgpuError

    node = node_name or os.environ.get(envspec.NODE_NAME.name, "")
    if not node:
        raise PyvgpuError("--node-name: give this node's name (the DaemonSet passes spec.nodeName as NODE_NAME)")
    if kw.get("split", 1) < 1 or kw.get("split", 1) > 1000:
        raise PyvgpuError(f"--split {kw['split']}: give 1..1000 virtual devices per GPU (HAMi's default is 10)")
    for opt in ("api_retry_s", "health_interval", "agent_interval"):
        if opt in kw and not kw[opt] > 0:
            raise PyvgpuError(f"--{opt.replace('_s', '').replace('_', '-')} {kw[opt]}: give a positive number of "
                              "seconds")
    if kw.get("kubeconfig") is not None:
        kw["kubeconfig"] = str(kw["kubeconfig"])
    if "node_config" in kw and kw["node_config"] is None:
        del kw["node_config"]  # NodeOptions' default: the chart's path, read only where the file is there
    elif "node_config" in kw and not os.path.isfile(kw["node_config"]):
        # a path given on purpose that is not there would silently register every GPU unscaled: refuse it
        raise PyvgpuError(f"--node-config {kw['node_config']}: no such file; give the device-plugin config.json, "
                          "or leave the option out")
    return NodeOptions(node=node, **kw)


def _run_daemon(command: str, fn, opts_factory) -> None:
    from pyvgpu.cluster import extras
    from pyvgpu.cluster.node import daemon
    from pyvgpu.errors import PyvgpuError

    daemon.setup_logging()
    try:
        extras.require(command)
        fn(opts_factory())
    except (PyvgpuError, FileNotFoundError) as e:
        typer.echo(f"pyvgpu: {e}", err=True)
        raise typer.Exit(2) from None
    except ImportError as e:  # the extra's module is there but broken (a missing submodule): say the same
        msg = extras.from_import_error(command, e)
        if msg is None:
            raise
        typer.echo(f"pyvgpu: {msg}", err=True)
        raise typer.Exit(2) from None


@cluster_app.command("device-plugin")
def device_plugin(
    plugin_dir: Annotated[Path, typer.Option("--plugin-dir", metavar="DIR",
                                             help="The kubelet's device-plugin directory (kubelet.sock is "
                                                  "there).")] = Path("/var/lib/kubelet/device-plugins"),
    split: Split = 10,
    node_name: NodeName = None,
    resource: Annotated[str, typer.Option("--resource", metavar="NAME",
                                          help="The resource to serve.")] = "nvidia.com/gpu",
    kubeconfig: Kubeconfig = None,
    state_dir: StateDir = Path("/run/pyvgpu"),
    runtime_dir: Annotated[list[Path] | None, typer.Option("--runtime-dir", metavar="DIR",
                                                           help="A host directory of the pyvgpu runtime to mount "
                                                                "read-only into containers (repeatable).")] = None,
    api_retry: Annotated[float, typer.Option("--api-retry", metavar="SECONDS",
                                             help="How long Allocate keeps trying an unreachable API "
                                                  "server.")] = 10.0,
    health_interval: HealthInterval = 5.0,
    with_agent: Annotated[bool, typer.Option("--node-agent", help="Run the node agent in this process "
                                                                  "too.")] = False,
    agent_interval: Annotated[float, typer.Option("--agent-interval", metavar="SECONDS",
                                                  help="With --node-agent: how often it checks the registration "
                                                       "and reclaims regions.")] = 30.0,
    scheduler_names: Annotated[list[str] | None, typer.Option("--scheduler-name", metavar="NAME",
                                                              help="A scheduler whose pods Allocate serves "
                                                                   "(repeatable; default pyvgpu-scheduler).")] = None,
    node_config: NodeConfigPath = None,
) -> None:
    """Serve the kubelet's device-plugin API (v1beta1): split x GPUs virtual devices with NVML health, and
    Allocate, which gives each container its GPUs, limits, region and the shim (HAMi's environment)."""
    from pyvgpu.cluster.node import daemon

    _run_daemon("device-plugin", daemon.device_plugin, lambda: _node_options(
        node_name, split=split, resource=resource, plugin_dir=plugin_dir, kubeconfig=kubeconfig,
        state_dir=state_dir, runtime_dirs=[str(d) for d in runtime_dir or []], api_retry_s=api_retry,
        health_interval=health_interval, agent_interval=agent_interval, with_agent=with_agent,
        scheduler_names=tuple(scheduler_names or (DEFAULT_SCHEDULER,)), node_config=node_config))


@cluster_app.command("node-agent")
def node_agent(
    node_name: NodeName = None,
    split: Split = 10,
    kubeconfig: Kubeconfig = None,
    state_dir: StateDir = Path("/run/pyvgpu"),
    interval: Annotated[float, typer.Option("--interval", metavar="SECONDS",
                                            help="How often the registration is checked and regions "
                                                 "reclaimed.")] = 30.0,
    health_interval: HealthInterval = 5.0,
    node_config: NodeConfigPath = None,
) -> None:
    """Register this node's GPUs (hami.io/node-nvidia-register, -score, -handshake), own the node's shared
    state, and reclaim the regions of deleted pods."""
    from pyvgpu.cluster.node import daemon

    _run_daemon("node-agent", daemon.node_agent, lambda: _node_options(
        node_name, split=split, kubeconfig=kubeconfig, state_dir=state_dir, agent_interval=interval,
        health_interval=health_interval, node_config=node_config))


def _leader_lease(text: str | None) -> tuple[str, str] | None:
    """--leader-lease NAMESPACE/NAME as (namespace, name); None: this replica is the only one."""
    from pyvgpu.errors import PyvgpuError

    if text is None:
        return None
    import re

    parts = text.split("/")
    # A namespace is a DNS label, a Lease's name a DNS subdomain: a name the API server cannot hold would
    # only ever read as "no Lease", and the replica would never lead.
    if len(parts) != 2 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", parts[0]) \
            or not re.fullmatch(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?", parts[1]):
        raise PyvgpuError(f"--leader-lease {text!r}: give the Lease as NAMESPACE/NAME in lower case (the chart "
                          "passes <release namespace>/kube-scheduler)")
    return parts[0], parts[1]


@cluster_app.command("scheduler")
def scheduler(
    port: Annotated[int, typer.Option("--port", metavar="P",
                                      help="HTTP port of the extender verbs, /webhook, /healthz, /readyz and "
                                           "/metrics.")],
    kubeconfig: Kubeconfig = None,
    name: SchedulerName = DEFAULT_SCHEDULER,
    node_policy: NodePolicyOption = NodePolicy.binpack,
    gpu_policy: GpuPolicyOption = DEFAULT_GPU_POLICY,
    lock_expire: Annotated[float, typer.Option("--lock-expire", metavar="SECONDS",
                                               help="Age after which a node lock (hami.io/mutex.lock) is taken "
                                                    "over.")] = 300.0,
    webhook_port: Annotated[int | None, typer.Option("--webhook-port", metavar="P",
                                                     help="Also serve everything over HTTPS on this port (needs "
                                                          "--tls-cert-file and --tls-key-file).")] = None,
    tls_cert: Annotated[Path | None, typer.Option("--tls-cert-file", metavar="PATH",
                                                  help="PEM certificate for --webhook-port.")] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key-file", metavar="PATH",
                                                 help="PEM key for --webhook-port.")] = None,
    address: Annotated[str, typer.Option("--address", metavar="IP",
                                         help="Address of --port; any but localhost needs "
                                              "--token-file.")] = "127.0.0.1",
    token_file: Annotated[Path | None, typer.Option("--token-file", metavar="PATH",
                                                    help="A bearer token (16+ characters) that callers beyond "
                                                         "localhost must give.")] = None,
    client_ca: Annotated[Path | None, typer.Option("--client-ca-file", metavar="PATH",
                                                   help="PEM CA whose client certificates may call the extender "
                                                        "verbs on --webhook-port.")] = None,
    annotation_writers: Annotated[list[str] | None, typer.Option("--annotation-writer", metavar="USER",
                                                                 help="A user the webhook lets write the hami.io "
                                                                      "allocation annotations "
                                                                      "(repeatable).")] = None,
    leader_lease: Annotated[str | None, typer.Option("--leader-lease", metavar="NAMESPACE/NAME",
                                                     help="The Lease the replicas' kube-schedulers elect their "
                                                          "leader with; only the holder's extender asks the nodes "
                                                          "for their handshake.")] = None,
) -> None:
    """Run the kube-scheduler extender (filter, prioritize, bind) and the mutating webhook that sends GPU pods
    to it. kube-scheduler's KubeSchedulerConfiguration names it (deploy/helm/pyvgpu)."""
    import os

    from pyvgpu.cluster import extras
    from pyvgpu.cluster.core.config import ClusterConfig
    from pyvgpu.cluster.node import daemon
    from pyvgpu.errors import PyvgpuError

    daemon.setup_logging()
    try:
        extras.require("scheduler", {"kubernetes": "kubernetes"})
        if not 0 < port < 65536:
            raise PyvgpuError(f"--port {port}: give a TCP port 1..65535")
        lease = _leader_lease(leader_lease)
        if lock_expire <= 0:
            raise PyvgpuError(f"--lock-expire {lock_expire}: give a positive number of seconds")
        if webhook_port is not None and not (tls_cert and tls_key):
            raise PyvgpuError("--webhook-port needs --tls-cert-file and --tls-key-file (webhooks are called over TLS)")
        for opt, path in (("--tls-cert-file", tls_cert), ("--tls-key-file", tls_key), ("--token-file", token_file),
                          ("--client-ca-file", client_ca)):
            if path and not os.path.isfile(path):
                raise PyvgpuError(f"{opt} {path}: no such file")
        from pyvgpu.cluster.scheduler import extender_server

        cfg = ClusterConfig(node_policy=node_policy.value, gpu_policy=str(gpu_policy), scheduler_names=(name,))

        def text(p: Path | None) -> str | None:
            return None if p is None else str(p)

        extender_server.run(text(kubeconfig), port, name, cfg, lock_expire, webhook_port, text(tls_cert),
                            text(tls_key), address, text(token_file), text(client_ca),
                            tuple(annotation_writers or ()), leader_lease=lease)
    except (PyvgpuError, OSError, ValueError) as e:
        typer.echo(f"pyvgpu: {e}", err=True)
        raise typer.Exit(2) from None
