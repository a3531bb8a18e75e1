"""The benchmark's own network: three namespaces, made and removed by `ebpflb bench`.

    external (10.240.0.2) --eth0-- node --eth1-- backends (10.250.0.2, owns 10.128.0.0/11)
                                   10.240.0.1 / 10.250.0.1

- node: where the proxy under test runs and the ClusterIP client connects from. It routes
  the pod network and the service CIDR to the backends namespace; nothing routes out of
  the topology, so an untranslated ClusterIP packet dies in the backends namespace (which
  neither owns nor forwards 10.96.0.0/12).
- backends: one server answers every endpoint address (an AnyIP route for the whole pod
  network), so 100,000 services need no 100,000 pods.
- external: the NodePort client, on the node's "physical" link.

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

from ebpflb.bench import scenario
from ebpflb.testing.netns import Cgroup, Namespaces, attach_xdp_pass, sh

NODE_IP = "10.240.0.1"
EXTERNAL_IP = "10.240.0.2"
NODE_BACKEND_IP = "10.250.0.1"
BACKENDS_IP = "10.250.0.2"
NODE_INTERFACES = ("eth0", "eth1")  # external side, backend side


@dataclass
class BenchTopology(Namespaces):
    cgroups: dict[str, Cgroup] = field(default_factory=dict)

    @classmethod
    def create(cls) -> BenchTopology:
        topo = cls(f"ebpflb-bench-{uuid.uuid4().hex[:6]}")
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
    def lb_cgroup(self) -> Cgroup:
        return self.cgroups["lb"]

    @property
    def plain_cgroup(self) -> Cgroup:
        return self.cgroups["plain"]

    def _build(self) -> None:
        node = self.add_namespace("node", forwarding=True)
        ext = self.add_namespace("ext")
        backends = self.add_namespace("be")
        self.link(node, "eth0", ext, "eth0")
        self.link(node, "eth1", backends, "eth0")
        sh("ip", "-n", node, "addr", "add", f"{NODE_IP}/24", "dev", "eth0")
        sh("ip", "-n", ext, "addr", "add", f"{EXTERNAL_IP}/24", "dev", "eth0")
        sh("ip", "-n", node, "addr", "add", f"{NODE_BACKEND_IP}/24", "dev", "eth1")
        sh("ip", "-n", backends, "addr", "add", f"{BACKENDS_IP}/24", "dev", "eth0")
        for cidr in (scenario.ENDPOINT_CIDR, scenario.SERVICE_CIDR):
            sh("ip", "-n", node, "route", "add", str(cidr), "via", BACKENDS_IP)
        sh("ip", "-n", backends, "route", "add", "local", str(scenario.ENDPOINT_CIDR), "dev", "lo")
        sh("ip", "-n", backends, "route", "add", "default", "via", NODE_BACKEND_IP)
        # The no-proxy NodePort floor: the external client reaches a backend directly.
        sh("ip", "-n", ext, "route", "add", str(scenario.ENDPOINT_CIDR), "via", NODE_IP)
        for netns in (ext, backends):
            self.offload(netns, "eth0", False)
            attach_xdp_pass(self, netns, ["eth0"])
        for name in ("lb", "plain"):
            self.cgroups[name] = Cgroup.create(f"{self.prefix}-{name}")

    def flush_conntrack(self) -> None:
        """Forget the node's connection tracking state (kube-proxy modes NAT through it)."""
        # conntrack exits 1 when there was nothing to flush on some versions: not an error.
        subprocess.run(
            ["nsenter", f"--net=/run/netns/{self.node}", "conntrack", "-F"],
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
