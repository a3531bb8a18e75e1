"""deploy/ as kustomize renders it: the base and its two overlays, each through `kubectl
kustomize` (the kubectl on PATH, or $EBPFLB_KUBECTL; `make setup` installs Debian's
kubernetes-client where there is none).

Every rendered object is valid Kubernetes. The base renders its three files unchanged, and
replace-kube-proxy renders the base: tests/deploy/, which runs the base's files, runs what
that overlay applies. alongside-kube-proxy differs only in what sharing the nodes with a
running kube-proxy takes: no cleanup of kube-proxy's rules, no program on the node's
interfaces (socket-LB only), health and metrics ports kube-proxy does not hold, and the
in-cluster API address. Both overlays name the same objects, so applying one over the
other is a rolling update, never two agents on one node's pins. The kustomizations use
only fields kustomize v2.0.3 (Debian's kubectl 1.20) knows as well as v5.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ebpflb import cli
from ebpflb.config import NODEPORT_RANGE, parse_bind_address
from tests.unit.repo.test_deploy_manifests import BASE, DEPLOY, KUBERNETES_VERSION, documents

OVERLAYS = DEPLOY / "overlays"
REPLACE = "replace-kube-proxy"
ALONGSIDE = "alongside-kube-proxy"
DIRECTORIES = {"base": BASE, REPLACE: OVERLAYS / REPLACE, ALONGSIDE: OVERLAYS / ALONGSIDE}

# kube-proxy's healthzBindAddress and metricsBindAddress ports, on the host's network.
KUBE_PROXY_PORTS = {10256, 10249}
# What else listens on a node's host network: the kubelet (10250, read-only 10255, healthz
# 10248), and on control-plane nodes the API server, kube-controller-manager, kube-scheduler
# and etcd.
NODE_DAEMON_PORTS = {10248, 10250, 10255, 6443, 10257, 10259, 2379, 2380, 2381}
# Linux's default net.ipv4.ip_local_port_range: a listener there may find its port taken
# by one of the node's outgoing connections.
EPHEMERAL_PORTS = range(32768, 61000)
# The Kustomization fields of kustomize v2.0.3 (kubectl 1.20), from that kubectl's struct
# tags. Not `patches`: v2.0.3 reads it as strategic-merge file names, v3.1+ as objects.
KUSTOMIZE_V2_FIELDS = {
    "apiVersion",
    "kind",
    "namePrefix",
    "nameSuffix",
    "namespace",
    "commonLabels",
    "commonAnnotations",
    "resources",
    "bases",
    "patchesStrategicMerge",
    "patchesJson6902",
    "images",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "vars",
    "crds",
    "configurations",
}

Objects = list[dict[str, Any]]
_rendered: dict[str, Objects] = {}


def kubectl() -> str:
    given = os.environ.get("EBPFLB_KUBECTL")
    found = given or shutil.which("kubectl")
    if found is None:
        pytest.fail(
            "kubectl is not on PATH: `make setup` installs Debian's kubernetes-client"
            " (kubectl 1.20, kustomize v2.0.3) where none is; any newer kubectl does too"
        )
    return found


def render(name: str) -> Objects:
    """`kubectl kustomize` of one directory, run once: several tests read each rendering."""
    if name not in _rendered:
        done = subprocess.run(
            [kubectl(), "kustomize", str(DIRECTORIES[name])],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            version = subprocess.run(
                [kubectl(), "version", "--client"], capture_output=True, text=True, timeout=60
            )
            pytest.fail(
                f"kubectl kustomize {DIRECTORIES[name].relative_to(DEPLOY.parent)} failed"
                f" (exit {done.returncode}) with {version.stdout.strip() or version.stderr}:"
                f" deploy/ is written for kustomize v2.0.3 (kubectl 1.20) and newer\n" + done.stderr
            )
        # Deprecation warnings (`bases`, `patchesStrategicMerge`) go to stderr: not checked.
        _rendered[name] = [d for d in yaml.safe_load_all(done.stdout) if d is not None]
    return _rendered[name]


def one(objects: Objects, kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def names(objects: Objects) -> set[tuple[str, str, str]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects}


def pod_spec(objects: Objects) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def agent(objects: Objects) -> dict[str, Any]:
    (container,) = pod_spec(objects)["containers"]
    return container


def agent_options(objects: Objects, directory: Path) -> argparse.Namespace:
    """`ebpflb run`'s options as the rendered DaemonSet starts it: its args, the rendered
    ConfigMap's files standing where the args find them (flags override the file)."""
    container = agent(objects)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    (volume,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == "config"]
    configmap = one(objects, "ConfigMap")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    for key, value in configmap["data"].items():
        (directory / key).write_text(value)
    inside = mount["mountPath"].rstrip("/") + "/"
    args = [a.replace(inside, f"{directory}/") for a in container["args"]]
    assert args != container["args"], "the agent's args name no file of its ConfigMap"
    return cli.parse_args(args)


