#!/usr/bin/env bash
# `make image`: deploy/Containerfile built with buildah on a base image made here from
# Debian's packages (scripts/base-image.sh), so no container registry is involved. The
# tag is the image deploy/base/daemonset.yaml names (EBPFLB_IMAGE overrides). Run as root.
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
# Where the size goes: the biggest installed Python distributions of the agent's virtual
# environment, and the biggest Debian packages (MB, from the image itself). The ulimits:
# a host without CAP_SYS_RESOURCE cannot raise them to podman's defaults (as tests/deploy).
podman run --rm --network=none --runtime "${EBPFLB_OCI_RUNTIME:-runc}" \
    --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --entrypoint /bin/sh "$image" -c '
    echo "image: largest parts, MB:"
    du -sm /opt/ebpflb /usr/lib /usr/share /usr/bin /var 2>/dev/null | sort -rn | sed "s/^/image:   /"
    echo "image: largest site-packages directories of /opt/ebpflb, MB:"
    du -sm /opt/ebpflb/lib/python3*/site-packages/* | sort -rn | head -n 12 | sed "s|/opt/ebpflb/lib/python3[^/]*/site-packages/||; s/^/image:   /"
    echo "image: largest Debian packages, MB:"
    dpkg-query -W -f="\${Installed-Size}\t\${Package}\n" | sort -rn | head -n 12 | awk -F"\t" "{ printf \"image:   %d\t%s\n\", \$1 / 1024, \$2 }"
' >&2 || log "could not list the image's largest parts (podman run failed)"
