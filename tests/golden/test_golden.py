"""Golden tables: these manifests -> this `maps dump --json`, on the fake map set.

Each case in cases/*.txtar (as Cilium's txtar tests) holds a comment, the node the agent
runs on (`-- node.yaml --`), the manifests (`-- manifests.yaml --`) and the expected dump
(`-- dump.json --`). The manifests go through the real pipeline: manifests.load ->
translate -> trackers -> desired -> Reconciler (one full apply) on FakeMapSet -> dump.
Ids and table offsets depend on allocation order, not on meaning, so they are replaced by
their order of appearance; the fake's (zero) counters are left out; the sync's errors
(conflicts, invalid objects) are added as "errors".

To regenerate after an intended change: EBPFLB_UPDATE_GOLDEN=1 pytest tests/golden, then
read the diff (git diff tests/golden) before committing it.
"""

from __future__ import annotations

import json
import os
import re
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from ebpflb.datapath.maps import dump
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.desired import DesiredFrontend, ExternalIPPolicy, NodeView, frontends_for_service
from ebpflb.errors import InvalidObjectError
from ebpflb.k8s.sources import manifests
from ebpflb.k8s.sources.base import Kind
from ebpflb.k8s.trackers import EndpointSliceTracker, ServiceTracker, service_state
from ebpflb.k8s.translate import translate_service, translate_slice
from ebpflb.model import Frontend, NamespacedName
from ebpflb.observe.metrics import Metrics
from ebpflb.reconcile import Reconciler

CASES = Path(__file__).parent / "cases"
UPDATE = os.environ.get("EBPFLB_UPDATE_GOLDEN") == "1"
_SECTION = re.compile(r"^-- (\S+) --$", re.MULTILINE)


def parse_txtar(text: str) -> tuple[str, dict[str, str]]:
    """(comment, {file name: content})."""
    parts = _SECTION.split(text)
    return parts[0], {parts[i]: parts[i + 1].lstrip("\n") for i in range(1, len(parts), 2)}


def format_txtar(comment: str, files: dict[str, str]) -> str:
    return comment + "".join(f"-- {name} --\n{body.rstrip()}\n" for name, body in files.items())


def run_case(files: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    node_doc = yaml.safe_load(files.get("node.yaml", "")) or {}
    node = NodeView(
        node_doc.get("name", ""),
        tuple(ip_address(a) for a in node_doc.get("addresses", ())),
        # --external-ip-cidrs: none unless the case allows some (CVE-2020-8554).
        ExternalIPPolicy(tuple(ip_network(c) for c in node_doc.get("externalIPCIDRs", ()))),
    )
    path = tmp_path / "manifests.yaml"
    path.write_text(files["manifests.yaml"])
    snapshot = manifests.load(path)
    errors = [re.sub(re.escape(str(path)), "manifests.yaml", e) for e in snapshot.errors]
    services, slices = ServiceTracker(), EndpointSliceTracker()
    for (kind, _), obj in snapshot.objects.items():
        try:
            if kind is Kind.SERVICE:
                services.update(translate_service(obj))
            else:
                slices.update(translate_slice(obj))
        except InvalidObjectError as exc:
            errors.append(str(exc))
    services.take_changes(), slices.take_changes()  # what a sync reads
    desired: dict[NamespacedName, dict[Frontend, DesiredFrontend]] = {}
    for ref in sorted(services.refs()):
        state = service_state(services, slices, ref)
        frontends = frontends_for_service(state, node) if state is not None else {}
        if frontends:
            desired[ref] = frontends
    maps = FakeMapSet()
    reconciler = Reconciler(maps, metrics=Metrics(CollectorRegistry()))
    reconciler.restore()
    result = reconciler.apply(desired, full=True)
    return normalise(dump.collect(maps, flows=0), errors + result.errors)


def normalise(report: dict[str, Any], errors: list[str]) -> dict[str, Any]:
    svc_ids: dict[int, int] = {}
    backend_ids: dict[int, int] = {}
    for svc in report["services"]:
        svc["svc_id"] = svc_ids.setdefault(svc["svc_id"], len(svc_ids) + 1)
        for backend in svc["backends"]:
            backend["id"] = backend_ids.setdefault(backend["id"], len(backend_ids) + 1)
        del svc["maglev"]["table_offset"]
    for backend in report["backends"]:
        backend["id"] = backend_ids.setdefault(backend["id"], len(backend_ids) + 1)
    del report["counters"]
    return {**report, "errors": errors}


@pytest.mark.parametrize("case", sorted(CASES.glob("*.txtar")), ids=lambda p: p.stem)
def test_golden(case: Path, tmp_path: Path) -> None:
    comment, files = parse_txtar(case.read_text())
    got = json.dumps(run_case(files, tmp_path), indent=2)
    if UPDATE:
        case.write_text(format_txtar(comment, {**files, "dump.json": got}))
        return
    assert "dump.json" in files, f"{case.name}: no expected dump (EBPFLB_UPDATE_GOLDEN=1)"
    assert json.loads(got) == json.loads(files["dump.json"])


def test_the_cases_exist() -> None:
    assert len(list(CASES.glob("*.txtar"))) >= 8
