"""The cluster half: a HAMi-compatible scheduler and node side (docs/cluster.md), in four layers.

    core/       the scheduling core: pure and deterministic, Kubernetes objects as plain dicts in,
                dataclasses out (what `pyvgpu cluster explain` runs)
    api/        the Kubernetes API as both sides use it: the official client, the node lock, Events
    scheduler/  `pyvgpu cluster scheduler`: the kube-scheduler extender, its cache, its HTTP server
    node/       `pyvgpu cluster device-plugin` and `node-agent`: the kubelet's gRPC API, Allocate, NVML

    from pyvgpu.cluster.core.decide import decide
    decision = decide(nodes, pods, pod)          # NodeList/PodList dicts (or lists), one pod dict

Here beside them: cli.py (the `pyvgpu cluster` commands, which may import every layer), extras.py (the
cluster extra's dependencies) and signals.py (stopping a long-running command). Each layer's __init__
says what it may import; tests/cluster/test_layers.py holds them to it. Nothing is imported here, so
`pyvgpu wrap` (whose CLI registers the `cluster` commands) pays nothing for this package.
"""
