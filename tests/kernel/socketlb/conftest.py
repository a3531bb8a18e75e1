"""What the socket-LB tests share: the IPv6 side of the topology (the node and each pod
holding an IPv6 address next to the IPv4 one, every pod serving both families), the
manifests with IPv6 and dual-stack Services, and `Family`, the addresses and maps one IP
family's twin of a test uses (test_socket_lb.py runs those twins for both)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ebpflb.datapath.maps import MapName
from lab.harness.netns import Topology, sh
from tests.kernel.conftest import PODS, TCP_PORT, UDP_PORT

NODE6 = "fd00:1::1"
PODS6 = {"pod1": "fd00:244::11", "pod2": "fd00:244::12", "pod3": "fd00:244::13"}
WEB6 = "[fd00:96::10]:80"
DNS6 = "[fd00:96::53]:53"
PENDING6 = "[fd00:96::99]:80"
UDP_PENDING6 = "[fd00:96::98]:53"
# The IPv4 Services of examples/ as a dual-stack socket addresses them.
WEB_MAPPED = "[::ffff:10.96.0.10]:80"
DNS_MAPPED = "[::ffff:10.96.0.53]:53"
PENDING_MAPPED = "[::ffff:10.96.0.99]:80"
DUAL4, DUAL6 = "10.96.0.20:80", "[fd00:96::20]:80"


@dataclass(frozen=True)
class Family:
    """One IP family's side of a socket-LB test: its topology and manifests fixtures, its
    ClusterIPs (web TCP, dns UDP, pending TCP and UDP without endpoints, a port no
    Service has), its pods' addresses and its reverse-socket LRU map."""

    name: str
    topology: str  # fixture name
    manifests: str  # fixture name
    web: str
    dns: str
    pending: str
    udp_pending: str
    uncovered: str
    pods: dict[str, str]
    reverse_sock: MapName
    metric_frontend: tuple[str, str, str]  # service, port name, frontend label of `web`

    def node_address(self, topology: Topology) -> str:
        """The address the node's sockets have in this family (what backends see)."""
        return topology.node_ip if self.name == "ipv4" else NODE6


IPV4 = Family(
    "ipv4",
    "topology",
    "manifests",
    web="10.96.0.10:80",
    dns="10.96.0.53:53",
    pending="10.96.0.99:80",
    udp_pending="10.96.0.98:53",
    uncovered="10.96.0.10:81",
    pods=PODS,
    reverse_sock=MapName.REVERSE_SOCK,
    metric_frontend=("default/web", "http", "10.96.0.10:80"),
)
IPV6 = Family(
    "ipv6",
    "topology6",
    "manifests6",
    web=WEB6,
    dns=DNS6,
    pending=PENDING6,
    udp_pending=UDP_PENDING6,
    uncovered="[fd00:96::10]:81",
    pods=PODS6,
    reverse_sock=MapName.REVERSE_SOCK6,
    metric_frontend=("default/web6", "p", "[fd00:96::10]:80"),
)
FAMILIES = pytest.mark.parametrize("family", [IPV4, IPV6], ids=["ipv4", "ipv6"])


def _ipv6_on(netns: str, *interfaces: str) -> None:
    """IPv6 on, without duplicate address detection (an address is usable at once)."""
    settings = [
        f"net.ipv6.conf.{name}.{key}={value}"
        for name in ("all", "default", *interfaces)
        for key, value in (("disable_ipv6", 0), ("accept_dad", 0))
    ]
    sh("ip", "netns", "exec", netns, "sysctl", "-qw", *settings)


