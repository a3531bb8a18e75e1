#!/usr/bin/env bash
# `make image`: deploy/Containerfile built with buildah on a base image made here from
# Debian's packages (scripts/base-image.sh), so no container registry is involved. The
# tag is the image deploy/daemonset.yaml names (EBPFLB_IMAGE overrides). Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${EBPFLB_IMAGE:-ebpflb:dev}
log() { printf 'image: %s\n' "$*" >&2; }

./scripts/image-tools.sh
started=$(date +%s)
./scripts/base-image.sh >/dev/null

args=(bud --runtime "${EBPFLB_OCI_RUNTIME:-runc}" --pull=never --layers --network=host --file deploy/Containerfile --tag "$image")
# pip inside the build trusts its own CA list; where this machine's pip is told to trust
# another bundle (a TLS-intercepting proxy), the build gets the same one.
cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
if [ -n "$cert" ] && [ -f "$cert" ]; then
    args+=(--volume "$cert:/run/ebpflb-build-ca.crt:ro" --build-arg PIP_CERT=/run/ebpflb-build-ca.crt)
fi
buildah "${args[@]}" . >&2
size=$(podman image inspect --format '{{.Size}}' "$image")
log "built $image in $(( $(date +%s) - started ))s: $(( size / 1000000 )) MB"
