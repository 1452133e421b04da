"""`pyvgpu cluster scheduler`: the kube-scheduler extender and what serves it.

Owns the extender's verbs (filter, prioritize, bind; extender), its HTTP(S) server and `run()`
(extender_server), the bounded listener and who may call what (httpserve), the cache of nodes and pods
(informer), the allocations promised in flight (inflight), the rankings kept for prioritize (recent), node
liveness through the handshake (liveness), the admission webhook (webhook) and the usage metrics
(usage_metrics). Several replicas are kube-scheduler's own leader election (the chart), not code here.

May import: pyvgpu.cluster.core, pyvgpu.cluster.api, pyvgpu.cluster.signals, pyvgpu.errors, the standard
library, the kubernetes client and prometheus_client. Never pyvgpu.cluster.node.
"""
