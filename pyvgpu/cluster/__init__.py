"""The cluster half: a HAMi-compatible scheduling core (docs/cluster.md).

Pure, deterministic and apart from transport: it reads Kubernetes objects as
plain dicts (what `kubectl get -o json` prints) and returns dataclasses.

    from pyvgpu.cluster.decide import decide
    decision = decide(nodes, pods, pod)          # NodeList/PodList dicts (or lists), one pod dict

Nothing is imported here, so `pyvgpu wrap` (whose CLI registers the `cluster`
commands) pays nothing for this package. docs/cluster.md describes the model.
"""
