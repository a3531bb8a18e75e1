"""Builders for Service and EndpointSlice objects in the API's JSON shape."""

from __future__ import annotations

from typing import Any


def service(
    name: str = "web",
    namespace: str = "default",
    cluster_ip: str = "10.96.0.10",
    ports: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "clusterIP": cluster_ip,
            "ports": ports
            if ports is not None
            else [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
            **spec,
        },
    }
    return body


def endpoint(
    ip: str,
    ready: bool | None = True,
    serving: bool | None = None,
    terminating: bool | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    conditions: dict[str, Any] = {}
    if ready is not None:
        conditions["ready"] = ready
    if serving is not None:
        conditions["serving"] = serving
    if terminating is not None:
        conditions["terminating"] = terminating
    ep: dict[str, Any] = {"addresses": [ip], "conditions": conditions}
    if node:
        ep["nodeName"] = node
    return ep


def endpoint_slice(
    name: str = "web-1",
    service_name: str = "web",
    namespace: str = "default",
    endpoints: list[dict[str, Any]] | None = None,
    ports: list[dict[str, Any]] | None = None,
    address_type: str = "IPv4",
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": address_type,
        "ports": ports if ports is not None else [{"name": "http", "port": 8080}],
        "endpoints": endpoints
        if endpoints is not None
        else [endpoint("10.244.1.11"), endpoint("10.244.1.12"), endpoint("10.244.1.13")],
    }
