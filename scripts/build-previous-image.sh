#!/usr/bin/env bash
# `make image-previous`: the previous release's image (deploy/previous-release), built as
# that release built it: its own tree (git archive of its commit, outside the checkout) and
# its own scripts/build-image.sh. Layers shared with `make image` come from buildah's cache.
# Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'image-previous: %s\n' "$*" >&2; }
value() { sed -n "s/^$1=//p" deploy/previous-release; }
commit=$(value COMMIT) version=$(value VERSION) image=$(value IMAGE)

if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    # A shallow clone lacks the release's commit; its history is what holds it.
    if [ "$(git rev-parse --is-shallow-repository)" = true ]; then
        log "fetching the history that holds $commit (this clone is shallow)"
        git fetch --quiet --unshallow || true
    fi
    git cat-file -e "$commit^{commit}" 2>/dev/null || {
        log "the previous release's commit $commit is not in this clone: clone with its history"
        exit 1
    }
fi
tree=$(mktemp -d /tmp/ebpflb-previous-XXXXXX)
trap 'rm -rf "$tree"' EXIT
git archive "$commit" | tar -x -C "$tree"
found=$(sed -n 's/^version = "\(.*\)"/\1/p' "$tree/pyproject.toml")
[ "$found" = "$version" ] || { log "$commit is version $found, not $version"; exit 1; }
log "building ebpflb $version ($commit) as $image"
EBPFLB_IMAGE=$image "$tree/scripts/build-image.sh"
