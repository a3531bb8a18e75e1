#!/usr/bin/env bash
# Idempotent: the Debian packages `make image` and `make test-deploy` need (run as root).
#
# - mmdebstrap: the base image's root filesystem, from Debian's own packages (no registry);
# - buildah: builds deploy/Containerfile on that base (`buildah bud --pull=never`);
# - podman: runs the DaemonSet's pod template from the image (tests/deploy/);
# - runc: the OCI runtime both use (EBPFLB_OCI_RUNTIME); Debian's default, crun 1.8,
#   refuses hosts with cgroup v1 and v2 mounted side by side ("hybrid"), as here.
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "image-tools: must run as root (installs packages)" >&2; exit 1; }

packages=(mmdebstrap buildah podman runc uidmap)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "image-tools: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
