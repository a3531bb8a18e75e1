#!/usr/bin/env bash
# Step 1 of every VM: the distribution's current kernel with its matching headers (BCC
# compiles ebpflb's programs against /lib/modules/$(uname -r)/build at start-up). A box's
# own kernel may be older than any headers package its archive still has, so the kernel is
# upgraded with them; Vagrant reboots the VM after this step (reboot: true).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
. /etc/os-release
apt-get update -qq
case "$ID" in
    debian) apt-get install -y -qq linux-image-amd64 linux-headers-amd64 make rsync ;;
    ubuntu) apt-get install -y -qq linux-generic make rsync ;;
    *) echo "kernel.sh: unsupported distribution $ID" >&2; exit 1 ;;
esac
echo "kernel.sh: running $(uname -r); the newest installed kernel boots next"
