"""The Kubernetes API as pyvgpu's cluster components use it: the official client returning plain dicts
(kube), the per-node lock annotation in HAMi's format (nodelock) and Events on pods (events).

Shared by both sides: the scheduler takes a node's lock at bind and the device plugin releases it once
Allocate has served the pod (HAMi's protocol), and both write Events.

May import: pyvgpu.cluster.core, pyvgpu.errors, pyvgpu.contract.envspec, the standard library and the kubernetes
client (imported inside the functions that call it). Never pyvgpu.cluster.scheduler or .node.
"""
