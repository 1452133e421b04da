"""`pyvgpu cluster ...`: the scheduling core on the command line.

Only typer is imported here; the core is imported inside the commands, so registering them costs
`pyvgpu wrap` nothing.
"""

from __future__ import annotations

import typer

from pyvgpu import envspec

cluster_app = typer.Typer(help="The cluster half, HAMi-compatible: the scheduler extender and webhook, the device "
                               "plugin and node agent (deploy/helm/pyvgpu runs them), and 'why is my pod Pending?' "
                               "offline, from kubectl dumps.", no_args_is_help=True)


def _load(path: str, option: str):
    """A JSON or YAML document from a file ('-': stdin). Errors name the option and the file."""
    import json
    import sys

    from pyvgpu.cluster.core.errors import ClusterInputError

    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
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
    nodes: str = typer.Option(..., "--nodes", metavar="FILE",
                              help="The nodes: `kubectl get nodes -o json` output (a NodeList; JSON or YAML)."),
    pods: str = typer.Option(..., "--pods", metavar="FILE",
                             help="The pods whose GPUs count: `kubectl get pods -A -o json` output (a PodList)."),
    pod: str = typer.Option(..., "--pod", metavar="FILE",
                            help="The pod to place: one Pod manifest, YAML or JSON ('-' reads stdin)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: {node, annotations, nodes: [{name, fits, score, "
                                                       "reason}], ...} (docs/cluster.md)."),
    node_policy: str = typer.Option("binpack", "--node-policy", metavar="binpack|spread",
                                    help="The scheduler's default node policy (a pod's "
                                         "hami.io/node-scheduler-policy overrides it)."),
    gpu_policy: str = typer.Option("spread", "--gpu-policy", metavar="POLICY",
                                   help="The scheduler's default GPU policy: spread, binpack, topology-aware, mutex, "
                                        "numa or a comma list such as binpack,topology-aware (a pod's "
                                        "hami.io/gpu-scheduler-policy overrides it)."),
    scheduler_name: str = typer.Option("pyvgpu-scheduler", "--scheduler-name", metavar="NAME",
                                       help="Pods of this schedulerName count on their nodes; others carry no "
                                            "allocation pyvgpu trusts."),
    quotas: str = typer.Option(None, "--quotas", metavar="FILE",
                               help="Namespace GPU quotas: `kubectl get resourcequotas -A -o json` output "
                                    "(limits.nvidia.com/gpumem and gpucores count)."),
) -> None:
    """Where would the scheduler put POD, and why not elsewhere? Prints the decision, the annotations it would
    write, and per node: fits or not, its score, and which container, GPU and limit refused it.

    Exits 0 for valid input, whether or not a node fits; 2 with a message naming the field for invalid input.

    Example: pyvgpu cluster explain --nodes nodes.json --pods pods.json --pod pod.yaml
    """
    import json

    from pyvgpu.cluster.core import explain as render
    from pyvgpu.cluster.core.config import ClusterConfig
    from pyvgpu.cluster.core.decide import decide
    from pyvgpu.cluster.core.errors import ClusterInputError

    try:
        if node_policy not in ("binpack", "spread"):
            raise ClusterInputError("--node-policy", f"{node_policy!r}: use binpack or spread")
        if not _gpu_policy_ok(gpu_policy):
            raise ClusterInputError("--gpu-policy", f"{gpu_policy!r}: use spread, binpack, topology-aware, mutex or "
                                                    "numa, or a comma list of them")
        cfg = ClusterConfig(node_policy=node_policy, gpu_policy=gpu_policy, scheduler_names=(scheduler_name,))
        docs = {}
        for option, path in (("--nodes", nodes), ("--pods", pods), ("--pod", pod), ("--quotas", quotas)):
            docs[option] = _load(path, option) if path is not None else None
        the_pod = docs["--pod"]
        if isinstance(the_pod, dict) and isinstance(the_pod.get("items"), list) and len(the_pod["items"]) == 1:
            the_pod = the_pod["items"][0]
        try:
            decision = decide(docs["--nodes"], docs["--pods"], the_pod, cfg, quotas=docs["--quotas"])
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



