"""The node the deploy tests run the DaemonSet's pod on: a node made of test namespaces
(lab.harness.cluster: one node, two pods behind it, an external client on the node's
wire), the fake API server behind TLS on the node's loopback, and the pod template of a
release's deploy/base run with podman (tests/deploy/podtemplate.py) from that release's
image.

What the kubelet would do is read from the YAML: image, args, env (NODE_NAME from the
downward API), hostPath and ConfigMap volumes, the securityContext's capabilities
(exactly the YAML's set: --cap-drop=all plus those), hostNetwork (here: the test's node
namespace). The tests change only:

- the agent's --cgroup (a test cgroup), --interfaces (the node namespace's eth0) and
  --bpffs (a private pin directory, so the machine's /sys/fs/bpf/ebpflb is never
  touched), given as flags after the YAML's args (flags override the config file);
- KUBERNETES_SERVICE_HOST/PORT, pointed at the fake API server (lab.harness.fakeapi,
  listening on the node namespace's loopback), and the service-account token and CA the
  kubelet would mount;
- for the previous release (deploy/previous-release), the image: its own tag, as
  `kubectl set image` or its kustomization's `images:` would set it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ebpflb import __version__
from lab.harness import fakeapi
from lab.harness.agentproc import cleanup_datapath
from lab.harness.cluster import Cluster
from lab.harness.netns import Cgroup
from lab.harness.nshttp import thread_in_netns
from tests import REPO
from tests.deploy import podtemplate
from tests.factories import endpoint, endpoint_slice, service

# The base's files: the replace-kube-proxy overlay renders them unchanged (a unit test,
# tests/unit/repo/test_kustomize.py, checks it), and reading them needs no kubectl.
DEPLOY = REPO / "deploy" / "base"
NODE, NODE_IP = "node1", "192.168.100.1"
PODS = {"pod11": 11, "pod12": 12}
WEB_VIP, NODE_PORT = "10.96.0.10", 30080
HEALTH_PORT = 10256
METRICS_PORT = 10249  # deploy/base/configmap.yaml's metrics-bind-address
# What every podman command here needs on this VM: it lacks CAP_SYS_RESOURCE, so the
# container cannot inherit the default (higher) nofile/nproc limits; and Debian's crun
# refuses hosts with cgroup v1 and v2 side by side, runc does not.
PODMAN_OPTIONS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
RUNTIME = os.environ.get("EBPFLB_OCI_RUNTIME", "runc")
START_TIMEOUT = 120.0


def documents(name: str, commit: str | None = None) -> list[dict[str, Any]]:
    """deploy/base/<name>: this tree's, or as `commit` has it."""
    if commit is None:
        text = (DEPLOY / name).read_text()
    else:
        text = run(["git", "-C", str(REPO), "show", f"{commit}:deploy/base/{name}"])
    return [d for d in yaml.safe_load_all(text) if d]


@dataclass(frozen=True)
class Release:
    """A release's DaemonSet and ConfigMap, and the image its pod runs."""

    version: str
    image: str
    daemonset: dict[str, Any]
    configmap: dict[str, Any]

    @classmethod
    def this(cls) -> Release:
        """This tree: deploy/base as it is, the image its DaemonSet names (`make image`)."""
        (ds,) = documents("daemonset.yaml")
        (configmap,) = documents("configmap.yaml")
        spec = ds["spec"]["template"]["spec"]
        (image,) = {c["image"] for c in [*spec["containers"], *spec["initContainers"]]}
        return cls(__version__, image, ds, configmap)

    @classmethod
    def previous(cls) -> Release:
        """deploy/previous-release: its commit's deploy/base, its image (`make
        image-previous`)."""
        fields = dict(
            line.split("=", 1)
            for line in (REPO / "deploy" / "previous-release").read_text().splitlines()
            if line and not line.startswith("#")
        )
        commit = fields["COMMIT"]
        (ds,) = documents("daemonset.yaml", commit)
        (configmap,) = documents("configmap.yaml", commit)
        return cls(fields["VERSION"], fields["IMAGE"], ds, configmap)

    def require_image(self) -> None:
        if subprocess.run(["podman", "image", "exists", self.image]).returncode != 0:
            target = "image" if self.version == Release.this().version else "image-previous"
            pytest.fail(f"image {self.image} is not built: run `make {target}` first")


