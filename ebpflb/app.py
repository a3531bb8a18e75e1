"""Wires the parts of a running agent together and takes them apart again.

Leaving `run` (SIGINT/SIGTERM) closes this process's handles only: programs stay
attached and maps pinned, so traffic keeps flowing while the agent restarts. Removing the
datapath is `ebpflb cleanup`'s job.

Start-up overlaps its two slow halves: the source lists every object (Python, in its own
threads) while this thread compiles and attaches the programs (clang, which releases the
GIL). The first sync waits for both; nothing is written to a map before it exists. The
health and metrics servers are bound first, so probes get answers (503 until the first
sync) and /status shows each start-up phase as it ends.
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

from prometheus_client import CollectorRegistry

from ebpflb import maglev
from ebpflb.agent import Agent
from ebpflb.clock import RealClock
from ebpflb.config import Config
from ebpflb.datapath import loader, netdev
from ebpflb.datapath.kernel import KernelMapSet
from ebpflb.datapath.mounts import cgroup2_root
from ebpflb.desired import ExternalIPPolicy, NodeView
from ebpflb.healthcheck import HealthCheckServers
from ebpflb.metrics import DatapathCollector, Metrics, SourceCollector, StatusCollector
from ebpflb.observe.health import ProxyHealth
from ebpflb.observe.http import HttpServer, health_routes, metrics_routes
from ebpflb.observe.status import AgentStatus, Phase, process_start_time
from ebpflb.sources.base import ObjectSink, Source
from ebpflb.sources.manifests import ManifestSource

log = logging.getLogger(__name__)


SourceFactory = Callable[[ObjectSink], Source]


def manifest_source(path: Path) -> SourceFactory:
    # Absolute: BCC's compiler changes the process's working directory while it runs, and
    # the files are read again (polled) afterwards.
    path = path.absolute()
    return lambda sink: ManifestSource(path, sink)


def kubernetes_source(kubeconfig: Path | None = None) -> SourceFactory:
    """The API server from `kubeconfig`, else in-cluster. The configuration is read now, so
    a bad one fails before the datapath is compiled."""
    # Imported here: `kubernetes` is a heavy import that --manifests runs do not need.
    from ebpflb.sources.kubernetes import KubernetesSource, api_config

    api = api_config(kubeconfig=kubeconfig)
    return lambda sink: KubernetesSource(sink, api)


def _serve(config: Config, registry: CollectorRegistry, status: AgentStatus) -> list[HttpServer]:
    """The health and metrics servers, each unless its address is empty."""
    servers = []
    try:
        if config.healthz_bind_address:
            servers.append(
                HttpServer(
                    config.healthz_bind_address,
                    health_routes(status.health),
                    flag="healthz-bind-address",
                )
            )
            log.info("serving /healthz, /livez, /readyz on %s", config.healthz_bind_address)
        if config.metrics_bind_address:
            servers.append(
                HttpServer(
                    config.metrics_bind_address,
                    metrics_routes(registry, status),
                    flag="metrics-bind-address",
                )
            )
            log.info("serving /metrics, /status on %s", config.metrics_bind_address)
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers


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
    clock = RealClock()
    status = AgentStatus(ProxyHealth(config.health_timeout, clock), clock, process_start_time())
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
    registry.register(StatusCollector(status.phases, status.frontend_changes))
    health = HealthCheckServers()
    node = NodeView(
        config.node_name,
        tuple(a for i in interfaces for a in i.addresses),
        ExternalIPPolicy(config.external_ip_cidrs),
        config.zone,
        config.nodeport_addresses,
    )
    agent = Agent(
        config, None, metrics, node=node, health=health, on_synced=_pause_gc(), status=status
    )
    source = source_factory(agent)
    registry.register(SourceCollector(source.counters))
    status.read_source(source.progress)
    socket_lb: loader.SocketLB | None = None
    nodeport: loader.NodePortLB | None = None
    servers: list[HttpServer] = []
    try:
        servers = _serve(config, registry, status)  # a taken port fails before any work
        source.start()  # listing, while the programs compile
        features = loader.probe_features()
        socket_lb = loader.SocketLB(config, features)
        status.compiled("socket_lb", socket_lb.load_seconds, Phase.SOCKET_LB_COMPILED)
        if interfaces:
            started = clock.now()
            nodeport = loader.NodePortLB(config, features)
            status.compiled("nodeport", clock.now() - started, Phase.NODEPORT_COMPILED)
        status.programs_replaced(socket_lb.attach(cgroup))
        log.info("socket-LB attached to cgroup %s; maps pinned under %s", cgroup, config.bpffs_dir)
        _release_free_memory()  # what the compiler freed
        with KernelMapSet(config.bpffs_dir) as maps:
            maps.set_interface_addresses(
                {i.index: i.addresses[0] for i in interfaces if i.addresses}
            )
            if nodeport is not None:
                modes = nodeport.attach(interfaces)
                status.interfaces_attached({name: mode.value for name, mode in modes.items()})
            status.phase_done(Phase.ATTACHED)
            maglev.warm_up()
            registry.register(DatapathCollector(maps.counters))
            for pinned, info in maps.map_infos().items():
                metrics.map_capacity.labels(pinned).set(info.max_entries)
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
        for server in servers:
            server.close()
