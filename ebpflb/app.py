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

from ebpflb.clock import RealClock
from ebpflb.config import Config, XdpMode, place_snat_ports
from ebpflb.datapath import addrwatch, probes
from ebpflb.datapath.contract import MAX_IFACES, MapName
from ebpflb.datapath.maps import InterfaceAddresses, pinlayout, pins
from ebpflb.datapath.maps.kernel import KernelMapSet
from ebpflb.datapath.programs import loader, netdev, podlb
from ebpflb.datapath.syscall import sockdiag
from ebpflb.datapath.syscall.mounts import cgroup2_root
from ebpflb.desired import NodeView
from ebpflb.errors import ConfigError, EbpflbError
from ebpflb.host import sysctl
from ebpflb.host.lock import Holder, PinDirLock
from ebpflb.k8s.sources.base import ObjectSink, Source
from ebpflb.k8s.sources.manifests import ManifestSource
from ebpflb.observe.fill import CachedCounts, MapFill, MapFillCollector, agent_fill
from ebpflb.observe.health import ProxyHealth
from ebpflb.observe.http import HttpServer, health_routes, metrics_routes
from ebpflb.observe.metrics import DatapathCollector, Metrics, SourceCollector, StatusCollector
from ebpflb.observe.status import AgentStatus, Phase, process_start_time
from ebpflb.observe.svccounters import ServiceCounterCollector
from ebpflb.sync.agent import Agent
from ebpflb.sync.healthcheck import HealthCheckServers

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
    from ebpflb.k8s.sources.kubernetes import KubernetesSource, api_config

    api = api_config(kubeconfig=kubeconfig)
    return lambda sink: KubernetesSource(sink, api)