class TlsFakeApiServer(fakeapi.FakeApiServer):
    """The fake API server behind TLS, as in-cluster configuration only speaks https."""

    def __init__(self, cert: Path, key: Path) -> None:
        super().__init__()
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(cert, key)

    def start(self) -> TlsFakeApiServer:
        super().start()
        assert self._server is not None
        self._server.socket = self._tls.wrap_socket(self._server.socket, server_side=True)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])


def run(argv: list[str], timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"{argv[:6]} failed ({done.returncode}): {done.stderr}"
    return done.stdout


@dataclass
class Lab:
    cluster: Cluster
    cgroup: Cgroup
    bpffs: Path
    api: TlsFakeApiServer
    workdir: Path
    release: Release  # the one whose pod start_agent runs unless told otherwise
    containers: list[str] = field(default_factory=list)

    @property
    def node_ns(self) -> str:
        return self.cluster.nodes[NODE].netns

    @property
    def image(self) -> str:
        return self.release.image

    def pod(self, name: str, release: Release | None = None) -> podtemplate.Run:
        release = release or self.release
        config = write_config_map(self.workdir, release)
        run_ = podtemplate.container(
            release.daemonset, name, node_name=NODE, config_maps={"ebpflb-config": config}
        )
        run_.image = release.image
        return run_

    def agent_overrides(self, run_: podtemplate.Run) -> list[str]:
        """The only changes to the YAML's args (see the module's docstring)."""
        return [
            f"--cgroup={run_.container_path(self.cgroup.path)}",
            "--interfaces=eth0",
            f"--bpffs={self.bpffs}",
        ]

    def podman(
        self,
        run_: podtemplate.Run,
        *,
        detach: bool,
        extra_args: list[str],
        cap_add: list[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        name = f"ebpflb-deploy-{uuid.uuid4().hex[:6]}"
        self.containers.append(name)
        if cap_add is not None:
            run_.cap_add = cap_add
        argv = run_.argv(
            container_name=name,
            netns=self.node_ns,
            runtime=RUNTIME,
            extra_args=extra_args,
            env={
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.api.port),
            },
            # What the kubelet mounts for the pod's service account.
            extra_mounts=[
                (str(self.workdir / "serviceaccount"), podtemplate.SERVICE_ACCOUNT_DIR, "ro")
            ],
            podman_options=PODMAN_OPTIONS,
            detach=detach,
        )
        done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT)
        done.args = name
        return done

    def start_agent(self, release: Release | None = None) -> str:
        agent = self.pod("ebpflb", release)
        done = self.podman(agent, detach=True, extra_args=self.agent_overrides(agent))
        assert done.returncode == 0, done.stderr
        return str(done.args)

    def logs(self, name: str) -> str:
        return run(["podman", "--runtime", RUNTIME, "logs", name], check=False)

    def in_node(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["nsenter", f"--net=/run/netns/{self.node_ns}", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def agent_status(self) -> dict[str, Any]:
        """The agent's /status document, from its metrics port in the node namespace."""
        code = (
            "import sys, urllib.request\n"
            "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())\n"
        )
        url = f"http://127.0.0.1:{METRICS_PORT}/status"
        done = self.in_node([sys.executable, "-c", code, url])
        assert done.returncode == 0, done.stderr
        document: dict[str, Any] = json.loads(done.stdout)
        return document

    def http_status(self, path: str) -> int | str:
        """GET 127.0.0.1:10256<path> in the node namespace (where the kubelet would probe
        the host network's address); the status, or the error."""
        code = (
            "import sys, urllib.request, urllib.error\n"
            "try:\n"
            "    print(urllib.request.urlopen(sys.argv[1], timeout=2).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n"
            "except OSError as e:\n    print(type(e).__name__)\n"
        )
        url = f"http://127.0.0.1:{HEALTH_PORT}{path}"
        out = self.in_node([sys.executable, "-c", code, url]).stdout.strip()
        return int(out) if out.isdigit() else out

    def frontends(self) -> set[str]:
        """What the pinned maps hold (`ebpflb maps dump --json`, from outside the container)."""
        done = subprocess.run(
            [sys.executable, "-m", "ebpflb", "maps", "dump", "--json", "--bpffs", str(self.bpffs)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            return set()
        return {s["frontend"] for s in json.loads(done.stdout)["services"]}

    def wait_frontends(self, expected: set[str], container: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not expected <= self.frontends():
            state = run(
                [
                    "podman",
                    "--runtime",
                    RUNTIME,
                    "inspect",
                    "--format",
                    "{{.State.Status}}",
                    container,
                ],
                check=False,
            ).strip()
            if state not in ("running", "created") or time.monotonic() > deadline:
                raise AssertionError(
                    f"{container} ({state}) did not program {expected}:\n" + self.logs(container)
                )
            time.sleep(0.5)

    def cgroup_programs(self) -> list[tuple[int, str]]:
        out = run(["bpftool", "cgroup", "show", str(self.cgroup.path), "--json"]).strip()
        return sorted((p["id"], p["name"]) for p in json.loads(out or "[]"))

    def clusterip(self, count: int = 30) -> list[dict[str, Any]]:
        return self.cluster.requests(self.node_ns, "tcp", f"{WEB_VIP}:80", count, self.cgroup)

    def nodeport(self, count: int = 20) -> list[dict[str, Any]]:
        client = self.cluster.clients["client"]
        return self.cluster.requests(client, "tcp", f"{NODE_IP}:{NODE_PORT}", count, None)


def served(results: list[dict[str, Any]]) -> set[str]:
    assert all(r["ok"] for r in results), [r for r in results if not r["ok"]][:3]
    return {str(r["server"]) for r in results}


def wait_served(lab: Lab, pods: set[str], container: str, timeout: float = 30) -> None:
    """Until ClusterIP requests reach exactly `pods` (an API change has been applied)."""
    deadline = time.monotonic() + timeout
    while served(lab.clusterip(10)) != pods:
        assert time.monotonic() < deadline, lab.logs(container)


def web_objects() -> list[dict[str, Any]]:
    ports = [
        {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT}
    ]
    return [
        service("web", cluster_ip=WEB_VIP, ports=ports, type="NodePort"),
        endpoint_slice(
            "web-1", endpoints=[endpoint(f"10.244.1.{host}", node=NODE) for host in PODS.values()]
        ),
    ]


def write_credentials(workdir: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and the service-account files."""
    cert, key = workdir / "apiserver.crt", workdir / "apiserver.key"
    run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=fake-apiserver",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ]
    )
    account = workdir / "serviceaccount"
    account.mkdir()
    shutil.copy(cert, account / "ca.crt")
    (account / "token").write_text("deploy-test-token")
    (account / "namespace").write_text("kube-system")
    return cert, key


def write_config_map(workdir: Path, release: Release) -> Path:
    """The release's ConfigMap as the kubelet mounts it: a directory, a file per key."""
    directory = workdir / f"config-{release.version}"
    directory.mkdir(exist_ok=True)
    for key, value in release.configmap["data"].items():
        (directory / key).write_text(value)
    return directory


@contextlib.contextmanager
def node_lab(release: Release) -> Iterator[Lab]:
    """The node, its pods serving, the API holding the web Service; all removed after."""
    release.require_image()
    workdir = Path(tempfile.mkdtemp(prefix="ebpflb-deploy-"))
    cluster = Cluster.create(nodes=1)
    cgroup = Cgroup.create(f"ebpflb-deploy-{uuid.uuid4().hex[:8]}")
    bpffs = Path(f"/sys/fs/bpf/ebpflb-deploy-{uuid.uuid4().hex[:8]}")
    api: TlsFakeApiServer | None = None
    lab_: Lab | None = None
    try:
        for name, host in PODS.items():
            pod = cluster.add_pod(NODE, name, host)
            cluster.start_server(pod, tcp=[8080], udp=[5353], lifetime=900)
        cert, key = write_credentials(workdir)
        api = TlsFakeApiServer(cert, key)
        with thread_in_netns(cluster.nodes[NODE].netns):  # the node's loopback
            api.start()
        for obj in web_objects():
            api.create(obj)
        lab_ = Lab(cluster, cgroup, bpffs, api, workdir, release)
        yield lab_
    finally:
        if lab_ is not None:
            for name in lab_.containers:
                subprocess.run(
                    ["podman", "--runtime", RUNTIME, "rm", "--force", "--time", "5", name],
                    capture_output=True,
                    timeout=60,
                )
        cleanup_datapath(bpffs, cgroup.path, ["eth0"], netns=cluster.nodes[NODE].netns)
        if api is not None:
            api.close()
        cgroup.close()
        cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)
