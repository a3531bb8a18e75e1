"""The benchmark's services: one address scheme shared by every mode and every generator.

N Services named bench/svc-NNNNNN, each one TCP port 80 -> targetPort 8080 with K endpoints.
Addresses are arithmetic so that a compiled client can pick "service i" without a table:

- ClusterIP of service i:          10.96.0.0 + i + 1           (inside 10.96.0.0/12)
- endpoint e of service i:          10.128.0.0 + e * 2**17 + i + 1  (block e is a /15)

Every endpoint block is one "pod network" behind the bench's backend namespace, which
accepts the whole 10.128.0.0/12 locally (an AnyIP route), so 100,000 services need no
100,000 interface addresses. The last service is also a NodePort service (the others are
ClusterIP only: a cluster has 2,768 NodePorts at most), so a NodePort packet in iptables
mode walks all of KUBE-SERVICES before KUBE-NODEPORTS, as it does on a real node.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from ebpflb.errors import ConfigError

NAMESPACE = "bench"
PORT_NAME = "http"
PORT, TARGET_PORT = 80, 8080
NODE_PORT = 30080
SERVICE_CIDR = IPv4Network("10.96.0.0/12")
ENDPOINT_CIDR = IPv4Network("10.128.0.0/12")
ENDPOINT_BLOCK_BITS = 17  # one /15 per endpoint index
MAX_ENDPOINTS = 1 << (32 - ENDPOINT_CIDR.prefixlen - ENDPOINT_BLOCK_BITS)  # 8
MAX_SERVICES = (1 << ENDPOINT_BLOCK_BITS) - 2  # 131070: every address stays in its block
# The cluster's pod CIDR as kube-proxy's --cluster-cidr sees it (masquerade decisions).
CLUSTER_CIDR = str(ENDPOINT_CIDR)
# EndpointSlices name a node other than the agent's: backends are remote, so NodePort
# traffic is SNATed by ebpflb as kube-proxy masquerades it (externalTrafficPolicy Cluster).
AGENT_NODE = "bench-node"
BACKEND_NODE = "bench-backends"


def vip(index: int) -> IPv4Address:
    return SERVICE_CIDR.network_address + index + 1


def endpoint(index: int, e: int) -> IPv4Address:
    return ENDPOINT_CIDR.network_address + (e << ENDPOINT_BLOCK_BITS) + index + 1


@dataclass(frozen=True, slots=True)
class BenchService:
    index: int
    endpoint_count: int
    node_port: int | None = None

    @property
    def name(self) -> str:
        return f"svc-{self.index:06d}"

    @property
    def vip(self) -> str:
        return str(vip(self.index))

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(str(endpoint(self.index, e)) for e in range(self.endpoint_count))

    @property
    def port_name(self) -> str:
        """kube-proxy's ServicePortName string: namespace/name:port."""
        return f"{NAMESPACE}/{self.name}:{PORT_NAME}"


def bench_services(count: int, endpoints: int, *, node_port: bool = True) -> list[BenchService]:
    """N services; the last one is also a NodePort service (port NODE_PORT) if node_port."""
    if not 1 <= count <= MAX_SERVICES:
        raise ConfigError(f"--services: between 1 and {MAX_SERVICES} (the address blocks' size)")
    if not 2 <= endpoints <= MAX_ENDPOINTS:
        raise ConfigError(f"--endpoints: between 2 and {MAX_ENDPOINTS} per service")
    return [
        BenchService(i, endpoints, NODE_PORT if node_port and i == count - 1 else None)
        for i in range(count)
    ]


# ---- Kubernetes objects (the agent's input, through manifests or the API) -----------------


def service_object(svc: BenchService) -> dict[str, Any]:
    port: dict[str, Any] = {
        "name": PORT_NAME,
        "protocol": "TCP",
        "port": PORT,
        "targetPort": TARGET_PORT,
    }
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "clusterIP": svc.vip,
        "clusterIPs": [svc.vip],
        "ports": [port],
    }
    if svc.node_port is not None:
        spec["type"] = "NodePort"
        spec["externalTrafficPolicy"] = "Cluster"
        port["nodePort"] = svc.node_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc.name, "namespace": NAMESPACE},
        "spec": spec,
    }


def slice_object(svc: BenchService, not_ready: int = 0) -> dict[str, Any]:
    """The service's one EndpointSlice; the last `not_ready` endpoints are not ready."""
    ready_count = svc.endpoint_count - not_ready
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{svc.name}-bench",
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": svc.name},
        },
        "addressType": "IPv4",
        "ports": [{"name": PORT_NAME, "protocol": "TCP", "port": TARGET_PORT}],
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": i < ready_count}, "nodeName": BACKEND_NODE}
            for i, ip in enumerate(svc.endpoints)
        ],
    }


def objects(services: list[BenchService]) -> Iterator[dict[str, Any]]:
    for svc in services:
        yield service_object(svc)
        yield slice_object(svc)
