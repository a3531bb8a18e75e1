"""Names kube-proxy's proxiers derive from a service port: the hashes behind the iptables
chain names (KUBE-SVC/SVL/EXT/SEP-<base32 sha256>) and the nftables chain and set names
(service-/local-/external-/endpoint-/affinity-<hash>-<name>), and the service-port model both
generators take (a BenchService, or a kube-proxy test's service port), with its endpoints
split by traffic policy as pkg/proxy/topology.go's CategorizeEndpoints does (ready
endpoints only, no topology hints).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import ip_address

from ebpflb.model import host_port
from lab.bench.scenario import (
    AFFINITY_TIMEOUT,
    NAMESPACE,
    PORT,
    PORT_NAME,
    TARGET_PORT,
    BenchService,
    Family,
)

MASQ_MARK = "0x00004000"  # fmt.Sprintf("%#08x", 1<<14): Go counts the 8 digits without 0x


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One service port as the proxiers see it (BenchService, or a kube-proxy test's)."""

    namespace: str
    name: str
    port_name: str
    cluster_ip: str
    endpoints: tuple[str, ...]  # ready endpoint IPs, in EndpointSlice order
    port: int = PORT
    target_port: int = TARGET_PORT
    node_port: int | None = None
    protocol: str = "tcp"
    affinity_seconds: int | None = None  # sessionAffinity ClientIP's timeout; None: no affinity
    internal_local: bool = False  # internalTrafficPolicy Local
    external_local: bool = False  # externalTrafficPolicy Local (needs a node_port here)
    local: tuple[str, ...] = ()  # endpoints whose nodeName is this node's

    def __post_init__(self) -> None:
        if self.external_local and self.node_port is None:
            raise ValueError(f"{self.port_name_string}: an external Local policy needs a NodePort")
        if self.uses_local and not self.local_endpoints:
            # kube-proxy's "has no local endpoints" DROP rules are not modelled.
            raise ValueError(f"{self.port_name_string}: a Local policy without local endpoints")

    @classmethod
    def of(cls, svc: BenchService | ServicePort) -> ServicePort:
        if isinstance(svc, ServicePort):
            return svc
        return cls(
            NAMESPACE,
            svc.name,
            PORT_NAME,
            svc.vip,
            svc.endpoints,
            node_port=svc.node_port,
            protocol=svc.protocol.lower(),
            affinity_seconds=AFFINITY_TIMEOUT if svc.affinity else None,
            internal_local=svc.internal_local,
            external_local=svc.external_local,
            local=svc.local_endpoints,
        )

    @property
    def port_name_string(self) -> str:
        """proxy.ServicePortName.String(): namespace/name, then :port if the port has a name."""
        port = f":{self.port_name}" if self.port_name else ""
        return f"{self.namespace}/{self.name}{port}"

    @property
    def family(self) -> Family:
        return Family.IPV4 if ip_address(self.cluster_ip).version == 4 else Family.IPV6

    def endpoint_string(self, ip: str) -> str:
        """BaseEndpointInfo.String(): ip:port, [ip]:port for IPv6 (net.JoinHostPort)."""
        return host_port(ip_address(ip), self.target_port)

    @property
    def local_endpoints(self) -> tuple[str, ...]:
        return tuple(ip for ip in self.endpoints if ip in self.local)

    @property
    def uses_cluster(self) -> bool:
        """UsesClusterEndpoints: a Cluster internal policy, or any external traffic (an
        external Local policy still short-circuits in-cluster clients to all endpoints)."""
        return not self.internal_local or self.node_port is not None

    @property
    def uses_local(self) -> bool:
        """UsesLocalEndpoints."""
        return self.internal_local or (self.external_local and self.node_port is not None)

    @property
    def reachable(self) -> tuple[str, ...]:
        """allLocallyReachableEndpoints: the endpoints that get a KUBE-SEP / endpoint chain."""
        return self.endpoints if self.uses_cluster else self.local_endpoints

    def with_ready(self, ready: int) -> ServicePort:
        if not 1 <= ready <= len(self.endpoints):
            raise ValueError(f"ready must be between 1 and {len(self.endpoints)}")
        return dataclasses.replace(self, endpoints=self.endpoints[:ready])


def _b32sha(text: str) -> str:
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()


def portproto_hash(port_name_string: str, protocol: str) -> str:
    """iptables portProtoHash: base32(sha256(servicePortName + protocol))[:16]."""
    return _b32sha(port_name_string + protocol)[:16]


def endpoint_hash(port_name_string: str, protocol: str, endpoint: str) -> str:
    """iptables servicePortEndpointChainName's hash; endpoint is "ip:port"."""
    return _b32sha(port_name_string + protocol + endpoint)[:16]


def nft_name_base(name: str) -> str:
    """nftables hashAndTruncate: base32(sha256(name))[:8] + "-" + name (never truncated
    here: names stay far below knftables' 256-16 characters)."""
    return _b32sha(name)[:8] + "-" + name


def svc_chain(svc: ServicePort) -> str:
    return "KUBE-SVC-" + portproto_hash(svc.port_name_string, svc.protocol)


def svl_chain(svc: ServicePort) -> str:
    """The Local policy chain (localPolicyChainName)."""
    return "KUBE-SVL-" + portproto_hash(svc.port_name_string, svc.protocol)


def ext_chain(svc: ServicePort) -> str:
    return "KUBE-EXT-" + portproto_hash(svc.port_name_string, svc.protocol)


def sep_chain(svc: ServicePort, ip: str) -> str:
    endpoint = svc.endpoint_string(ip)
    return "KUBE-SEP-" + endpoint_hash(svc.port_name_string, svc.protocol, endpoint)


def _nft_base(svc: ServicePort) -> str:
    return nft_name_base(f"{svc.namespace}/{svc.name}/{svc.protocol}/{svc.port_name}")


def nft_service_chain(svc: ServicePort) -> str:
    return "service-" + _nft_base(svc)


def nft_local_chain(svc: ServicePort) -> str:
    return "local-" + _nft_base(svc)


def nft_external_chain(svc: ServicePort) -> str:
    return "external-" + _nft_base(svc)


def _nft_endpoint_base(svc: ServicePort, ip: str) -> str:
    host = ip.replace(":", ".")  # colons are not allowed in nft names (IPv6)
    name = f"{svc.namespace}/{svc.name}/{svc.protocol}/{svc.port_name}__{host}/{svc.target_port}"
    return nft_name_base(name)


def nft_endpoint_chain(svc: ServicePort, ip: str) -> str:
    return "endpoint-" + _nft_endpoint_base(svc, ip)


def nft_affinity_set(svc: ServicePort, ip: str) -> str:
    """The endpoint's affinity set (affinitySetName): the endpoint chain's name base."""
    return "affinity-" + _nft_endpoint_base(svc, ip)


def service_ports(
    services: Iterable[BenchService | ServicePort], family: Family = Family.IPV4
) -> list[ServicePort]:
    """The services as ServicePorts, all of `family` (one proxier serves one family)."""
    ports = [ServicePort.of(s) for s in services]
    for p in ports:
        if p.family is not family:
            raise ValueError(f"{p.port_name_string}: {p.cluster_ip} is not {family}")
    return ports


def changed(
    ports: list[ServicePort], changed_index: int, ready: int
) -> tuple[list[ServicePort], ServicePort, ServicePort]:
    """(services after the change, the changed service before, and after)."""
    before = ports[changed_index]
    after = before.with_ready(ready)
    return [*ports[:changed_index], after, *ports[changed_index + 1 :]], before, after
