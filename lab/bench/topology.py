"""The benchmark's own network: three namespaces, made and removed by `ebpflb bench`.

    external (10.240.0.2) --eth0-- node --eth1-- backends (10.250.0.2, owns 10.128.0.0/11)
                                   10.240.0.1 / 10.250.0.1
                                     |pod0
                                    pod (10.159.255.254: the pod network's last address)

With `--family ipv6` the same network in unique local addresses (ADDRESSES): external
fd00:240::2, node fd00:240::1 / fd00:250::1, backends fd00:250::2 owning the IPv6 pod
range (scenario.PLANS); addresses are added without duplicate address detection (usable
at once) and the node forwards IPv6.

- node: where the proxy under test runs and the ClusterIP client connects from. It routes
  the pod network and the service CIDR to the backends namespace; nothing routes out of
  the topology, so an untranslated ClusterIP packet dies in the backends namespace (which
  neither owns nor forwards 10.96.0.0/12).
- backends: one server answers every endpoint address (an AnyIP route for the whole pod
  network), so 100,000 services need no 100,000 pods.
- external: the NodePort client, on the node's "physical" link.
- pod: a pod behind the node (its link's node side `pod0`, POD_LINK), at an address of the
  pod network (so kube-proxy's rules treat it as a pod: no masquerade) that the backends
  namespace routes back to the node: the ClusterIP client whose packets the proxy
  translates on their way through the node (kube-proxy's PREROUTING; ebpflb's per-packet
  path on pod0), as for every pod on a real node.

The links are set up as NIC-like for every mode alike (senders compute complete
checksums; each veth's far end runs an XDP_PASS program), because native XDP on the
node's interfaces needs it and the modes must share one network to be compared.

Clients run in one of two cgroups: `lb`, where ebpflb's socket programs are attached,
and `plain`, where nothing is, so the no-proxy floor can be measured interleaved with
ebpflb in the same run.
"""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass, field

from lab.bench import scenario
from lab.bench.scenario import Family
from lab.harness.netns import Cgroup, Namespaces, attach_xdp_pass, sh

NODE_INTERFACES = ("eth0", "eth1")  # external side, backend side
POD_LINK = "pod0"  # the node's side of the pod's link (ebpflb's --pod-interfaces)


@dataclass(frozen=True)
class Addresses:
    """The topology's interface addresses in one family."""

    node: str  # on eth0: where NodePort clients connect
    external: str
    node_backend: str  # on eth1
    backends: str
    prefix_len: int


ADDRESSES = {
    Family.IPV4: Addresses("10.240.0.1", "10.240.0.2", "10.250.0.1", "10.250.0.2", 24),
    Family.IPV6: Addresses("fd00:240::1", "fd00:240::2", "fd00:250::1", "fd00:250::2", 64),
}


def ipv6_on(netns: str, *, forwarding: bool = False) -> None:
    """IPv6 on, without duplicate address detection on interfaces made from now on."""
    settings = [
        f"net.ipv6.conf.{scope}.{key}=0"
        for scope in ("all", "default")
        for key in ("disable_ipv6", "accept_dad")
    ]
    if forwarding:
        settings.append("net.ipv6.conf.all.forwarding=1")
    sh("ip", "netns", "exec", netns, "sysctl", "-qw", *settings)


def pod_address(family: Family) -> str:
    """The bench pod's address: the pod network's last but one, used by no endpoint."""
    cidr = scenario.PLANS[family].endpoint_cidr
    return str(cidr.broadcast_address - 1)


