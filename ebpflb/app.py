"""Wires the parts of a running agent together and takes them apart again.

Leaving `run` (SIGINT/SIGTERM) closes this process's handles only: programs stay
attached and maps pinned, so traffic keeps flowing while the agent restarts. Removing the
datapath is `ebpflb cleanup`'s job.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Protocol

from prometheus_client import CollectorRegistry, start_http_server

from ebpflb.agent import Agent
from ebpflb.config import Config
from ebpflb.datapath import loader, netdev
from ebpflb.datapath.kernel import KernelMapSet
from ebpflb.datapath.mounts import cgroup2_root
from ebpflb.desired import NodeView
from ebpflb.errors import ConfigError
from ebpflb.healthcheck import HealthCheckServers
from ebpflb.metrics import DatapathCollector, Metrics, SourceCollector
from ebpflb.sources.base import ObjectSink
from ebpflb.sources.manifests import ManifestSource

log = logging.getLogger(__name__)


class Source(Protocol):
    """What app.run needs of a source: start delivering, stop, report its counters."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def counters(self) -> dict[str, dict[str, int]]: ...


SourceFactory = Callable[[ObjectSink], Source]


def manifest_source(path: Path) -> SourceFactory:
    return lambda sink: ManifestSource(path, sink)


def kubernetes_source(kubeconfig: Path | None = None) -> SourceFactory:
    """The API server from `kubeconfig`, else in-cluster. The configuration is read now, so
    a bad one fails before the datapath is compiled."""
    # Imported here: `kubernetes` is a heavy import that --manifests runs do not need.
    from ebpflb.sources.kubernetes import KubernetesSource, api_config

    api = api_config(kubeconfig=kubeconfig)
    return lambda sink: KubernetesSource(sink, api)


def _serve_metrics(address: str, registry: CollectorRegistry) -> None:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ConfigError(f"metrics-bind-address {address!r} is not HOST:PORT")
    start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
    log.info("serving metrics on http://%s/metrics", address)


def run(config: Config, source_factory: SourceFactory, stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()
    cgroup = config.cgroup_dir or cgroup2_root()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info(
            "received %s: leaving the datapath in place and exiting", signal.Signals(signum).name
        )
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    features = loader.probe_features()
    interfaces = netdev.interfaces(config.interfaces) if config.interfaces != () else []
    socket_lb = loader.SocketLB(config, features)
    nodeport = loader.NodePortLB(config, features) if interfaces else None
    health = HealthCheckServers()
    try:
        socket_lb.attach(cgroup)
        log.info("socket-LB attached to cgroup %s; maps pinned under %s", cgroup, config.bpffs_dir)
        with KernelMapSet(config.bpffs_dir) as maps:
            maps.set_interface_addresses(
                {i.index: i.addresses[0] for i in interfaces if i.addresses}
            )
            if nodeport is not None:
                nodeport.attach(interfaces)
            registry = CollectorRegistry()
            metrics = Metrics(registry)
            registry.register(DatapathCollector(maps.counters))
            for pinned, info in maps.map_infos().items():
                metrics.map_capacity.labels(pinned).set(info.max_entries)
            if config.metrics_bind_address:
                _serve_metrics(config.metrics_bind_address, registry)
            node = NodeView(config.node_name, tuple(a for i in interfaces for a in i.addresses))
            agent = Agent(
                config, maps, metrics, node=node, health=health, housekeeping=maps.expire_flows
            )
            source = source_factory(agent)
            registry.register(SourceCollector(source.counters))
            source.start()
            try:

                def wake_on_stop() -> None:
                    stop.wait()
                    agent.runner.wake()

                threading.Thread(target=wake_on_stop, daemon=True).start()
                agent.run(stop)
            finally:
                source.stop()
    finally:
        health.close()
        if nodeport is not None:
            nodeport.close()
        socket_lb.close()
