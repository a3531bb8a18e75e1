"""The benchmark's services: one address scheme shared by every mode and every generator.

N Services named bench/svc-NNNNNN, each one TCP port 80 -> targetPort 8080 with K endpoints.
Addresses are arithmetic so that a compiled client can pick "service i" without a table:

- ClusterIP of service i:          10.96.0.0 + i + 1           (inside 10.96.0.0/12)
- endpoint e of service i:          10.128.0.0 + e * 2**17 + i + 1  (block e is a /15)

With `--family ipv6` (Family.IPV6) the same arithmetic runs in unique local ranges of the
same sizes: ClusterIPs in fd00:96::/108, endpoints in fd00:128::/107 (PLANS); the Services
are single-stack IPv6 (ipFamilies [IPv6]) and their EndpointSlices addressType IPv6.

Up to 16 endpoints per service (10.128.0.0/11): `bench sync`'s million endpoints are
100,000 services x 10.

Every endpoint block is one "pod network" behind the bench's backend namespace, which
accepts the whole 10.128.0.0/11 locally (an AnyIP route), so 100,000 services need no
100,000 interface addresses. The last service is also a NodePort service (the others are
ClusterIP only: a cluster has 2,768 NodePorts at most), so a NodePort packet in iptables
mode walks all of KUBE-SERVICES before KUBE-NODEPORTS, as it does on a real node.

The default services use none of the semantics that change the rules' shape. A mix
(`ebpflb bench --mix affinity,local`) makes every 4th service one of these kinds, both in
the objects ebpflb reads and in kube-proxy's rulesets (the last service, the data plane's
NodePort target, always stays as above):

- Mix.AFFINITY, index % 4 == 0: sessionAffinity ClientIP, timeoutSeconds 10800. The first
  service is one, so the "first service" latency includes the affinity lookup.
- Mix.LOCAL, index % 4 == 1: internalTrafficPolicy Local.
- Mix.LOCAL, index % 4 == 2: also a NodePort (NODE_PORT + 1 + index // 4, while the NodePort
  range lasts: 2,687 services) with externalTrafficPolicy Local.

A Local-policy service's endpoints are all on the agent's node (AGENT_NODE) except the last,
so "only the local ones" is a strict, non-empty subset; the bench's endpoint changes drop
the last endpoint, so a Local service never loses its local endpoints.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network
from typing import Any

from ebpflb.errors import ConfigError

NAMESPACE = "bench"
PORT_NAME = "http"
PORT, TARGET_PORT = 80, 8080
NODE_PORT = 30080
SERVICE_CIDR = IPv4Network("10.96.0.0/12")
ENDPOINT_CIDR = IPv4Network("10.128.0.0/11")  # 10.128-10.159: clear of SERVICE_CIDR
ENDPOINT_BLOCK_BITS = 17  # one /15 per endpoint index
MAX_ENDPOINTS = 1 << (32 - ENDPOINT_CIDR.prefixlen - ENDPOINT_BLOCK_BITS)  # 16
MAX_SERVICES = (1 << ENDPOINT_BLOCK_BITS) - 2  # 131070: every address stays in its block
# The cluster's pod CIDR as kube-proxy's --cluster-cidr sees it (masquerade decisions).
CLUSTER_CIDR = str(ENDPOINT_CIDR)
# EndpointSlices name a node other than the agent's: backends are remote, so NodePort
# traffic is SNATed by ebpflb as kube-proxy masquerades it (externalTrafficPolicy Cluster).
AGENT_NODE = "bench-node"
BACKEND_NODE = "bench-backends"
AFFINITY_TIMEOUT = 10800  # sessionAffinityConfig.clientIP.timeoutSeconds (the API's default)
NODE_PORT_MAX = 32767  # the end of the default --service-node-port-range
MIX_EVERY = 4


class Family(StrEnum):
    """The IP family of a bench run (`--family`): every address of the run is of it."""

    IPV4 = "ipv4"
    IPV6 = "ipv6"

    @property
    def kubernetes(self) -> str:
        """The name in ipFamilies and an EndpointSlice's addressType."""
        return "IPv4" if self is Family.IPV4 else "IPv6"


@dataclass(frozen=True)
class AddressPlan:
    """Where a family's ClusterIPs and endpoints are: the arithmetic above, in its ranges."""

    family: Family
    service_cidr: IPv4Network | IPv6Network
    endpoint_cidr: IPv4Network | IPv6Network

    @property
    def cluster_cidr(self) -> str:
        """kube-proxy's --cluster-cidr for this family (masquerade decisions)."""
        return str(self.endpoint_cidr)

    def vip(self, index: int) -> IPv4Address | IPv6Address:
        return self.service_cidr.network_address + index + 1

    def endpoint(self, index: int, e: int) -> IPv4Address | IPv6Address:
        return self.endpoint_cidr.network_address + (e << ENDPOINT_BLOCK_BITS) + index + 1


def _v6(cidr: str, like: IPv4Network) -> IPv6Network:
    """An IPv6 range as large as `like`, so the limits above hold in both families."""
    network = ip_network(cidr)
    assert isinstance(network, IPv6Network)
    assert 128 - network.prefixlen == 32 - like.prefixlen, cidr
    return network


PLANS = {
    Family.IPV4: AddressPlan(Family.IPV4, SERVICE_CIDR, ENDPOINT_CIDR),
    Family.IPV6: AddressPlan(
        Family.IPV6, _v6("fd00:96::/108", SERVICE_CIDR), _v6("fd00:128::/107", ENDPOINT_CIDR)
    ),
}


