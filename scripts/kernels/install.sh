#!/usr/bin/env bash
# Idempotent install of what the kernel matrix (`make test-kernels`) and the Vagrant check
# (tests/unit/repo/test_vagrant.py) need, on Debian 12, as root:
#   qemu-system-x86   boots Debian's kernels under emulation (lab/kernels/vm.py)
#   busybox-static    the guest initramfs's only program
#   kmod, dpkg        depmod and dpkg-deb, to unpack the kernel packages into the cache
#   vagrant, vagrant-libvirt   `vagrant validate` of vagrant/Vagrantfile (the libvirt
#                     provider validates its settings; VirtualBox is not in Debian)
set -euo pipefail
packages=(qemu-system-x86 busybox-static kmod dpkg apt vagrant vagrant-libvirt)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "kernels: installing ${missing[*]} needs root" >&2; exit 1; }
    printf 'kernels: installing %s\n' "${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
