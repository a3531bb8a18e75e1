"""deploy/base/: every manifest is valid Kubernetes (kubernetes-validate's schemas, strict:
no unknown fields) and every YAML file under deploy/ is clean (yamllint); the ClusterRole
grants exactly what the Kubernetes source asks the API server for in a real run; the
DaemonSet is not privileged and its capabilities are the ones ebpflb.host.privileges checks
for. The overlays, as kustomize renders them: tests/unit/repo/test_kustomize.py."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from yamllint import linter
from yamllint.config import YamlLintConfig

from ebpflb import cli
from ebpflb.host import privileges
from ebpflb.k8s.sources.base import Kind
from ebpflb.k8s.sources.kubernetes import ApiConfig, Backoff, KubernetesSource, WatchOptions
from ebpflb.model import NamespacedName
from lab.harness.fakeapi import FakeApiServer
from tests import REPO
from tests.deploy import podtemplate
from tests.factories import endpoint_slice, service

DEPLOY = REPO / "deploy"
BASE = DEPLOY / "base"
# Kubernetes objects; the kustomization and the overlays' patches (partial objects) are not.
MANIFESTS = sorted(p for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
YAML_FILES = sorted(DEPLOY.rglob("*.yaml"))
# The oldest Kubernetes release the manifests are written for (schemas of
# kubernetes-validate; "strict" also rejects fields the schema does not know).
KUBERNETES_VERSION = "1.31.0"
# yamllint's defaults, except: lines up to 100 characters (as ruff here), and no "---"
# required before a file's first document (kubectl and Kubernetes' own examples omit it).
YAMLLINT = YamlLintConfig(
    "extends: default\nrules:\n  line-length: {max: 100}\n  document-start: disable\n"
)


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def daemonset() -> dict[str, Any]:
    (ds,) = documents(BASE / "daemonset.yaml")
    return ds


def test_there_are_manifests() -> None:
    names = {p.name for p in MANIFESTS}
    assert {"daemonset.yaml", "rbac.yaml", "configmap.yaml"} <= names


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes(path: Path) -> None:
    for doc in documents(path):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.relative_to(DEPLOY).as_posix())
def test_manifest_passes_yamllint(path: Path) -> None:
    problems = [f"{p.line}:{p.column} {p.message}" for p in linter.run(path.read_text(), YAMLLINT)]
    assert problems == []


def test_the_validator_rejects_what_kubernetes_would() -> None:
    ds = daemonset()
    container = ds["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["capabilities"]["add"] = "SYS_ADMIN"  # not a list
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBERNETES_VERSION, strict=True)


def test_daemonset_is_not_privileged_and_adds_only_the_checked_capabilities() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    (agent,) = spec["containers"]
    for container in [agent, *spec.get("initContainers", [])]:
        context = container["securityContext"]
        assert "privileged" not in context
        assert context["capabilities"]["drop"] == ["ALL"]
        assert context["allowPrivilegeEscalation"] is False
    added = {f"CAP_{c}" for c in agent["securityContext"]["capabilities"]["add"]}
    checked = {n.capability for n in (privileges.SYS_ADMIN, privileges.NET_ADMIN)}
    assert added == checked | {privileges.SYS_RESOURCE.capability}
    # Bidirectional propagation needs a privileged container; HostToContainer does not.
    assert all(m.get("mountPropagation") != "Bidirectional" for m in agent["volumeMounts"])


def test_probes_use_the_health_port_and_endpoints() -> None:
    (agent,) = daemonset()["spec"]["template"]["spec"]["containers"]
    probes = {k: agent[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert {k: (p["path"], p["port"]) for k, p in probes.items()} == {
        "startupProbe": ("/livez", 10256),
        "livenessProbe": ("/livez", 10256),
        "readinessProbe": ("/readyz", 10256),
    }


def test_configmap_is_a_valid_agent_config(tmp_path: Path) -> None:
    """The ConfigMap's config.yaml parses as `ebpflb run --config` reads it."""
    (configmap,) = documents(BASE / "configmap.yaml")
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    args = cli.parse_args(["run", "--config", str(path)])
    assert args.cgroup == Path("/host/sys/fs/cgroup")
    assert args.bpffs == Path("/sys/fs/bpf/ebpflb")
    # The DaemonSet mounts it where its args say.
    (agent,) = daemonset()["spec"]["template"]["spec"]["containers"]
    assert "--config=/etc/ebpflb/config.yaml" in agent["args"]
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/ebpflb"


# ---- RBAC: exactly what the source calls ------------------------------------------------