def port(address: str, flag: str) -> int:
    return parse_bind_address(address, flag)[1]


def config_file(objects: Objects) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"])
    return data


# ---- every rendering ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DIRECTORIES))
def test_renders_valid_kubernetes(name: str) -> None:
    objects = render(name)
    assert names(objects) == {
        ("ServiceAccount", "kube-system", "ebpflb"),
        ("ClusterRole", "", "ebpflb"),
        ("ClusterRoleBinding", "", "ebpflb"),
        ("ConfigMap", "kube-system", "ebpflb-config"),
        ("DaemonSet", "kube-system", "ebpflb"),
    }
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name", list(DIRECTORIES))
def test_probes_and_the_health_port_follow_the_agents_options(name: str, tmp_path: Path) -> None:
    objects = render(name)
    health = port(agent_options(objects, tmp_path).healthz_bind_address, "healthz-bind-address")
    container = agent(objects)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == health, probe
    assert container["ports"] == [{"name": "healthz", "containerPort": health, "protocol": "TCP"}]


@pytest.mark.parametrize(
    "path",
    sorted(DEPLOY.rglob("kustomization.yaml")),
    ids=lambda p: p.parent.relative_to(DEPLOY).as_posix(),
)
def test_kustomizations_use_only_what_kustomize_v2_knows(path: Path) -> None:
    kustomization = yaml.safe_load(path.read_text())
    assert set(kustomization) <= KUSTOMIZE_V2_FIELDS
    # v2.0.3 loads directories from `bases` only ("must be a file" in `resources`).
    for entry in kustomization.get("resources", []):
        assert (path.parent / entry).is_file(), f"resources: {entry} is not a file"
    for entry in kustomization.get("bases", []):
        assert (path.parent / entry / "kustomization.yaml").is_file(), f"bases: {entry}"
    for entry in kustomization.get("patchesStrategicMerge", []):
        assert (path.parent / entry).is_file(), f"patchesStrategicMerge: {entry}"


def test_every_kustomization_is_checked() -> None:
    found = {p.parent for p in DEPLOY.rglob("kustomization.yaml")}
    assert found == set(DIRECTORIES.values())


# ---- base and replace-kube-proxy ----------------------------------------------------------


def test_the_base_renders_its_files_unchanged() -> None:
    files = [
        doc
        for name in ("rbac.yaml", "configmap.yaml", "daemonset.yaml")
        for doc in documents(BASE / name)
    ]
    assert names(render("base")) == names(files)
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in render("base")}
    for doc in files:
        assert by_name[(doc["kind"], doc["metadata"]["name"])] == doc, doc["kind"]


def test_replace_kube_proxy_is_the_base() -> None:
    """tests/deploy/ runs the base's files: a patch here would go untested there."""
    assert render(REPLACE) == render("base")


