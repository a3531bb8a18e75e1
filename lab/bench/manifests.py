"""The bench's services as one manifest file, for `ebpflb bench sync --source manifests`.

Written from a text template (what `kubectl get -o yaml` or `helm template` would give:
block style, one document per object), since PyYAML's dumper takes longer for 20,000
documents than the agent may take to program them. tests/unit/k8s/test_manifest_parsing.py
checks that each document reads back as scenario.py's objects.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.bench.scenario import (
    AFFINITY_TIMEOUT,
    AGENT_NODE,
    BACKEND_NODE,
    NAMESPACE,
    PORT,
    PORT_NAME,
    TARGET_PORT,
    BenchService,
    Family,
)


def service_text(svc: BenchService) -> str:
    lines = [
        "apiVersion: v1",
        "kind: Service",
        "metadata:",
        f"  name: {svc.name}",
        f"  namespace: {NAMESPACE}",
        "spec:",
        f"  type: {'NodePort' if svc.node_port is not None else 'ClusterIP'}",
        f"  clusterIP: {svc.vip}",
        "  clusterIPs:",
        f"  - {svc.vip}",
        "  ipFamilies:",
        f"  - {svc.family.kubernetes}",
        "  ipFamilyPolicy: SingleStack",
        "  ports:",
        f"  - name: {PORT_NAME}",
        "    protocol: TCP",
        f"    port: {PORT}",
        f"    targetPort: {TARGET_PORT}",
    ]
    if svc.node_port is not None:
        lines.insert(7, f"  externalTrafficPolicy: {'Local' if svc.external_local else 'Cluster'}")
        lines.append(f"    nodePort: {svc.node_port}")
    if svc.internal_local:
        lines.append("  internalTrafficPolicy: Local")
    if svc.affinity:
        lines += [
            "  sessionAffinity: ClientIP",
            "  sessionAffinityConfig:",
            "    clientIP:",
            f"      timeoutSeconds: {AFFINITY_TIMEOUT}",
        ]
    return "\n".join(lines) + "\n"


def slice_text(svc: BenchService, not_ready: int = 0) -> str:
    """The service's one EndpointSlice; the last `not_ready` endpoints are not ready."""
    ready_count = svc.endpoint_count - not_ready
    local = set(svc.local_endpoints)
    lines = [
        "apiVersion: discovery.k8s.io/v1",
        "kind: EndpointSlice",
        "metadata:",
        f"  name: {svc.name}-bench",
        f"  namespace: {NAMESPACE}",
        "  labels:",
        f"    kubernetes.io/service-name: {svc.name}",
        f"addressType: {svc.family.kubernetes}",
        "ports:",
        f"- name: {PORT_NAME}",
        "  protocol: TCP",
        f"  port: {TARGET_PORT}",
        "endpoints:",
    ]
    for i, ip in enumerate(svc.endpoints):
        lines += [
            "- addresses:",
            f"  - {ip}",
            "  conditions:",
            f"    ready: {'true' if i < ready_count else 'false'}",
            f"  nodeName: {AGENT_NODE if ip in local else BACKEND_NODE}",
        ]
    return "\n".join(lines) + "\n"


def documents(services: Sequence[BenchService]) -> list[str]:
    """Each service's Service, then its EndpointSlice (scenario.objects' order)."""
    return [text for svc in services for text in (service_text(svc), slice_text(svc))]


def manifest_text(services: Sequence[BenchService]) -> str:
    return "---\n".join(documents(services))


@dataclass
class ManifestFile:
    """The file the agent reads, and its documents as last written."""

    path: Path
    documents: list[str]

    @classmethod
    def write(cls, path: Path, services: Sequence[BenchService]) -> ManifestFile:
        written = cls(path, documents(services))
        path.write_text("---\n".join(written.documents))
        return written

    def write_change(self, slice_object: Mapping[str, Any]) -> None:
        """Replace one service's EndpointSlice document by `slice_object` and write the
        file as a ConfigMap update or `kubectl`-style tooling does: a new file renamed over
        the old, so the agent never reads it half-written."""
        name = slice_object["metadata"]["labels"]["kubernetes.io/service-name"]
        index = int(name.removeprefix("svc-"))  # scenario's names: svc-NNNNNN
        not_ready = sum(1 for e in slice_object["endpoints"] if not e["conditions"]["ready"])
        family = next(f for f in Family if f.kubernetes == slice_object["addressType"])
        svc = BenchService(index, len(slice_object["endpoints"]), family=family)
        self.documents[2 * index + 1] = slice_text(svc, not_ready=not_ready)
        staged = self.path.with_name(f".{self.path.name}.new")
        staged.write_text("---\n".join(self.documents))
        os.replace(staged, self.path)
