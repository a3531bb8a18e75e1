"""Upstream `[sig-network] Services ...` (test/e2e/network/service.go) on external IPs
and nodePorts of two protocols, ported."""

from __future__ import annotations

import pytest

from tests.factories import service
from tests.kernel.e2e.harness import E2E, NODE_IPS, answers, eventually, slice_for

S = "[sig-network] Services "
NOT_ALLOWED = "198.51.100.7"  # TEST-NET-2: outside the agents' --external-ip-cidrs


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should be possible to connect to a service via ExternalIP when the external IP is"
    " not assigned to a node"
)
def test_connect_via_external_ip_not_assigned_to_a_node(e2e: E2E) -> None:
    """With the external IP inside --external-ip-cidrs (the agents': 203.0.113.0/24), a pod
    reaches the Service through it. ebpflb's default differs (CVE-2020-8554: no external IP
    is programmed unless allowed): one outside the list is never programmed."""
    a = e2e.allocate("externalip-test")
    external = f"203.0.113.{a.cluster_ip.split('.')[2]}"
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, externalIPs=[external, NOT_ALLOWED]),
        slice_for(a.name, ["pod11", "pod21"]),
    )
    eventually(
        lambda: (
            set(answers(e2e.from_pod("client2", "tcp", f"{external}:80", 10))) == {"pod11", "pod21"}
        ),
        "the allowed external IP served",
    )
    for node in e2e.shared.nodes.values():
        frontends = {s["frontend"] for s in node.dump()["services"]}
        assert f"{external}:80/TCP" in frontends, node.name
        assert not any(f.startswith(f"{NOT_ALLOWED}:") for f in frontends), node.name
    assert not any(r["ok"] for r in e2e.from_pod("client2", "tcp", f"{NOT_ALLOWED}:80", 2))


@pytest.mark.pod_clients
@pytest.mark.upstream(
    S + "should be able to update service type to NodePort listening on same port number"
    " but different protocols"
)
def test_update_service_type_to_nodeport_on_same_port_different_protocols(e2e: E2E) -> None:
    """A ClusterIP Service on 53/TCP becomes a NodePort Service on 53/TCP and 53/UDP: two
    nodePorts, each serving its protocol on every node."""
    a = e2e.allocate("nodeport-update-service")
    tcp = {"name": "tcp-port", "protocol": "TCP", "port": 53, "targetPort": 8080}
    udp = {"name": "udp-port", "protocol": "UDP", "port": 53, "targetPort": 8080}
    slice_ports = [
        {"name": "tcp-port", "protocol": "TCP", "port": 8080},
        {"name": "udp-port", "protocol": "UDP", "port": 8080},
    ]
    e2e.apply(
        service(a.name, cluster_ip=a.cluster_ip, ports=[tcp]),
        slice_for(a.name, ["pod22"], slice_ports),
    )
    eventually(
        lambda: answers(e2e.from_pod("client1", "tcp", f"{a.cluster_ip}:53")) == ["pod22"],
        "ClusterIP served",
    )
    tcp_np, udp_np = a.node_ports[0], a.node_ports[1]
    e2e.apply(
        service(
            a.name,
            cluster_ip=a.cluster_ip,
            type="NodePort",
            ports=[{**tcp, "nodePort": tcp_np}, {**udp, "nodePort": udp_np}],
        )
    )
    for ip in NODE_IPS.values():
        for mode, port in (("tcp", tcp_np), ("udp", udp_np)):
            target = f"{ip}:{port}"
            eventually(
                lambda m=mode, t=target: answers(e2e.from_outside(m, t, 2)) == ["pod22"] * 2,
                f"{mode} {target}",
            )