class Mix(StrEnum):
    """Kinds of services `--mix` adds to the bench (see the module's docstring)."""

    AFFINITY = "affinity"
    LOCAL = "local"


def parse_mix(text: str) -> tuple[Mix, ...]:
    """--mix: comma-separated kinds."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in {m.value for m in Mix}]
    if unknown:
        raise ConfigError(f"--mix: unknown kind {unknown[0]!r}: one of {', '.join(Mix)}")
    return tuple(dict.fromkeys(Mix(name) for name in names))


def vip(index: int, family: Family = Family.IPV4) -> IPv4Address | IPv6Address:
    return PLANS[family].vip(index)


def endpoint(index: int, e: int, family: Family = Family.IPV4) -> IPv4Address | IPv6Address:
    return PLANS[family].endpoint(index, e)


@dataclass(frozen=True, slots=True)
class BenchService:
    index: int
    endpoint_count: int
    node_port: int | None = None
    affinity: bool = False  # sessionAffinity ClientIP, AFFINITY_TIMEOUT
    internal_local: bool = False  # internalTrafficPolicy Local
    external_local: bool = False  # externalTrafficPolicy Local (a NodePort service)
    family: Family = Family.IPV4
    protocol: str = "TCP"  # as Kubernetes spells it: TCP or UDP (bench pps floods UDP)

    @property
    def local_policy(self) -> bool:
        return self.internal_local or self.external_local

    @property
    def name(self) -> str:
        return f"svc-{self.index:06d}"

    @property
    def vip(self) -> str:
        return str(vip(self.index, self.family))

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(str(endpoint(self.index, e, self.family)) for e in range(self.endpoint_count))

    @property
    def local_endpoints(self) -> tuple[str, ...]:
        """The endpoints on the agent's node: all but the last for a Local-policy service
        (the others' endpoints are all remote, as in the default bench)."""
        return self.endpoints[:-1] if self.local_policy else ()

    @property
    def port_name(self) -> str:
        """kube-proxy's ServicePortName string: namespace/name:port."""
        return f"{NAMESPACE}/{self.name}:{PORT_NAME}"


def bench_services(
    count: int,
    endpoints: int,
    *,
    node_port: bool = True,
    mix: tuple[Mix, ...] = (),
    family: Family = Family.IPV4,
) -> list[BenchService]:
    """N services of `family`; the last one is also a NodePort service (port NODE_PORT) if
    node_port; `mix` makes every MIX_EVERY-th of the others an affinity or a Local-policy
    service."""
    if not 1 <= count <= MAX_SERVICES:
        raise ConfigError(f"--services: between 1 and {MAX_SERVICES} (the address blocks' size)")
    if not 2 <= endpoints <= MAX_ENDPOINTS:
        raise ConfigError(f"--endpoints: between 2 and {MAX_ENDPOINTS} per service")
    services = []
    for i in range(count):
        if i == count - 1:
            services.append(
                BenchService(i, endpoints, NODE_PORT if node_port else None, family=family)
            )
            continue
        kind = i % MIX_EVERY
        extra_node_port = NODE_PORT + 1 + i // MIX_EVERY
        external_local = Mix.LOCAL in mix and kind == 2 and extra_node_port <= NODE_PORT_MAX
        services.append(
            BenchService(
                i,
                endpoints,
                extra_node_port if external_local else None,
                affinity=Mix.AFFINITY in mix and kind == 0,
                internal_local=Mix.LOCAL in mix and kind == 1,
                external_local=external_local,
                family=family,
            )
        )
    return services


# ---- Kubernetes objects (the agent's input, through manifests or the API) -----------------


def service_object(svc: BenchService) -> dict[str, Any]:
    port: dict[str, Any] = {
        "name": PORT_NAME,
        "protocol": svc.protocol,
        "port": PORT,
        "targetPort": TARGET_PORT,
    }
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "clusterIP": svc.vip,
        "clusterIPs": [svc.vip],
        "ipFamilies": [svc.family.kubernetes],
        "ipFamilyPolicy": "SingleStack",
        "ports": [port],
    }
    if svc.node_port is not None:
        spec["type"] = "NodePort"
        spec["externalTrafficPolicy"] = "Local" if svc.external_local else "Cluster"
        port["nodePort"] = svc.node_port
    if svc.internal_local:
        spec["internalTrafficPolicy"] = "Local"
    if svc.affinity:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": AFFINITY_TIMEOUT}}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc.name, "namespace": NAMESPACE},
        "spec": spec,
    }


def slice_object(svc: BenchService, not_ready: int = 0) -> dict[str, Any]:
    """The service's one EndpointSlice; the last `not_ready` endpoints are not ready."""
    ready_count = svc.endpoint_count - not_ready
    local = set(svc.local_endpoints)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{svc.name}-bench",
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": svc.name},
        },
        "addressType": svc.family.kubernetes,
        "ports": [{"name": PORT_NAME, "protocol": svc.protocol, "port": TARGET_PORT}],
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": i < ready_count},
                "nodeName": AGENT_NODE if ip in local else BACKEND_NODE,
            }
            for i, ip in enumerate(svc.endpoints)
        ],
    }


def objects(services: list[BenchService]) -> Iterator[dict[str, Any]]:
    for svc in services:
        yield service_object(svc)
        yield slice_object(svc)