@dataclass
class BenchTopology(Namespaces):
    cgroups: dict[str, Cgroup] = field(default_factory=dict)
    family: Family = Family.IPV4

    @classmethod
    def create(cls, family: Family = Family.IPV4) -> BenchTopology:
        topo = cls(f"ebpflb-bench-{uuid.uuid4().hex[:6]}", family=family)
        try:
            topo._build()
        except BaseException:
            topo.close()
            raise
        return topo

    @property
    def node(self) -> str:
        return f"{self.prefix}-node"

    @property
    def external(self) -> str:
        return f"{self.prefix}-ext"

    @property
    def backends(self) -> str:
        return f"{self.prefix}-be"

    @property
    def pod(self) -> str:
        return f"{self.prefix}-pod"

    @property
    def pod_address(self) -> str:
        return pod_address(self.family)

    @property
    def addresses(self) -> Addresses:
        return ADDRESSES[self.family]

    @property
    def lb_cgroup(self) -> Cgroup:
        return self.cgroups["lb"]

    @property
    def plain_cgroup(self) -> Cgroup:
        return self.cgroups["plain"]

    def _build(self) -> None:
        a, plan = self.addresses, scenario.PLANS[self.family]
        node = self.add_namespace("node", forwarding=True)
        ext = self.add_namespace("ext")
        backends = self.add_namespace("be")
        pod = self.add_namespace("pod")
        if self.family is Family.IPV6:  # before the links, so their interfaces inherit it
            for netns in (node, ext, backends, pod):
                ipv6_on(netns, forwarding=netns == node)
        self.link(node, "eth0", ext, "eth0")
        self.link(node, "eth1", backends, "eth0")
        self.link(node, POD_LINK, pod, "eth0")
        nodad = ("nodad",) if self.family is Family.IPV6 else ()
        for netns, address, dev in (
            (node, a.node, "eth0"),
            (ext, a.external, "eth0"),
            (node, a.node_backend, "eth1"),
            (backends, a.backends, "eth0"),
        ):
            sh("ip", "-n", netns, "addr", "add", f"{address}/{a.prefix_len}", "dev", dev, *nodad)
        endpoints = str(plan.endpoint_cidr)
        for cidr in (endpoints, str(plan.service_cidr)):
            sh("ip", "-n", node, "route", "add", cidr, "via", a.backends)
        sh("ip", "-n", backends, "route", "add", "local", endpoints, "dev", "lo")
        sh("ip", "-n", backends, "route", "add", "default", "via", a.node_backend)
        # The no-proxy NodePort floor: the external client reaches a backend directly.
        sh("ip", "-n", ext, "route", "add", endpoints, "via", a.node)
        self._pod_routes(node, backends, pod, nodad)
        for netns in (ext, backends, pod):
            self.offload(netns, "eth0", False)
            attach_xdp_pass(self, netns, ["eth0"])
        for name in ("lb", "plain"):
            self.cgroups[name] = Cgroup.create(f"{self.prefix}-{name}")

    def _pod_routes(self, node: str, backends: str, pod: str, nodad: tuple[str, ...]) -> None:
        """The pod: its address on its eth0, a default route through the node; the node
        routes its address to pod0 (more specific than the pod network's route to the
        backends). The backends namespace owns the whole pod network as local addresses,
        and the local table is looked up first: a rule before it sends what is addressed
        to the pod back through the node."""
        ipv6 = self.family is Family.IPV6
        address, width = self.pod_address, 128 if ipv6 else 32
        sh("ip", "-n", pod, "addr", "add", f"{address}/{width}", "dev", "eth0", *nodad)
        if ipv6:  # a gateway on the link itself: neighbour discovery answers only for those
            gateway = "fe80::1"
            sh("ip", "-n", node, "addr", "add", f"{gateway}/64", "dev", POD_LINK, *nodad)
        else:  # any node address: ARP answers for it on every link
            gateway = self.addresses.node
            sh("ip", "-n", pod, "route", "add", gateway, "dev", "eth0")
        sh("ip", "-n", pod, "route", "add", "default", "via", gateway, "dev", "eth0")
        sh("ip", "-n", node, "route", "add", f"{address}/{width}", "dev", POD_LINK)
        family = "-6" if ipv6 else "-4"
        sh("ip", family, "-n", backends, "rule", "add", "pref", "10", "to", address,
           "lookup", "main")  # fmt: skip
        sh("ip", family, "-n", backends, "rule", "add", "pref", "100", "lookup", "local")
        sh("ip", family, "-n", backends, "rule", "del", "pref", "0")

    def flush_conntrack(self) -> None:
        """Forget the node's connection tracking state (kube-proxy modes NAT through it)."""
        # conntrack exits 1 when there was nothing to flush on some versions: not an error.
        # Its flush is of one family (IPv4 unless -f says otherwise).
        family = ["-f", "ipv6"] if self.family is Family.IPV6 else []
        subprocess.run(
            ["nsenter", f"--net=/run/netns/{self.node}", "conntrack", "-F", *family],
            capture_output=True,
            timeout=60,
        )

    def close(self) -> None:
        try:
            super().close()
        finally:
            for cgroup in self.cgroups.values():
                cgroup.close()
            self.cgroups.clear()