@pytest.fixture(scope="module")
def topology6() -> Iterator[Topology]:
    """The kernel tests' topology with IPv6 too: the node holds NODE6, each pod its PODS6
    address next to its IPv4 one, routes on-link both ways and no route anywhere else;
    every pod serves TCP 8080 and UDP 5353 on both families."""
    topo = Topology.create()
    try:
        _ipv6_on(topo.node_ns)
        for index, (name, ip) in enumerate(PODS.items()):
            pod = topo.add_pod(name, ip)
            host_if = f"v{topo.prefix[-6:]}{index}"[:15]  # as Topology.add_pod names it
            _ipv6_on(topo.node_ns, host_if)
            _ipv6_on(pod.netns, "eth0")
            # The node's address on every pod link, so each pod finds it by neighbour
            # discovery on its own link.
            sh(
                "ip",
                "-n",
                topo.node_ns,
                "-6",
                "addr",
                "add",
                f"{NODE6}/128",
                "dev",
                host_if,
                "nodad",
            )
            sh(
                "ip",
                "-n",
                pod.netns,
                "-6",
                "addr",
                "add",
                f"{PODS6[name]}/128",
                "dev",
                "eth0",
                "nodad",
            )
            sh("ip", "-n", pod.netns, "-6", "route", "add", NODE6, "dev", "eth0")
            sh("ip", "-n", topo.node_ns, "-6", "route", "add", f"{PODS6[name]}/128", "dev", host_if)
            argv = [sys.executable, "-m", "lab.harness.echo", "serve", "--name", name]
            argv += ["--tcp", str(TCP_PORT), "--udp", str(UDP_PORT), "--ipv6", "--lifetime", "900"]
            server = topo.spawn(pod.netns, argv)
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield topo
    finally:
        topo.close()


def slice_yaml(
    name: str, service: str, family: str, port: str, protocol: str, addresses: list[str]
) -> str:
    endpoints = "".join(
        f'  - addresses: ["{a}"]\n    conditions: {{ready: true}}\n    nodeName: node-1\n'
        for a in addresses
    )
    return (
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        f"metadata: {{name: {name}, labels: {{kubernetes.io/service-name: {service}}}}}\n"
        f"addressType: {family}\n"
        f"ports: [{{name: {port}, protocol: {protocol}, port: "
        f"{TCP_PORT if protocol == 'TCP' else UDP_PORT}}}]\n"
        + (f"endpoints:\n{endpoints}" if endpoints else "endpoints: []\n")
    )


def service_yaml(name: str, ips: list[str], port: int, protocol: str) -> str:
    families = ", ".join("IPv6" if ":" in ip else "IPv4" for ip in ips)
    policy = "RequireDualStack" if len(ips) > 1 else "SingleStack"
    return (
        f"---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\n"
        f"spec: {{clusterIP: '{ips[0]}', clusterIPs: [{', '.join(repr(ip) for ip in ips)}],"
        f" ipFamilies: [{families}], ipFamilyPolicy: {policy},"
        f" ports: [{{name: p, protocol: {protocol}, port: {port}}}]}}\n"
    )


@pytest.fixture
def manifests6(manifests: Path) -> Path:
    """examples/ (IPv4 web, dns, pending) plus IPv6 web6, dns6, pending6, udp-pending6 and
    the dual-stack `dual` (IPv4 endpoints pod1, pod2; IPv6 endpoints pod2, pod3)."""
    pods6 = list(PODS6.values())
    (manifests / "ipv6.yaml").write_text(
        service_yaml("web6", ["fd00:96::10"], 80, "TCP")
        + slice_yaml("web6-a", "web6", "IPv6", "p", "TCP", pods6)
        + service_yaml("dns6", ["fd00:96::53"], 53, "UDP")
        + slice_yaml("dns6-a", "dns6", "IPv6", "p", "UDP", pods6)
        + service_yaml("pending6", ["fd00:96::99"], 80, "TCP")
        + service_yaml("udp-pending6", ["fd00:96::98"], 53, "UDP")
        + service_yaml("dual", ["10.96.0.20", "fd00:96::20"], 80, "TCP")
        + slice_yaml("dual-v4", "dual", "IPv4", "p", "TCP", [PODS["pod1"], PODS["pod2"]])
        + slice_yaml("dual-v6", "dual", "IPv6", "p", "TCP", [PODS6["pod2"], PODS6["pod3"]])
    )
    return manifests


def host_of(address: str) -> str:
    """The address of "IP:PORT" or "[IPv6]:PORT"."""
    return address.rpartition(":")[0].removeprefix("[").removesuffix("]")
