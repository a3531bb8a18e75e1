#!/usr/bin/env bash
# The base image deploy/Containerfile starts from, docker.io/library/debian:bookworm-slim,
# made on this machine from Debian's packages (mmdebstrap), so `make image` needs no
# container registry. Run as root; prints the image name.
#
# The root filesystem is cached outside the checkout, keyed by a hash of the recipe below;
# a cache whose recipe changed, or older than EBPFLB_BASE_MAX_AGE_DAYS (7: Debian's
# security updates), is rebuilt. The imported image carries the key as a label, so an
# up-to-date image is not imported again.
set -euo pipefail

name=${EBPFLB_BASE_IMAGE:-docker.io/library/debian:bookworm-slim}
cache=${EBPFLB_IMAGE_CACHE:-/var/cache/ebpflb/base}
max_age_days=${EBPFLB_BASE_MAX_AGE_DAYS:-7}
mirror=${EBPFLB_DEBIAN_MIRROR:-http://deb.debian.org}

log() { printf 'base-image: %s\n' "$*" >&2; }

# What the official bookworm-slim image is: Debian's minbase variant without manuals,
# documentation (copyright files kept), translations and info pages; /usr merged by
# mmdebstrap's hook rather than by the usrmerge package (which would pull in perl).
recipe=(
    --variant=minbase
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --format=tar
    --aptopt='Acquire::Languages "none"'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-include=/usr/share/locale/locale.alias'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/groff/*'
    --dpkgopt='path-exclude=/usr/share/lintian/*'
    bookworm
)
sources=(
    "deb $mirror/debian bookworm main"
    "deb $mirror/debian bookworm-updates main"
    "deb $mirror/debian-security bookworm-security main"
)
key=$(printf '%s\n' "${recipe[@]}" "${sources[@]}" | sha256sum | cut -c1-16)
tarball="$cache/bookworm-slim-$key.tar"

mkdir -p "$cache"
if [ -e "$tarball" ] && [ -n "$(find "$tarball" -mtime "+$max_age_days")" ]; then
    log "$tarball is older than $max_age_days days: rebuilding"
    rm -f "$tarball"
fi
if [ ! -e "$tarball" ]; then
    log "mmdebstrap bookworm -> $tarball"
    started=$(date +%s)
    mmdebstrap --quiet "${recipe[@]}" "$tarball.partial" "${sources[@]}"
    mv "$tarball.partial" "$tarball"
    # Older recipes' root filesystems are stale now.
    find "$cache" -maxdepth 1 -name 'bookworm-slim-*.tar' ! -name "$(basename "$tarball")" -delete
    log "root filesystem built in $(( $(date +%s) - started ))s"
fi

# The tarball's age is part of the label: a rebuilt one is imported again.
stamp="$key-$(stat -c %Y "$tarball")"
current=$(podman image inspect --format '{{index .Labels "org.ebpflb.base"}}' "$name" 2>/dev/null || true)
if [ "$current" != "$stamp" ]; then
    log "importing $tarball as $name"
    previous=$(podman image inspect --format '{{.Id}}' "$name" 2>/dev/null || true)
    podman import --quiet --change 'CMD ["bash"]' --change "LABEL org.ebpflb.base=$stamp" \
        "$tarball" "$name" >/dev/null
    if [ -n "$current" ] && [ -n "$previous" ]; then
        podman rmi "$previous" >/dev/null 2>&1 || true  # our stale import, unless still in use
    fi
fi
echo "$name"
