"""Names kube-proxy's proxiers derive from a service port: the hashes behind the iptables
chain names (KUBE-SVC/EXT/SEP-<base32 sha256>) and the nftables chain names
(service-/external-/endpoint-<hash>-<name>), and the service-port model both generators
take (a BenchService, or a kube-proxy test's service port).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from ebpflb.bench.scenario import NAMESPACE, PORT, PORT_NAME, TARGET_PORT, BenchService

MASQ_MARK = "0x00004000"  # fmt.Sprintf("%#08x", 1<<14): Go counts the 8 digits without 0x


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One TCP service port as the proxiers see it (BenchService, or a kube-proxy test's)."""

    namespace: str
    name: str
    port_name: str
    cluster_ip: str
    endpoints: tuple[str, ...]  # ready endpoint IPs, in EndpointSlice order
    port: int = PORT
    target_port: int = TARGET_PORT
    node_port: int | None = None
    protocol: str = "tcp"

    @classmethod
    def of(cls, svc: BenchService | ServicePort) -> ServicePort:
        if isinstance(svc, ServicePort):
            return svc
        return cls(NAMESPACE, svc.name, PORT_NAME, svc.vip, svc.endpoints, node_port=svc.node_port)

    @property
    def port_name_string(self) -> str:
        """proxy.ServicePortName.String(): namespace/name:port."""
        return f"{self.namespace}/{self.name}:{self.port_name}"

    def with_ready(self, ready: int) -> ServicePort:
        if not 1 <= ready <= len(self.endpoints):
            raise ValueError(f"ready must be between 1 and {len(self.endpoints)}")
        return ServicePort(
            self.namespace,
            self.name,
            self.port_name,
            self.cluster_ip,
            self.endpoints[:ready],
            self.port,
            self.target_port,
            self.node_port,
            self.protocol,
        )


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


def ext_chain(svc: ServicePort) -> str:
    return "KUBE-EXT-" + portproto_hash(svc.port_name_string, svc.protocol)


def sep_chain(svc: ServicePort, ip: str) -> str:
    endpoint = f"{ip}:{svc.target_port}"
    return "KUBE-SEP-" + endpoint_hash(svc.port_name_string, svc.protocol, endpoint)


def _nft_base(svc: ServicePort) -> str:
    return nft_name_base(f"{svc.namespace}/{svc.name}/{svc.protocol}/{svc.port_name}")


def nft_service_chain(svc: ServicePort) -> str:
    return "service-" + _nft_base(svc)


def nft_external_chain(svc: ServicePort) -> str:
    return "external-" + _nft_base(svc)


def nft_endpoint_chain(svc: ServicePort, ip: str) -> str:
    name = f"{svc.namespace}/{svc.name}/{svc.protocol}/{svc.port_name}__{ip}/{svc.target_port}"
    return "endpoint-" + nft_name_base(name)


def service_ports(services: Iterable[BenchService | ServicePort]) -> list[ServicePort]:
    return [ServicePort.of(s) for s in services]


def changed(
    ports: list[ServicePort], changed_index: int, ready: int
) -> tuple[list[ServicePort], ServicePort, ServicePort]:
    """(services after the change, the changed service before, and after)."""
    before = ports[changed_index]
    after = before.with_ready(ready)
    return [*ports[:changed_index], after, *ports[changed_index + 1 :]], before, after