def _gpu_policy_ok(policy: str) -> bool:
    """A default GPU policy as a pod's annotation may give it (pyvgpu.cluster.core.request.gpu_policy_of)."""
    from pyvgpu.cluster.core.errors import ClusterInputError
    from pyvgpu.cluster.core.request import gpu_policy_of

    try:
        gpu_policy_of(policy, "--gpu-policy")
    except ClusterInputError:
        return False
    return bool(policy.strip())


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
    from pathlib import Path

    for opt in ("plugin_dir", "state_dir"):
        if opt in kw:
            kw[opt] = Path(kw[opt])
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
    plugin_dir: str = typer.Option("/var/lib/kubelet/device-plugins", "--plugin-dir", metavar="DIR",
                                   help="The kubelet's device-plugin directory (kubelet.sock is there)."),
    split: int = typer.Option(10, "--split", metavar="N", help="Virtual devices per GPU: how many containers may "
                                                                "share one (HAMi's deviceSplitCount)."),
    node_name: str = typer.Option(None, "--node-name", metavar="NAME", help="This node's name (default: "
                                                                             "$NODE_NAME)."),
    resource: str = typer.Option("nvidia.com/gpu", "--resource", metavar="NAME", help="The resource to serve."),
    kubeconfig: str = typer.Option(None, "--kubeconfig", metavar="PATH", help="Kubeconfig of the API server "
                                                                              "(default: in-cluster, else "
                                                                              "~/.kube/config)."),
    state_dir: str = typer.Option("/run/pyvgpu", "--state-dir", metavar="DIR",
                                  help="The node's shared state: turn file and per-container regions."),
    runtime_dir: list[str] = typer.Option(None, "--runtime-dir", metavar="DIR",
                                          help="A host directory of the pyvgpu runtime to mount read-only into "
                                               "containers at the same path (repeatable; default: this "
                                               "installation's Python, pyvgpu and callback cache)."),
    api_retry: float = typer.Option(10.0, "--api-retry", metavar="SECONDS",
                                    help="How long Allocate keeps trying an unreachable API server."),
    health_interval: float = typer.Option(5.0, "--health-interval", metavar="SECONDS",
                                          help="How often NVML is asked whether each GPU is healthy."),
    with_agent: bool = typer.Option(False, "--node-agent", help="Run the node agent in this process too."),
    agent_interval: float = typer.Option(30.0, "--agent-interval", metavar="SECONDS",
                                         help="With --node-agent: how often it checks the node's registration "
                                              "and reclaims regions."),
    scheduler_names: list[str] = typer.Option(None, "--scheduler-name", metavar="NAME",
                                              help="A scheduler whose pods Allocate serves (spec.schedulerName; "
                                                   "default pyvgpu-scheduler; repeatable, e.g. with "
                                                   "hami-scheduler while moving from HAMi). A pod any other "
                                                   "scheduler placed gets no GPU: its annotations are not "
                                                   "pyvgpu's."),
) -> None:
    """Serve the kubelet's device-plugin API (v1beta1): split x GPUs virtual devices with NVML health, and
    Allocate, which gives each container its GPUs, limits, region and the shim (HAMi's environment)."""
    from pyvgpu.cluster.node import daemon

    _run_daemon("device-plugin", daemon.device_plugin, lambda: _node_options(
        node_name, split=split, resource=resource, plugin_dir=plugin_dir, kubeconfig=kubeconfig,
        state_dir=state_dir, runtime_dirs=list(runtime_dir or []), api_retry_s=api_retry,
        health_interval=health_interval, agent_interval=agent_interval, with_agent=with_agent,
        scheduler_names=tuple(scheduler_names or ("pyvgpu-scheduler",))))


@cluster_app.command("node-agent")
def node_agent(
    node_name: str = typer.Option(None, "--node-name", metavar="NAME", help="This node's name (default: "
                                                                             "$NODE_NAME)."),
    split: int = typer.Option(10, "--split", metavar="N", help="vGPU slots per GPU to register (count)."),
    kubeconfig: str = typer.Option(None, "--kubeconfig", metavar="PATH", help="Kubeconfig of the API server."),
    state_dir: str = typer.Option("/run/pyvgpu", "--state-dir", metavar="DIR",
                                  help="The node's shared state: turn file and per-container regions."),
    interval: float = typer.Option(30.0, "--interval", metavar="SECONDS",
                                   help="How often the registration is checked and regions reclaimed."),
    health_interval: float = typer.Option(5.0, "--health-interval", metavar="SECONDS",
                                          help="How often NVML is asked whether each GPU is healthy."),
) -> None:
    """Register this node's GPUs (hami.io/node-nvidia-register, -score, -handshake), own the node's shared
    state, and reclaim the regions of deleted pods."""
    from pyvgpu.cluster.node import daemon

    _run_daemon("node-agent", daemon.node_agent, lambda: _node_options(
        node_name, split=split, kubeconfig=kubeconfig, state_dir=state_dir, agent_interval=interval,
        health_interval=health_interval))


