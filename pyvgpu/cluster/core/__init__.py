"""The scheduling core: one pod, every node, one answer (docs/cluster.md), pure and deterministic.

Owns HAMi's wire names (keys), the data model, the annotation codec, the configuration, reading a pod's
request, each node's usage, device fit, scores, policies, placing a pod, the decision pipeline (decide),
its rendering for people and scripts (explain) and namespace GPU quotas.

May import: the standard library, pyvgpu.errors and its own modules. Never pyvgpu.cluster.api,
.scheduler or .node, nor a transport library (kubernetes, grpc, urllib3, http, socket, ssl,
prometheus_client): it reads Kubernetes objects as plain dicts and reads no clock and no network, so the
same input gives the same answer in `pyvgpu cluster explain`, in the tests and in the scheduler.
"""
