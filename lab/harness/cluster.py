"""The namespaces of the multi-node kernel tests: clients and nodes on one bridge (the
"wire"), pods behind each node, routed between nodes as a CNI would; IPv4, or dual stack.
Built on lab.harness.netns (namespaces, processes, cgroups), removed by close()."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from lab.harness.netns import Namespaces, Pod, attach_xdp_pass, sh

WIRE_PREFIX = "192.168.100"  # the "physical" network between clients and nodes
WIRE6_PREFIX = "fd00:100::"  # its IPv6 /64, with Cluster.create(ipv6=True)
POD_GATEWAY6 = "fe80::1"  # a node's address on every pod link: the pods' IPv6 gateway


@dataclass
class Node:
    name: str
    netns: str
    ip: str  # address on the wire
    pod_prefix: str  # pods are <pod_prefix>.N/32
    pods: dict[str, Pod] = field(default_factory=dict)
    ip6: str | None = None  # IPv6 address on the wire (Cluster.create(ipv6=True))
    pod_prefix6: str | None = None  # IPv6 pods are <pod_prefix6>N/128


@dataclass
class Cluster(Namespaces):
    """Clients and nodes on one bridge (the wire); pods behind each node on a /24 of their
    own, routed between nodes as a CNI would. Nothing has a route out of the cluster.
    With ipv6, the same again in IPv6 (dual stack): the wire's fd00:100::/64, each node's
    pods on a /64 of their own; `clients6` gives the clients' IPv6 addresses."""

    nodes: dict[str, Node] = field(default_factory=dict)
    clients: dict[str, str] = field(default_factory=dict)  # name -> netns
    client_ips: dict[str, str] = field(default_factory=dict)
    client_ips6: dict[str, str] = field(default_factory=dict)
    wire_ports: list[str] = field(default_factory=list)
    ipv6: bool = False
    _ports: int = 0

    @classmethod
    def create(
        cls,
        nodes: int = 2,
        clients: dict[str, str] | None = None,
        prefix: str | None = None,
        *,
        ipv6: bool = False,
        clients6: dict[str, str] | None = None,
        pod_routes: bool = True,
    ) -> Cluster:
        """`pod_routes`: each node routes the others' pods over the wire (False: the caller
        routes them, over a link of their own or an overlay)."""
        cluster = cls(prefix or f"elb{uuid.uuid4().hex[:6]}", ipv6=ipv6)
        try:
            wire = cluster.add_namespace("wire")
            sh("ip", "-n", wire, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", wire, "link", "set", "br0", "up")
            for i in range(1, nodes + 1):
                netns = cluster.add_namespace(f"node{i}", forwarding=True)
                node = Node(f"node{i}", netns, f"{WIRE_PREFIX}.{i}", f"10.244.{i}")
                if ipv6:
                    node.ip6, node.pod_prefix6 = f"{WIRE6_PREFIX}{i}", f"fd00:244:{i}::"
                cluster._plug(netns, node.ip, node.ip6)
                cluster.nodes[node.name] = node
            for node in cluster.nodes.values():
                for other in cluster.nodes.values() if pod_routes else ():
                    if other is not node:
                        sh(
                            "ip",
                            "-n",
                            node.netns,
                            "route",
                            "add",
                            f"{other.pod_prefix}.0/24",
                            "via",
                            other.ip,
                        )
                        if other.ip6 is not None:
                            sh(
                                "ip",
                                "-n",
                                node.netns,
                                "route",
                                "add",
                                f"{other.pod_prefix6}/64",
                                "via",
                                other.ip6,
                            )
            for name, ip in (clients or {"client": f"{WIRE_PREFIX}.100"}).items():
                netns = cluster.add_namespace(name)
                ip6 = (clients6 or {}).get(name)
                cluster._plug(netns, ip, ip6)
                cluster.clients[name] = netns
                cluster.client_ips[name] = ip
                if ip6 is not None:
                    cluster.client_ips6[name] = ip6
        except BaseException:
            cluster.close()
            raise
        return cluster

    @property
    def wire_ns(self) -> str:
        return f"{self.prefix}-wire"

    def _plug(self, netns: str, ip: str, ip6: str | None = None) -> None:
        """Connect a namespace's eth0 to the wire bridge with address ip/24 (and ip6/64)."""
        self._ports += 1
        port = f"w{self._ports}"
        self.link(netns, "eth0", self.wire_ns, port)
        sh("ip", "-n", self.wire_ns, "link", "set", port, "master", "br0")
        self.wire_ports.append(port)
        sh("ip", "-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        if ip6 is not None:
            sh("ip", "-n", netns, "addr", "add", f"{ip6}/64", "dev", "eth0")

    def add_pod(self, node_name: str, name: str, host: int) -> Pod:
        node = self.nodes[node_name]
        netns = self.add_namespace(name)
        ip = f"{node.pod_prefix}.{host}"
        host_if = f"p{name}"[:15]
        self.link(node.netns, host_if, netns, "eth0")
        sh("ip", "-n", netns, "addr", "add", f"{ip}/32", "dev", "eth0")
        sh("ip", "-n", netns, "route", "add", "default", "via", node.ip, "dev", "eth0", "onlink")
        sh("ip", "-n", node.netns, "route", "add", f"{ip}/32", "dev", host_if)
        pod = Pod(name, netns, ip)
        if node.pod_prefix6 is not None:
            pod.ip6 = f"{node.pod_prefix6}{host}"
            sh("ip", "-n", netns, "addr", "add", f"{pod.ip6}/128", "dev", "eth0")
            sh("ip", "-n", node.netns, "addr", "add", f"{POD_GATEWAY6}/64", "dev", host_if)
            sh("ip", "-n", netns, "route", "add", "default", "via", POD_GATEWAY6, "dev", "eth0")
            sh("ip", "-n", node.netns, "route", "add", f"{pod.ip6}/128", "dev", host_if)
        node.pods[name] = pod
        return pod

    def link_nodes(
        self, a: str, b: str, subnet: str, *, mtu: int = 1500, subnet6: str | None = None
    ) -> tuple[str, str]:
        """A direct link between nodes `a` and `b` (a second NIC each, not the wire):
        interfaces n<a><b> and n<b><a>, addresses <subnet>.1 and .2 (/24), and with subnet6
        <subnet6>1 and 2 (/64), both ends of `mtu`; routes over it are the caller's. The
        interface names."""
        na, nb = self.nodes[a], self.nodes[b]
        if_a, if_b = f"n{a[-1]}{b[-1]}", f"n{b[-1]}{a[-1]}"
        self.link(na.netns, if_a, nb.netns, if_b)
        for netns, ifname, host in ((na.netns, if_a, 1), (nb.netns, if_b, 2)):
            sh("ip", "-n", netns, "link", "set", ifname, "mtu", str(mtu))
            sh("ip", "-n", netns, "addr", "add", f"{subnet}.{host}/24", "dev", ifname)
            if subnet6 is not None:
                sh("ip", "-n", netns, "addr", "add", f"{subnet6}{host}/64", "dev", ifname)
        return if_a, if_b

    def overlay(self, *, vni: int = 1, mtu: int = 1450, port: int = 8472) -> str:
        """A VXLAN overlay between the nodes as flannel's vxlan backend builds it: on each
        node a device flannel.<vni> over eth0 (no learning), its address the .0 of the
        node's pod /24, and for every other node a route to its pods via its device's
        address (onlink), a permanent neighbour entry for that address and a static FDB
        entry sending the peer's MAC to its wire address. The device's name."""
        name = f"flannel.{vni}"
        macs = {n: f"02:fe:00:00:{vni:02x}:{i:02x}" for i, n in enumerate(self.nodes, start=1)}
        for node_name, node in self.nodes.items():
            ns = node.netns
            sh(
                "ip",
                "-n",
                ns,
                "link",
                "add",
                name,
                "type",
                "vxlan",
                "id",
                str(vni),
                "local",
                node.ip,
                "dev",
                "eth0",
                "dstport",
                str(port),
                "nolearning",
            )
            sh("ip", "-n", ns, "link", "set", name, "address", macs[node_name], "mtu", str(mtu))
            sh("ip", "-n", ns, "link", "set", name, "up")
            sh("ip", "-n", ns, "addr", "add", f"{node.pod_prefix}.0/32", "dev", name)
        for node in self.nodes.values():
            for other_name, other in self.nodes.items():
                if other is node:
                    continue
                vtep = f"{other.pod_prefix}.0"
                sh(
                    "ip",
                    "-n",
                    node.netns,
                    "route",
                    "add",
                    f"{other.pod_prefix}.0/24",
                    "via",
                    vtep,
                    "dev",
                    name,
                    "onlink",
                )
                sh(
                    "ip",
                    "-n",
                    node.netns,
                    "neigh",
                    "replace",
                    vtep,
                    "lladdr",
                    macs[other_name],
                    "dev",
                    name,
                    "nud",
                    "permanent",
                )
                sh(
                    "ip",
                    "netns",
                    "exec",
                    node.netns,
                    "bridge",
                    "fdb",
                    "append",
                    macs[other_name],
                    "dev",
                    name,
                    "dst",
                    other.ip,
                    "self",
                    "permanent",
                )
        return name

    def strict_rp_filter(self) -> None:
        """Strict reverse-path filtering on every node (rp_filter=1, RHEL's default): a
        packet is dropped unless the route back to its source leaves by the interface it
        came in on. (The effective setting is the larger of all's and the interface's.)"""
        for node in self.nodes.values():
            sh(
                "ip",
                "netns",
                "exec",
                node.netns,
                "sysctl",
                "-qw",
                "net.ipv4.conf.all.rp_filter=1",
                "net.ipv4.conf.default.rp_filter=1",
            )

    def route(self, netns: str, destination: str, via: str) -> None:
        """What an upstream router does for a LoadBalancer/external IP: send it to a node."""
        sh("ip", "-n", netns, "route", "add", destination, "via", via)

    def wire_like(self) -> None:
        """Make the veths behave like physical links for native XDP on the nodes' eth0:

        - senders compute full checksums (a NIC never receives CHECKSUM_PARTIAL packets,
          a veth does from a local sender, and XDP cannot see that metadata); the nodes
          are senders too: what they forward of a GRO aggregate leaves their eth0 as
          segments, and a NIC's TSO completes those segments' checksums;
        - the wire side of each veth runs an XDP program, without which a veth drops the
          frames its peer sends back with XDP_TX.
        """
        for netns in [
            *self.clients.values(),
            *(n.netns for n in self.nodes.values()),
            *(p.netns for n in self.nodes.values() for p in n.pods.values()),
        ]:
            self.offload(netns, "eth0", False)
        attach_xdp_pass(self, self.wire_ns, self.wire_ports)