@cluster_app.command("scheduler")
def scheduler(
    port: int = typer.Option(..., "--port", metavar="P", help="HTTP port of the extender verbs (/filter, "
                                                              "/prioritize, /bind), /webhook, /healthz, /readyz "
                                                              "and /metrics."),
    kubeconfig: str = typer.Option(None, "--kubeconfig", metavar="PATH", help="Kubeconfig of the API server "
                                                                              "(default: in-cluster, else "
                                                                              "~/.kube/config)."),
    name: str = typer.Option("pyvgpu-scheduler", "--scheduler-name", metavar="NAME",
                             help="The schedulerName the webhook gives GPU pods (kube-scheduler's profile)."),
    node_policy: str = typer.Option("binpack", "--node-policy", metavar="binpack|spread",
                                    help="Default node policy (a pod's hami.io/node-scheduler-policy wins)."),
    gpu_policy: str = typer.Option("spread", "--gpu-policy", metavar="POLICY",
                                   help="Default GPU policy: spread, binpack, topology-aware, mutex, numa or a "
                                        "comma list (a pod's hami.io/gpu-scheduler-policy wins)."),
    lock_expire: float = typer.Option(300.0, "--lock-expire", metavar="SECONDS",
                                      help="Age after which a node lock (hami.io/mutex.lock) is taken over "
                                           "(HAMi's default: 300)."),
    webhook_port: int = typer.Option(None, "--webhook-port", metavar="P",
                                     help="Also serve everything over HTTPS on this port (the API server calls "
                                          "webhooks over TLS only); needs --tls-cert-file and --tls-key-file."),
    tls_cert: str = typer.Option(None, "--tls-cert-file", metavar="PATH", help="PEM certificate for --webhook-port."),
    tls_key: str = typer.Option(None, "--tls-key-file", metavar="PATH", help="PEM key for --webhook-port."),
    address: str = typer.Option("127.0.0.1", "--address", metavar="IP",
                                help="Address of --port. kube-scheduler calls the extender on localhost; any "
                                     "other address needs --token-file."),
    token_file: str = typer.Option(None, "--token-file", metavar="PATH",
                                   help="A bearer token (16+ characters) that lets callers beyond localhost use "
                                        "/filter, /prioritize and /bind, on --port or --webhook-port."),
    client_ca: str = typer.Option(None, "--client-ca-file", metavar="PATH",
                                  help="PEM CA: on --webhook-port, a client certificate it signed may call the "
                                       "extender verbs (kube-scheduler's extender tlsConfig)."),
    annotation_writers: list[str] = typer.Option(None, "--annotation-writer", metavar="USER",
                                                 help="A user (system:serviceaccount:NS:NAME) the webhook lets "
                                                      "write the hami.io allocation annotations; give the "
                                                      "scheduler's and the node agent's. Repeatable."),
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
        if node_policy not in ("binpack", "spread"):
            raise PyvgpuError(f"--node-policy {node_policy!r}: use binpack or spread")
        if not _gpu_policy_ok(gpu_policy):
            raise PyvgpuError(f"--gpu-policy {gpu_policy!r}: use spread, binpack, topology-aware, mutex or numa, or "
                              "a comma list of them")
        if lock_expire <= 0:
            raise PyvgpuError(f"--lock-expire {lock_expire}: give a positive number of seconds")
        if webhook_port is not None and not (tls_cert and tls_key):
            raise PyvgpuError("--webhook-port needs --tls-cert-file and --tls-key-file (webhooks are called over TLS)")
        for opt, path in (("--tls-cert-file", tls_cert), ("--tls-key-file", tls_key), ("--token-file", token_file),
                          ("--client-ca-file", client_ca)):
            if path and not os.path.isfile(path):
                raise PyvgpuError(f"{opt} {path}: no such file")
        from pyvgpu.cluster.scheduler import extender_server

        cfg = ClusterConfig(node_policy=node_policy, gpu_policy=gpu_policy, scheduler_names=(name,))
        extender_server.run(kubeconfig, port, name, cfg,
                     lock_expire, webhook_port, tls_cert, tls_key, address, token_file, client_ca,
                     tuple(annotation_writers or ()))
    except (PyvgpuError, OSError, ValueError) as e:
        typer.echo(f"pyvgpu: {e}", err=True)
        raise typer.Exit(2) from None
