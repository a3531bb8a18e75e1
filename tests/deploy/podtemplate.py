"""A DaemonSet's pod template as `podman run` arguments: what the kubelet would do with it,
read from the YAML and never retyped.

Translated: the container's image, command and args; env (values and the downward API's
spec.nodeName); hostPath volumes and their mount options (readOnly, mountPropagation);
configMap volumes (the ConfigMap's data written to a directory of the test's); the
securityContext (capabilities, privileged, allowPrivilegeEscalation,
readOnlyRootFilesystem); hostNetwork (the test's node namespace stands in for the host's
network). Anything else in the template is refused rather than silently dropped, so the
test cannot pass on a template it did not really run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Fields of the pod spec and container that need no translation for a single-node podman
# run: scheduling, the API identity (handled by the test as the kubelet would: the
# service-account token mount), probes (the test calls the same endpoints itself).
POD_FIELDS_NOT_RUN = {
    "serviceAccountName",
    "priorityClassName",
    "dnsPolicy",
    "nodeSelector",
    "tolerations",
    "terminationGracePeriodSeconds",
    "initContainers",
    "containers",
    "volumes",
    "hostNetwork",
}
CONTAINER_FIELDS_NOT_RUN = {
    "name",
    "ports",
    "resources",
    "startupProbe",
    "livenessProbe",
    "readinessProbe",
}
PROPAGATION = {
    None: "rprivate",
    "None": "rprivate",
    "HostToContainer": "rslave",
    "Bidirectional": "rshared",
}
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class Unsupported(Exception):
    """The template uses something this translation does not run."""


@dataclass
class Run:
    """One container of the template, ready for `podman run`."""

    name: str
    image: str
    command: list[str] | None
    args: list[str]
    env: dict[str, str]
    mounts: list[tuple[str, str, str]]  # (host path, container path, options)
    cap_drop: list[str]
    cap_add: list[str]
    security_opts: list[str] = field(default_factory=list)
    read_only: bool = False

    def container_path(self, host_path: Path) -> Path:
        """Where a host path appears inside the container (through its volumes)."""
        best: tuple[str, str] | None = None
        for source, target, _ in self.mounts:
            inside = host_path == Path(source) or Path(source) in host_path.parents
            if inside and (best is None or len(source) > len(best[0])):
                best = (source, target)
        if best is None:
            raise Unsupported(f"{host_path} is not under any volume of {self.name}")
        return Path(best[1]) / host_path.relative_to(best[0])

    def argv(
        self,
        *,
        container_name: str,
        netns: str,
        runtime: str = "runc",
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        extra_mounts: Sequence[tuple[str, str, str]] = (),
        podman_options: Sequence[str] = (),
        detach: bool = False,
    ) -> list[str]:
        argv = ["podman", "--runtime", runtime, "run", "--name", container_name]
        argv += ["--detach"] if detach else []
        argv += ["--network", f"ns:/run/netns/{netns}", "--pull=never", *podman_options]
        for key, value in {**self.env, **(env or {})}.items():
            argv += ["--env", f"{key}={value}"]
        for source, target, options in [*self.mounts, *extra_mounts]:
            argv += ["--volume", f"{source}:{target}:{options}"]
        argv += [f"--cap-drop={c}" for c in self.cap_drop]
        argv += [f"--cap-add={c}" for c in self.cap_add]
        argv += [f"--security-opt={o}" for o in self.security_opts]
        argv += ["--read-only"] if self.read_only else []
        if self.command is not None:
            argv += ["--entrypoint", json.dumps(self.command)]
        return [*argv, self.image, *self.args, *extra_args]


def pod_template(daemonset: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    unknown = set(spec) - POD_FIELDS_NOT_RUN
    if unknown:
        raise Unsupported(f"pod spec fields {sorted(unknown)}")
    if spec.get("hostNetwork") is not True:
        raise Unsupported("only hostNetwork pods run in the test's node namespace")
    return spec


def container(
    daemonset: Mapping[str, Any],
    name: str,
    *,
    node_name: str,
    config_maps: Mapping[str, Path],
) -> Run:
    """The named container (or init container) of the DaemonSet's pod template.
    `config_maps`: ConfigMap name -> directory holding its data, one file per key."""
    spec = pod_template(daemonset)
    found = [c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == name]
    if len(found) != 1:
        raise Unsupported(f"no single container named {name}")
    (c,) = found
    unknown = (
        set(c)
        - CONTAINER_FIELDS_NOT_RUN
        - {"image", "command", "args", "env", "securityContext", "volumeMounts"}
    )
    if unknown:
        raise Unsupported(f"container fields {sorted(unknown)}")
    return Run(
        name=name,
        image=c["image"],
        command=c.get("command"),
        args=list(c.get("args", [])),
        env=_env(c.get("env", []), node_name),
        mounts=_mounts(c.get("volumeMounts", []), spec.get("volumes", []), config_maps),
        **_security(c.get("securityContext", {})),
    )


def _env(entries: list[dict[str, Any]], node_name: str) -> dict[str, str]:
    env = {}
    for entry in entries:
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        elif entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[entry["name"]] = node_name
        else:
            raise Unsupported(f"env {entry}")
    return env


def _mounts(
    mounts: list[dict[str, Any]], volumes: list[dict[str, Any]], config_maps: Mapping[str, Path]
) -> list[tuple[str, str, str]]:
    by_name = {v["name"]: v for v in volumes}
    result = []
    for mount in mounts:
        volume = by_name[mount["name"]]
        read_only = mount.get("readOnly", False)
        if "hostPath" in volume:
            source = volume["hostPath"]["path"]
            kind = volume["hostPath"].get("type", "")
            if kind == "Directory" and not Path(source).is_dir():
                raise Unsupported(f"hostPath {source} is not a directory on this machine")
        elif "configMap" in volume:
            if volume["configMap"]["name"] not in config_maps:
                raise Unsupported(f"ConfigMap {volume['configMap']['name']}: no data given")
            source = str(config_maps[volume["configMap"]["name"]])
            read_only = True  # the kubelet mounts ConfigMaps read-only
        else:
            raise Unsupported(f"volume {volume}")
        options = ["ro" if read_only else "rw", PROPAGATION[mount.get("mountPropagation")]]
        result.append((source, mount["mountPath"], ",".join(options)))
    return result


def _security(context: dict[str, Any]) -> dict[str, Any]:
    unknown = set(context) - {
        "capabilities",
        "privileged",
        "allowPrivilegeEscalation",
        "readOnlyRootFilesystem",
    }
    if unknown:
        raise Unsupported(f"securityContext fields {sorted(unknown)}")
    if context.get("privileged"):
        raise Unsupported("privileged containers (the point is to run without)")
    caps = context.get("capabilities", {})
    opts = ["no-new-privileges"] if context.get("allowPrivilegeEscalation") is False else []
    return {
        "cap_drop": [c.lower() for c in caps.get("drop", [])],
        "cap_add": list(caps.get("add", [])),
        "security_opts": opts,
        "read_only": bool(context.get("readOnlyRootFilesystem", False)),
    }