def _serve(
    config: Config, registry: CollectorRegistry, status: AgentStatus, metrics: Metrics
) -> list[HttpServer]:
    """The health and metrics servers, each unless its address is empty."""
    servers = []
    try:
        if config.healthz_bind_address:
            servers.append(
                HttpServer(
                    config.healthz_bind_address,
                    health_routes(status.health, metrics.kube_proxy.health_answered),
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


def write_interface_maps(
    maps: KernelMapSet,
    previous: InterfaceAddresses,
    state: addrwatch.AddressState,
    metrics: Metrics,
) -> InterfaceAddresses:
    """Every interface's SNAT source and MTU into the maps (ebpflb_ifaddr4/6, ebpflb_ifmtu);
    the sources written. Interfaces beyond the maps' size are left out, logged and counted:
    flows leaving by one of them take the node's primary address."""
    sources, left_out = addrwatch.snat_sources(previous, state)
    if left_out:
        log.error(
            "%d interfaces with a node address do not fit ebpflb_ifaddr4/6 (EBPFLB_MAX_IFACES"
            " = %d, the primary address's entry included): flows leaving by them are SNATed"
            " to the primary address",
            left_out,
            MAX_IFACES,
        )
        metrics.map_errors.labels(MapName.IFACE_ADDRS.value, "full").inc(left_out)
    if sources != previous:
        maps.set_interface_addresses(sources)
    maps.set_interface_mtus(addrwatch.interface_mtus(state))
    return sources


def _release_free_memory() -> None:
    """Hand the heap's free pages back to the system (glibc keeps what the compiler and
    the first sync's temporary tables freed)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _lock_pin_dir(
    config: Config, lock: PinDirLock, status: AgentStatus, stop: threading.Event
) -> bool:
    """Make this agent the only one on its pin directory, waiting up to --lock-timeout for
    another to exit (ebpflb.host.lock); False if stopped while waiting."""
    pin_dir = config.bpffs_dir
    pins.ensure_bpffs(pin_dir)
    waited: list[Holder] = []

    def waiting(holder: Holder) -> None:
        log.warning(
            "pin directory %s is in use by another ebpflb agent (%s): waiting up to %gs for"
            " it to exit",
            pin_dir,
            holder,
            config.lock_timeout,
        )
        status.waiting_for_lock(str(pin_dir), holder.pid)
        waited.append(holder)

    if not lock.acquire(
        config.lock_timeout,
        stop=stop,
        on_wait=waiting,
        recreate=lambda: pins.ensure_bpffs(pin_dir),
    ):
        return False
    if waited:
        log.info("the other agent has exited: taking over pin directory %s", pin_dir)
    status.lock_taken()
    return True


def _pins_readable(config: Config, status: AgentStatus) -> bool:
    """Whether this agent may use the maps pinned under --bpffs (pinlayout); reported in
    /status either way."""
    verdict, found = pinlayout.check(config.bpffs_dir)
    found_layout = None
    if verdict is not pinlayout.Verdict.FRESH:
        found_layout = found.layout if found else pinlayout.UNVERSIONED
    refused = None
    if verdict is pinlayout.Verdict.NEWER_REFUSED:
        assert found is not None
        refused = pinlayout.refusal(config.bpffs_dir, found)
        log.error(
            "%s. Leaving them and the attached programs as they are (they keep serving);"
            " this agent stays up and unready until stopped",
            refused,
        )
    elif verdict is pinlayout.Verdict.OLDER:
        log.info(
            "the maps pinned under %s have layout %d (%s): migrating them to layout %d",
            config.bpffs_dir,
            found_layout,
            f"ebpflb {found.written_by}" if found else "from before layouts were recorded",
            pinlayout.LAYOUT,
        )
    status.pin_layout(
        pinlayout.LAYOUT,
        found_layout,
        found.written_by if found and verdict is not pinlayout.Verdict.FRESH else None,
        verdict.value,
        refused,
    )
    return refused is None


def _stand_by(status: AgentStatus, lock: PinDirLock, stop: threading.Event) -> None:
    """Refused pins: touch nothing, stay up and unready (not a restart loop) until stopped;
    the lock goes, so that an agent that can read the pins is not kept waiting."""
    lock.release()
    status.health.stand_by()
    stop.wait()


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
    if interfaces:
        config = place_snat_ports(config, netdev.ephemeral_port_range())
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    conntrack_sysctls = sysctl.ConntrackSysctls(
        config.ct_tcp_close_wait_timeout,
        on_error=lambda outcome: metrics.sysctl_errors.labels(outcome.key).inc(),
    )
    if config.conntrack_sysctls:
        conntrack_sysctls.ensure()
    registry.register(StatusCollector(status.phases, status.frontend_changes))
    health = HealthCheckServers()
    # The attached interfaces' addresses are followed while the agent runs (addrwatch).
    watched = {i.index: i.name for i in interfaces}
    addresses = addrwatch.read_state()
    node = NodeView.of(config, addresses.node_addresses(watched), addresses.primary_addresses())
    if config.nodeport_primary and not node.primary:
        log.warning(
            "--nodeport-addresses=primary: no default route (IPv4 or IPv6), so no primary"
            " address: NodePorts answer nowhere until one appears"
        )
    agent = Agent(
        config, None, metrics, node=node, health=health, on_synced=_pause_gc(), status=status
    )
    source = source_factory(agent)
    registry.register(SourceCollector(source.counters))
    status.read_source(source.progress)
    socket_lb: loader.SocketLB | None = None
    nodeport: loader.NodePortLB | None = None
    pod_lb: podlb.PodLB | None = None
    servers: list[HttpServer] = []
    pin_lock = PinDirLock(config.bpffs_dir)
    try:
        pins.ensure_bpffs(config.bpffs_dir)
        alone = pin_lock.try_acquire()
        try:  # a taken port fails before any work
            servers = _serve(config, registry, status, metrics)
        except ConfigError as exc:
            if alone:
                raise
            # Another agent holds the pins and, on this host's network, likely these ports
            # too: they come free when it exits, with the pins (else this fails again then).
            log.warning("%s: serving once the agent holding %s has exited", exc, config.bpffs_dir)
        # What the kernel lacks stops the start here, before anything is listed or attached.
        kernel = probes.probe()
        tc = bool(interfaces) or bool(config.pod_interfaces)
        probes.check(kernel, nodeport=tc, xdp=config.xdp is not XdpMode.OFF)
        status.kernel_features(kernel.status())
        registry.register(probes.FeatureCollector(kernel))
        features = loader.Features.from_report(kernel, config.socket_storage)
        log.info(
            "reverse entries of TCP sockets (getpeername): %s",
            "in socket storage"
            if features.sk_storage
            else "in the LRU ebpflb_revsk4 ("
            + ("--socket-storage=false" if not config.socket_storage else "kernel lacks it")
            + ")",
        )
        # Pins of a newer layout this agent cannot read are left alone, before any listing.
        if not _pins_readable(config, status):
            _stand_by(status, pin_lock, stop)
            return
        source.start()  # listing, while the programs compile
        # Before anything touches a pin: the loader may unpin maps of another layout.
        if not _lock_pin_dir(config, pin_lock, status, stop):
            return
        if not _pins_readable(config, status):  # written by the agent this one waited for
            _stand_by(status, pin_lock, stop)
            return
        if not servers and (config.healthz_bind_address or config.metrics_bind_address):
            servers = _serve(config, registry, status, metrics)
        socket_lb = loader.SocketLB(config, features)
        status.compiled(
            "socket_lb",
            socket_lb.load_seconds,
            Phase.SOCKET_LB_COMPILED,
            socket_lb.origin.value,
            socket_lb.headers,
        )
        if interfaces:
            started = clock.now()
            nodeport = loader.NodePortLB(config, features)
            status.compiled(
                "nodeport",
                clock.now() - started,
                Phase.NODEPORT_COMPILED,
                nodeport.origin.value,
                nodeport.headers,
            )
        if config.pod_interfaces:
            pod_lb = podlb.PodLB(config, features)
            status.compiled(
                "pod", pod_lb.load_seconds, Phase.POD_COMPILED, pod_lb.origin.value, pod_lb.headers
            )
        pinlayout.write(config.bpffs_dir)  # every map is in this agent's layout now
        status.programs_replaced(socket_lb.attach(cgroup))
        status.socket_lb(config.socket_lb.value, socket_lb.netns_cookie or None, sockdiag.METHOD)
        log.info(
            "socket-LB (%s) on cgroup %s; maps pinned under %s",
            config.socket_lb.value,
            cgroup,
            config.bpffs_dir,
        )
        _release_free_memory()  # what the compiler freed
        with KernelMapSet(config.bpffs_dir, config.slot_pool_size) as maps:
            snat = write_interface_maps(maps, InterfaceAddresses(), addresses, metrics)
            if nodeport is not None:
                modes = nodeport.attach(interfaces)
                status.interfaces_attached({name: mode.value for name, mode in modes.items()})
            links = podlb.follow(pod_lb, status.pod_interfaces) if pod_lb else None
            status.phase_done(Phase.ATTACHED)
            for programs in (socket_lb, nodeport, pod_lb):
                if programs is not None:
                    status.program_ids(programs.program_ids())
            registry.register(DatapathCollector(maps.counters))
            registry.register(
                ServiceCounterCollector(
                    maps.service_counters,
                    lambda: agent.reconciler.realized,
                    per_service=config.per_service_metrics,
                )
            )

            def housekeeping() -> None:
                maps.expire_flows()
                if config.conntrack_sysctls:  # nf_conntrack may have loaded since
                    conntrack_sysctls.ensure()
                for table in (MapName.CONNTRACK, MapName.CONNTRACK6):  # each on its own
                    try:
                        grown = maps.grow_conntrack(config.ct_max, table)
                    except EbpflbError as exc:  # flows go on in the old table; tried later
                        log.warning("%s could not grow: %s", table.value, exc)
                        continue
                    if grown is not None:
                        log.info(
                            "%s grew from %d to %d entries (limit %d)",
                            table.value,
                            *grown,
                            config.ct_max,
                        )
                        metrics.map_grows.labels(table.value).inc()

            agent.housekeeping = housekeeping
            agent.use_maps(maps)
            counts = CachedCounts(maps.count_entries, clock)

            def fill() -> list[MapFill]:
                # Read at every scrape: a growable map's max_entries changes when it grows.
                infos = maps.map_infos()
                max_entries = {MapName(n): info.max_entries for n, info in infos.items()}
                return agent_fill(agent.reconciler.map_entries(), max_entries, counts)

            registry.register(MapFillCollector(fill))

            def wake_on_stop() -> None:
                stop.wait()
                agent.runner.wake()

            threading.Thread(target=wake_on_stop, daemon=True).start()
            watcher = None
            if watched or pod_lb is not None:  # SNAT sources: NodePort's, and hairpin's

                def addresses_changed(state: addrwatch.AddressState) -> None:
                    nonlocal snat
                    snat = write_interface_maps(maps, snat, state, metrics)
                    agent.set_node_addresses(
                        state.node_addresses(watched), state.primary_addresses()
                    )

                watcher = addrwatch.AddressWatcher(addresses, addresses_changed)
                watcher.start()
            try:
                agent.run(stop)
            finally:
                if links is not None:
                    links.stop()
                if watcher is not None:
                    watcher.stop()  # before the maps it writes are closed
    finally:
        gc.enable()
        source.stop()
        health.close()
        if nodeport is not None:
            nodeport.close()
        if pod_lb is not None:
            pod_lb.close()
        if socket_lb is not None:
            socket_lb.close()
        for server in servers:
            server.close()
        pin_lock.release()
