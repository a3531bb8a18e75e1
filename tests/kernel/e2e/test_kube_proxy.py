"""Upstream `[sig-network] Networking should check kube-proxy urls` (test/e2e/network/
networking.go), ported: from the node's network (a hostNetwork pod's curl to localhost),
the health port's /healthz answers 200 with `lastUpdated` in its body, and the metrics
port's /proxyMode answers 200."""

from __future__ import annotations

import json

import pytest

from lab.harness.agentproc import Scrape
from lab.harness.nshttp import http_get
from tests.factories import service
from tests.kernel.e2e.harness import (
    E2E,
    HEALTHZ_PORT,
    METRICS_PORT,
    answers,
    eventually,
    slice_for,
)


@pytest.mark.upstream("[sig-network] Networking should check kube-proxy urls")
def test_check_kube_proxy_urls(e2e: E2E) -> None:
    for node in e2e.shared.nodes.values():
        status, _headers, body = http_get("127.0.0.1", HEALTHZ_PORT, "/healthz", netns=node.netns)
        assert status == 200, (node.name, body[:200])
        assert "lastUpdated" in json.loads(body), node.name
        status, _headers, body = http_get("127.0.0.1", METRICS_PORT, "/proxyMode", netns=node.netns)
        assert status == 200, (node.name, body[:200])
        assert body.strip(), node.name  # names the mode (kube-proxy: iptables, ipvs, ...)


TRANSLATIONS = "ebpflb_service_socket_translations_total"


@pytest.mark.upstream(
    "[sig-network] KubeProxy should update metric for tracking accepted packets destined for"
    " localhost nodeports"
)
def test_update_metric_for_localhost_nodeports(e2e: E2E) -> None:
    """A hostNetwork client reaches a NodePort Service on 127.0.0.1:nodePort, and the
    proxy's metric for that traffic grows by as much. kube-proxy's iptables mode counts the
    packets its localhost-nodePort accept rule matched; ebpflb translates such a connection
    at connect() (socket-LB), so no packet is counted: its per-frontend counter of
    translations for the 127.0.0.1:nodePort frontend is the metric read here."""
    a = e2e.allocate("svc-localhost-nodeport")
    node_port = a.node_ports[0]
    port = {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}
    e2e.apply(
        service(
            a.name,
            cluster_ip=a.cluster_ip,
            type="NodePort",
            ports=[{**port, "nodePort": node_port}],
        ),
        slice_for(a.name, ["pod11"]),
    )
    netns = e2e.shared.nodes["node1"].netns
    frontend = f"127.0.0.1:{node_port}"

    def translations() -> float:
        status, _headers, body = http_get("127.0.0.1", METRICS_PORT, "/metrics", netns=netns)
        assert status == 200
        return Scrape.parse(body.decode()).sum(TRANSLATIONS, frontend=frontend)

    def served(count: int) -> bool:
        return answers(e2e.from_host("node1", "tcp", frontend, count)) == ["pod11"] * count

    eventually(lambda: served(1), f"{frontend} served")
    before = translations()
    assert served(5)
    assert translations() - before == 5
