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
    ) -> Cluster:
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
                for other in cluster.nodes.values():
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
