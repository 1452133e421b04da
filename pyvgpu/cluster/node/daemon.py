"""The long-running node processes: the device plugin (optionally with the node agent) and the node agent.

Each runs until SIGTERM or SIGINT, then stops its threads and exits 0. Bad options or a node where NVML
cannot be read exit 2 with a message naming the problem.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from pyvgpu.cluster.signals import stop_on_signals

log = logging.getLogger("pyvgpu.cluster")


def setup_logging(level: str = "info") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@dataclass
class NodeOptions:
    node: str
    split: int = 10
    resource: str = "nvidia.com/gpu"
    plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    kubeconfig: str | None = None
    state_dir: Path = Path("/run/pyvgpu")
    runtime_dirs: list[str] = field(default_factory=list)
    api_retry_s: float = 10.0
    api_timeout_s: float = 10.0
    health_interval: float = 5.0
    agent_interval: float = 30.0
    poll: float = 0.5
    with_agent: bool = False
    scheduler_names: tuple[str, ...] = ("pyvgpu-scheduler",)  # whose pods Allocate serves
    # HAMi's device-plugin config (its per-node entries: pyvgpu.cluster.node.nodeconfig); read if it exists
    node_config: Path | None = Path("/config/config.json")


def with_node_config(opts: NodeOptions):
    """The options with this node's entries of the device-plugin config applied (the split count), and the
    entries themselves (scaling, the GPUs filtered out)."""
    import dataclasses

    from pyvgpu.cluster.node import nodeconfig

    cfg = nodeconfig.load(opts.node_config, opts.node) if opts.node_config else nodeconfig.NodeConfig()
    if cfg.split is not None:
        opts = dataclasses.replace(opts, split=cfg.split)
    if cfg != nodeconfig.NodeConfig():
        log.info("node %s, %s: split %d, memory scaling %s, core scaling %s, GPUs filtered out: %s", opts.node,
                 opts.node_config, opts.split, cfg.memory_scaling or 1, cfg.core_scaling or 1,
                 sorted(cfg.filter_uuids) + sorted(cfg.filter_indexes) or "none")
    if (cfg.memory_scaling or 1) > 1:
        log.warning("devicememoryscaling %s registers more memory than the GPUs have: pods' limits together can "
                    "exceed it, and an allocation then fails with CUDA's out-of-memory (pyvgpu does not swap)",
                    cfg.memory_scaling)
    return opts, cfg


def _devices(opts: NodeOptions, cfg=None):
    from pyvgpu.cluster.node import gpus
    from pyvgpu.cluster.node.plugin import Devices

    found = gpus.inventory()
    if cfg is not None:
        out = [g for g in found if cfg.filtered(g.uuid, g.index)]
        for g in out:
            log.info("GPU %d %s: filtered out by the device plugin config (filterdevices)", g.index, g.uuid)
        found = [g for g in found if not cfg.filtered(g.uuid, g.index)]
    if not found:
        raise SystemExit("pyvgpu: NVML sees no GPU on this node; nothing to offer")
    for g in found:
        log.info("GPU %d %s: %s, %d MiB, NUMA node %d", g.index, g.uuid, g.name, g.memory_mib, g.numa)
    return Devices(found)


def _health_loop(devices, interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        try:
            devices.refresh()
        except Exception as e:  # keep watching: a failed probe is logged, not fatal
            log.error("health probe failed: %s", e)


def _agent(opts: NodeOptions, kube, devices, cfg=None):
    from pyvgpu.cluster.node import agent, nodestate

    return agent.NodeAgent(kube, opts.node, devices, nodestate.NodeState(opts.state_dir), opts.split,
                           opts.agent_interval, agent.pair_scores(devices.gpus),
                           memory_scaling=cfg.memory_scaling if cfg else None,
                           core_scaling=cfg.core_scaling if cfg else None)


def _inventory(devices, cfg=None):
    """The node's GPUs for Allocate's records: read now (MIG instances as they are, like Allocate's MIG
    lookup), else those read at the start; never one the device plugin config filters out."""
    from pyvgpu.cluster.node import gpus
    from pyvgpu.errors import PyvgpuError

    def read():
        try:
            found = gpus.inventory()
        except PyvgpuError:
            return devices.gpus
        return [g for g in found if cfg is None or not cfg.filtered(g.uuid, g.index)]

    return read


def device_plugin(opts: NodeOptions) -> None:
    from pyvgpu.cluster.api.kube import Kube
    from pyvgpu.cluster.node import nodestate, runtime
    from pyvgpu.cluster.node.allocate import AllocateConfig, Allocator
    from pyvgpu.cluster.node.plugin import DevicePluginService, PluginServer

    opts, cfg = with_node_config(opts)
    stop = stop_on_signals()
    state = nodestate.NodeState(opts.state_dir)
    state.ensure()
    rt = runtime.current(opts.runtime_dirs or None)  # the shim and the callbacks the package carries
    rt.check()
    devices = _devices(opts, cfg)
    kube = Kube(opts.kubeconfig, timeout=opts.api_timeout_s)
    allocator = Allocator(AllocateConfig(opts.node, state, rt, opts.api_retry_s,
                                         scheduler_names=opts.scheduler_names), kube,
                          lambda: devices.snapshot()[1], inventory=_inventory(devices, cfg))
    service = DevicePluginService(devices, opts.split, allocator, threading.Event())
    server = PluginServer(opts.plugin_dir, opts.resource, service, poll=opts.poll)
    threads = [threading.Thread(target=_health_loop, args=(devices, opts.health_interval, stop), daemon=True,
                                name="health")]
    if opts.with_agent:
        threads.append(threading.Thread(target=_agent(opts, kube, devices, cfg).run, args=(stop,), daemon=True,
                                        name="agent"))
    for t in threads:
        t.start()
    try:
        server.run(stop)
    finally:
        stop.set()
        with devices.cond:
            devices.cond.notify_all()
        for t in threads:
            t.join(timeout=5)


def node_agent(opts: NodeOptions) -> None:
    from pyvgpu.cluster.api.kube import Kube

    opts, cfg = with_node_config(opts)
    stop = stop_on_signals()
    devices = _devices(opts, cfg)
    kube = Kube(opts.kubeconfig, timeout=opts.api_timeout_s)
    a = _agent(opts, kube, devices, cfg)
    t = threading.Thread(target=_health_loop, args=(devices, opts.health_interval, stop), daemon=True)
    t.start()
    try:
        a.run(stop)
    finally:
        stop.set()
