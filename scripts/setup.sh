#!/usr/bin/env bash
# Idempotent machine setup for ebpflb on Debian 12 (run as root, from the repo root).
#
# 1. Debian packages: BCC (python3-bpfcc, libbpfcc), bpftool, kernel headers, iproute2;
#    kubectl (kubernetes-client) where none is on PATH.
# 2. /lib/modules/$(uname -r)/{build,source} links when the running kernel ships no headers:
#    BCC compiles at start-up and needs them; Debian's newest linux-headers-*-amd64 work for
#    the structs the programs use (uapi bpf.h, in.h).
# 3. bpffs at /sys/fs/bpf.
# 4. .venv on Debian's python3 with the `bcc` module made visible by a .pth file (never the
#    unrelated PyPI package "bcc"), and this package installed editable with its test extras,
#    with the lab (lab/: the bench, the test harness, the kernel matrix, the demo) beside it.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
venv="$repo/.venv"
python=/usr/bin/python3

log() { printf 'setup: %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "setup: must run as root (installs packages, links headers, mounts bpffs)" >&2; exit 1; }

packages=(python3-bpfcc libbpfcc bpftool linux-headers-amd64 iproute2 iptables nftables
          python3-venv python3-dev util-linux procps kmod ethtool  # python3-dev: ebpflb/maglev/fill.c
          gcc libc6-dev conntrack nfacct  # ebpflb bench: its client, conntrack flushes, kube-proxy counters
          iperf3  # bulk TCP through a NodePort (tests/kernel/nodeport/test_bulk.py, ebpflb bench bulk)
          netsniff-ng  # trafgen: ebpflb bench pps, tests/kernel/nodeport/test_paged_headers.py
          nginx-core curl dnsmasq-base bind9-dnsutils  # real servers and clients in namespaces
          prometheus)  # promtool and a server on 127.0.0.1 for deploy/monitoring's tests
# `kubectl kustomize` renders deploy/'s overlays (tests/unit/repo/test_kustomize.py).
# Debian's kubectl (1.20, kustomize v2.0.3) only where there is none: another package's
# kubectl (a newer one) owns the same path.
command -v kubectl >/dev/null || packages+=(kubernetes-client)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Packages with a service (nginx) must not start it on the machine itself: the tests run
    # their own servers inside namespaces. policy-rc.d tells invoke-rc.d to start nothing.
    policy=/usr/sbin/policy-rc.d
    own_policy=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    [ -z "$own_policy" ] || rm -f "$policy"
    # Debian enables prometheus.service, which would serve 0.0.0.0:9090 from the next boot:
    # the tests start their own server on a loopback port.
    if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null; then
        systemctl disable prometheus.service >/dev/null 2>&1 || true
    fi
fi

kernel=$(uname -r)
moddir=/lib/modules/$kernel
if [ ! -e "$moddir/build/include/generated/autoconf.h" ] && [ ! -e "$moddir/build/Makefile" ]; then
    # Newest installed Debian header set: linux-headers-<ver>-amd64 (+ its -common).
    hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | grep -v -e '-rt-' -e '-cloud-' | sort -V | tail -n 1)
    [ -n "$hdr" ] || { echo "setup: no /usr/src/linux-headers-*-amd64 after installing linux-headers-amd64" >&2; exit 1; }
    common=${hdr%-amd64}-common
    [ -d "$common" ] || { echo "setup: $common missing" >&2; exit 1; }
    mkdir -p "$moddir"
    ln -sfn "$hdr" "$moddir/build"
    ln -sfn "$common" "$moddir/source"
    log "linked $moddir/build -> $hdr (running kernel $kernel has no headers package)"
fi

if ! awk '$3 == "bpf" && $2 == "/sys/fs/bpf" {found=1} END {exit !found}' /proc/mounts; then
    mount -t bpf bpf /sys/fs/bpf
    log "mounted bpffs at /sys/fs/bpf"
fi

if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv"
    "$python" -m venv "$venv"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
bcc_dir=$("$python" -c 'import bcc, os; print(os.path.dirname(os.path.dirname(bcc.__file__)))')
# Expose only Debian's bcc package: a directory holding a link to it, put on sys.path by a .pth.
mkdir -p "$venv/debian-bcc"
ln -sfn "$bcc_dir/bcc" "$venv/debian-bcc/bcc"
echo "$venv/debian-bcc" > "$site/debian-bcc.pth"

# Reinstalled when a pyproject.toml or a C extension's source (compiled by the install)
# changes (find does not follow ebpflb/bpf, the link to the BPF programs).
stamp="$venv/.installed-$(cat "$repo/pyproject.toml" "$repo/lab/pyproject.toml" $(find "$repo/ebpflb" -name '*.c' | sort) | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
    log "installing ebpflb and the lab (editable) and their dependencies"
    # ebpflb first: pip resolves the lab's requirement of ebpflb to this checkout only then.
    "$venv/bin/pip" install -q --disable-pip-version-check -e "$repo[test,bench]" -e "$repo/lab[bench]"
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
"$venv/bin/python" -c 'import bcc, ebpflb.maglev, lab' || { echo "setup: venv cannot import bcc/ebpflb.maglev/lab" >&2; exit 1; }
log "ready: $venv/bin/ebpflb"
