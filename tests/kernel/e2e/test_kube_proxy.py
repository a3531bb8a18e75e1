"""Upstream `[sig-network] Networking should check kube-proxy urls` (test/e2e/network/
networking.go), ported: from the node's network (a hostNetwork pod's curl to localhost),
the health port's /healthz answers 200 with `lastUpdated` in its body, and the metrics
port's /proxyMode answers 200."""

from __future__ import annotations

import json

import pytest

from lab.harness.nshttp import http_get
from tests.kernel.e2e.harness import E2E, HEALTHZ_PORT, METRICS_PORT


@pytest.mark.upstream("[sig-network] Networking should check kube-proxy urls")
def test_check_kube_proxy_urls(e2e: E2E) -> None:
    for node in e2e.shared.nodes.values():
        status, _headers, body = http_get("127.0.0.1", HEALTHZ_PORT, "/healthz", netns=node.netns)
        assert status == 200, (node.name, body[:200])
        assert "lastUpdated" in json.loads(body), node.name
        status, _headers, body = http_get("127.0.0.1", METRICS_PORT, "/proxyMode", netns=node.netns)
        assert status == 200, (node.name, body[:200])
        assert body.strip(), node.name  # names the mode (kube-proxy: iptables, ipvs, ...)