def test_replace_kube_proxy_removes_kube_proxys_rules_and_takes_its_place(tmp_path: Path) -> None:
    objects = render(REPLACE)
    spec = pod_spec(objects)
    (cleanup,) = spec["initContainers"]
    assert cleanup["name"] == "kube-proxy-cleanup"
    assert cleanup["args"] == ["cleanup", "--kube-proxy"]
    assert cleanup["image"] == agent(objects)["image"]
    options = agent_options(objects, tmp_path)
    assert options.interfaces is None  # the interfaces holding the node's addresses
    assert "NET_ADMIN" in agent(objects)["securityContext"]["capabilities"]["add"]
    # kube-proxy is gone: its ports, which cloud load balancers probe (10256).
    assert port(options.healthz_bind_address, "healthz") == 10256
    assert port(options.metrics_bind_address, "metrics") == 10249
    # Nothing translates the `kubernetes` Service before this agent: the API server's own
    # address, to be filled in.
    env = {e["name"] for e in agent(objects)["env"]}
    assert {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} <= env


# ---- alongside-kube-proxy -----------------------------------------------------------------


def test_alongside_leaves_kube_proxys_rules_and_interfaces_alone(tmp_path: Path) -> None:
    objects = render(ALONGSIDE)
    spec = pod_spec(objects)
    assert spec.get("initContainers", []) == []
    assert all("cleanup" not in c.get("args", []) for c in spec["containers"])
    options = agent_options(objects, tmp_path)
    assert options.interfaces == ()  # socket-LB only: no tc or XDP program anywhere


def test_alongside_ports_clash_with_nothing_on_the_node(tmp_path: Path) -> None:
    options = agent_options(render(ALONGSIDE), tmp_path)
    ports = {
        port(options.healthz_bind_address, "healthz-bind-address"),
        port(options.metrics_bind_address, "metrics-bind-address"),
    }
    assert len(ports) == 2  # neither disabled nor shared
    assert not ports & KUBE_PROXY_PORTS
    assert not ports & NODE_DAEMON_PORTS
    for number in ports:
        assert not NODEPORT_RANGE[0] <= number <= NODEPORT_RANGE[1], number
        assert number not in EPHEMERAL_PORTS, number


def test_alongside_reaches_the_api_through_kube_proxy() -> None:
    """No API server address to fill in: the kubelet's in-cluster one (the `kubernetes`
    Service's ClusterIP) works, kube-proxy translating it."""
    env = {e["name"] for e in agent(render(ALONGSIDE)).get("env", [])}
    assert not env & {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
    assert "NODE_NAME" in env


def test_alongside_config_is_the_bases_with_only_its_mode_changed() -> None:
    """The overlay restates config.yaml (a ConfigMap key is replaced whole): it must not
    drift from the base's."""
    base, alongside = config_file(render("base")), config_file(render(ALONGSIDE))
    mode = {"interfaces", "healthz-bind-address", "metrics-bind-address"}
    assert {k: v for k, v in alongside.items() if k not in mode} == {
        k: v for k, v in base.items() if k not in mode
    }
    assert {k for k in mode if alongside.get(k) != base.get(k)} == mode


def test_alongside_changes_nothing_else_in_the_daemonset() -> None:
    """Same image, args, mounts, volumes and securityContext as the base: a new
    difference has to be added here on purpose."""
    base, alongside = pod_spec(render("base")), pod_spec(render(ALONGSIDE))
    differing = {"initContainers", "containers"}
    assert {k: v for k, v in alongside.items() if k not in differing} == {
        k: v for k, v in base.items() if k not in differing
    }
    changed = {"env", "ports", "startupProbe", "livenessProbe", "readinessProbe"}
    (base_agent,), (alongside_agent,) = base["containers"], alongside["containers"]
    assert {k: v for k, v in alongside_agent.items() if k not in changed} == {
        k: v for k, v in base_agent.items() if k not in changed
    }
