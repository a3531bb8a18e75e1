"""Wires the parts of a running agent together and takes them apart again.

Leaving `run` (SIGINT/SIGTERM) closes this process's handles only: programs stay
attached and maps pinned, so traffic keeps flowing while the agent restarts. Removing the
datapath is `ebpflb cleanup`'s job.

Start-up overlaps its two slow halves: the source lists every object (Python, in its own
threads) while this thread compiles and attaches the programs (clang, which releases the
GIL). The first sync waits for both; nothing is written to a map before it exists.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Protocol

from prometheus_client import CollectorRegistry, start_http_server

from ebpflb import maglev
from ebpflb.agent import Agent
from ebpflb.config import Config
from ebpflb.datapath import loader, netdev
from ebpflb.datapath.kernel import KernelMapSet
from ebpflb.datapath.mounts import cgroup2_root
from ebpflb.desired import ExternalIPPolicy, NodeView
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


# Start-up allocates hundreds of thousands of long-lived objects, and the cyclic GC would
# walk the growing heap again and again (20,000 services: listed and synced in 4.4 s of
# CPU with it, 2.4 s without).
# It is off until the first sync; then everything alive is frozen out of its reach
# (gc.freeze), so later collections only look at what changes afterwards. A start that
# takes longer than this (an API server that does not answer) gets it back meanwhile.
START_GC_GRACE = 300.0


def _pause_gc() -> Callable[[], None]:
    """Turn the cyclic GC off; the function returned (for the first sync) turns it back on."""
    gc.disable()
    grace = threading.Timer(START_GC_GRACE, gc.enable)
    grace.daemon = True
    grace.start()

    def settle() -> None:
        grace.cancel()
        gc.freeze()  # no collection first: start-up leaves next to no cyclic garbage
        gc.enable()
        _release_free_memory()

    return settle


def _release_free_memory() -> None:
    """Hand the heap's free pages back to the system (glibc keeps what the compiler and
    the first sync's temporary tables freed)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


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

    interfaces = netdev.interfaces(config.interfaces) if config.interfaces != () else []
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    health = HealthCheckServers()
    node = NodeView(
        config.node_name,
        tuple(a for i in interfaces for a in i.addresses),
        ExternalIPPolicy(config.external_ip_cidrs),
    )
    agent = Agent(config, None, metrics, node=node, health=health, on_synced=_pause_gc())
    source = source_factory(agent)
    registry.register(SourceCollector(source.counters))
    socket_lb: loader.SocketLB | None = None
    nodeport: loader.NodePortLB | None = None
    try:
        source.start()  # listing, while the programs compile
        features = loader.probe_features()
        socket_lb = loader.SocketLB(config, features)
        nodeport = loader.NodePortLB(config, features) if interfaces else None
        socket_lb.attach(cgroup)
        log.info("socket-LB attached to cgroup %s; maps pinned under %s", cgroup, config.bpffs_dir)
        _release_free_memory()  # what the compiler freed
        maglev.warm_up()
        with KernelMapSet(config.bpffs_dir) as maps:
            maps.set_interface_addresses(
                {i.index: i.addresses[0] for i in interfaces if i.addresses}
            )
            if nodeport is not None:
                nodeport.attach(interfaces)
            registry.register(DatapathCollector(maps.counters))
            for pinned, info in maps.map_infos().items():
                metrics.map_capacity.labels(pinned).set(info.max_entries)
            if config.metrics_bind_address:
                _serve_metrics(config.metrics_bind_address, registry)
            agent.housekeeping = maps.expire_flows
            agent.use_maps(maps)

            def wake_on_stop() -> None:
                stop.wait()
                agent.runner.wake()

            threading.Thread(target=wake_on_stop, daemon=True).start()
            agent.run(stop)
    finally:
        gc.enable()
        source.stop()
        health.close()
        if nodeport is not None:
            nodeport.close()
        if socket_lb is not None:
            socket_lb.close()
