"""`pyvgpu cluster ...`: the scheduling core on the command line.

Only typer is imported here; the core is imported inside the commands, so registering them costs
`pyvgpu wrap` nothing.
"""

from __future__ import annotations

import typer

cluster_app = typer.Typer(help="The cluster half (HAMi-compatible scheduling): answer 'why is my pod Pending?' "
                               "offline, from kubectl dumps.", no_args_is_help=True)


def _load(path: str, option: str):
    """A JSON or YAML document from a file ('-': stdin). Errors name the option and the file."""
    import json
    import sys

    from pyvgpu.cluster.errors import ClusterInputError

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
    gpu_policy: str = typer.Option("spread", "--gpu-policy", metavar="spread|binpack|topology-aware",
                                   help="The scheduler's default GPU policy (a pod's hami.io/gpu-scheduler-policy "
                                        "overrides it)."),
) -> None:
    """Where would the scheduler put POD, and why not elsewhere? Prints the decision, the annotations it would
    write, and per node: fits or not, its score, and which container, GPU and limit refused it.

    Exits 0 for valid input, whether or not a node fits; 2 with a message naming the field for invalid input.

    Example: pyvgpu cluster explain --nodes nodes.json --pods pods.json --pod pod.yaml
    """
    import json

    from pyvgpu.cluster import explain as render
    from pyvgpu.cluster.config import ClusterConfig
    from pyvgpu.cluster.decide import decide
    from pyvgpu.cluster.errors import ClusterInputError

    try:
        if node_policy not in ("binpack", "spread"):
            raise ClusterInputError("--node-policy", f"{node_policy!r}: use binpack or spread")
        if gpu_policy not in ("binpack", "spread", "topology-aware"):
            raise ClusterInputError("--gpu-policy", f"{gpu_policy!r}: use spread, binpack or topology-aware")
        cfg = ClusterConfig(node_policy=node_policy, gpu_policy=gpu_policy)
        docs = {}
        for option, path in (("--nodes", nodes), ("--pods", pods), ("--pod", pod)):
            docs[option] = _load(path, option)
        the_pod = docs["--pod"]
        if isinstance(the_pod, dict) and isinstance(the_pod.get("items"), list) and len(the_pod["items"]) == 1:
            the_pod = the_pod["items"][0]
        try:
            decision = decide(docs["--nodes"], docs["--pods"], the_pod, cfg)
        except ClusterInputError as e:
            # Name the file the field is in: the lists' errors start with NodeList / PodList.
            option, path = (("--nodes", nodes) if e.field.startswith("NodeList") else
                            ("--pods", pods) if e.field.startswith("PodList") else ("--pod", pod))
            raise ClusterInputError(f"{option} {path}: {e.field}", e.detail) from None
    except ClusterInputError as e:
        typer.echo(f"pyvgpu: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(render.to_json(decision), indent=1) if as_json else render.to_text(decision))

