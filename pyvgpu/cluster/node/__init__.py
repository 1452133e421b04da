"""The node side: `pyvgpu cluster device-plugin` and `pyvgpu cluster node-agent`.

Owns the kubelet's device-plugin API over gRPC (plugin, and the stubs in deviceplugin/), Allocate
(allocate), the node agent's registration and handshake (agent), the long-running processes (daemon), the
node's GPUs through NVML (gpus), the node's shared state on disk (nodestate), what a container needs to
run under the shim (runtime) and what Allocate gave each container (records).

May import: pyvgpu.cluster.core, pyvgpu.cluster.api, pyvgpu.cluster.signals, pyvgpu's node-local layers
(limits, region, safe files, layout, envspec, the shim's paths), the standard library and grpc. Never
pyvgpu.cluster.scheduler.
"""