class _Sink:
    def __init__(self) -> None:
        self.listed: set[Kind] = set()
        self.lock = threading.Lock()

    def object_updated(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        pass

    def object_deleted(self, kind: Kind, ref: NamespacedName) -> None:
        pass

    def initial_list_done(self, kind: Kind) -> None:
        with self.lock:
            self.listed.add(kind)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    try:
        yield server
    finally:
        server.close()


def _wait(predicate: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def source_requests(api: FakeApiServer) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every request the source made in a run that lists
    (in pages), watches, sees events and relists after a 410."""
    for name in ("web", "db"):  # two of each, listed one per page
        api.create(service(name))
        api.create(endpoint_slice(f"{name}-1", service_name=name))
    sink = _Sink()
    source = KubernetesSource(
        sink,
        ApiConfig.from_host(api.url),
        options=WatchOptions(page_size=1, watch_timeout=30, backoff=Backoff(initial=0.01)),
        rng=random.Random(1),
    )
    source.start()
    try:
        _wait(lambda: sink.listed == set(Kind), "both lists")
        api.wait_for_watches(2)
        api.create(service("other"))
        lists = len([r for r in api.requests if not r.watch])
        api.compact(expire_watches=True)  # 410 inside the streams: relist, watch again
        _wait(lambda: len([r for r in api.requests if not r.watch]) >= lists + 2, "relists")
        api.wait_for_watches(2)
    finally:
        source.stop()
    calls = set()
    for request in api.requests:
        assert request.method == "GET" and request.resource is not None, request
        parts = request.path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        calls.add((group, request.resource, "watch" if request.watch else "list"))
    return calls


def cluster_role_grants() -> set[tuple[str, str, str]]:
    (role,) = [d for d in documents(BASE / "rbac.yaml") if d["kind"] == "ClusterRole"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_cluster_role_grants_exactly_what_the_source_calls(api: FakeApiServer) -> None:
    calls = source_requests(api)
    assert calls == {
        ("", "services", "list"),
        ("", "services", "watch"),
        ("discovery.k8s.io", "endpointslices", "list"),
        ("discovery.k8s.io", "endpointslices", "watch"),
    }
    assert cluster_role_grants() == calls


def test_rbac_binds_the_role_to_the_daemonsets_service_account() -> None:
    docs = {d["kind"]: d for d in documents(BASE / "rbac.yaml")}
    spec = daemonset()["spec"]["template"]["spec"]
    account = docs["ServiceAccount"]["metadata"]
    assert spec["serviceAccountName"] == account["name"]
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


# ---- the pod template as podman runs it (tests/deploy) ----------------------------------


def test_pod_template_translates_to_podman_arguments(tmp_path: Path) -> None:
    run = podtemplate.container(
        daemonset(), "ebpflb", node_name="node7", config_maps={"ebpflb-config": tmp_path}
    )
    argv = run.argv(container_name="c", netns="ns1", extra_args=["--cgroup=/x"])
    assert argv[-3:] == ["run", "--config=/etc/ebpflb/config.yaml", "--cgroup=/x"]
    assert "--network" in argv and "ns:/run/netns/ns1" in argv
    assert "NODE_NAME=node7" in argv
    assert "--cap-drop=all" in argv
    assert {a for a in argv if a.startswith("--cap-add=")} == {
        "--cap-add=SYS_ADMIN",
        "--cap-add=NET_ADMIN",
        "--cap-add=SYS_RESOURCE",
    }
    assert "--security-opt=no-new-privileges" in argv
    volumes = {argv[i + 1] for i, a in enumerate(argv) if a == "--volume"}
    # No host kernel headers: the image carries a tree (deploy/Containerfile).
    assert volumes == {
        "/sys/fs/bpf:/sys/fs/bpf:rw,rslave",
        "/sys/fs/cgroup:/host/sys/fs/cgroup:rw,rprivate",
        f"{tmp_path}:/etc/ebpflb:ro,rprivate",
        "/var/run/netns:/var/run/netns:ro,rslave",
    }
    assert run.container_path(Path("/sys/fs/cgroup/unified/t")) == Path(
        "/host/sys/fs/cgroup/unified/t"
    )


def test_pod_template_translation_refuses_what_it_does_not_run(tmp_path: Path) -> None:
    ds = daemonset()
    spec = ds["spec"]["template"]["spec"]
    spec["containers"][0]["securityContext"]["privileged"] = True
    data = {"ebpflb-config": tmp_path}
    with pytest.raises(podtemplate.Unsupported, match="privileged"):
        podtemplate.container(ds, "ebpflb", node_name="n", config_maps=data)
    with pytest.raises(podtemplate.Unsupported, match="ConfigMap"):
        podtemplate.container(daemonset(), "ebpflb", node_name="n", config_maps={})
    ds = daemonset()
    ds["spec"]["template"]["spec"]["hostPID"] = True
    with pytest.raises(podtemplate.Unsupported, match="hostPID"):
        podtemplate.container(ds, "ebpflb", node_name="n", config_maps=data)
