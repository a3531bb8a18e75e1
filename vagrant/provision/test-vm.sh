#!/usr/bin/env bash
# Step 2 of a test VM: Debian 12 userspace for ebpflb, `make setup`, and `ebpflb-make`
# (make in /ebpflb as root, in that userspace).
#
# Debian 12: the VM's own system. Debian 11 and Ubuntu 22.04 have no Python 3.11, which
# ebpflb needs: a Debian 12 chroot (debootstrap) runs on the VM's kernel with the host's
# /proc, /sys (bpffs, cgroup2), /dev, /run and the running kernel's modules and headers
# bound in, as the DaemonSet's Debian 12 image runs on such a node.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
. /etc/os-release
kernel=$(uname -r)
case "$kernel" in
    "$EBPFLB_KERNEL_LINE".*) ;;
    *) echo "test-vm.sh: expected a $EBPFLB_KERNEL_LINE kernel, running $kernel" >&2; exit 1 ;;
esac
[ -e "/lib/modules/$kernel/build/Makefile" ] \
    || { echo "test-vm.sh: no headers for $kernel (did kernel.sh run and the VM reboot?)" >&2; exit 1; }

if [ "$ID" = debian ] && [ "$VERSION_ID" = 12 ]; then
    cat > /usr/local/bin/ebpflb-make <<'SH'
#!/bin/sh
# make in the synced repository, as root (the kernel tests load BPF programs)
exec sudo make -C /ebpflb "$@"
SH
else
    root=/srv/ebpflb-bookworm
    if [ ! -x "$root/usr/bin/python3" ]; then
        apt-get install -y -qq debootstrap
        debootstrap --include=make,ca-certificates,python3 bookworm "$root" http://deb.debian.org/debian
    fi
    cat > /usr/local/sbin/ebpflb-chroot <<SH
#!/bin/sh
# Run a command in the Debian 12 chroot on this VM's kernel (see vagrant/provision/test-vm.sh).
set -e
root=$root
kernel=\$(uname -r)
bound() { mountpoint -q "\$root\$1"; }
bind() { mkdir -p "\$root\$1"; bound "\$1" || mount --rbind "\$1" "\$root\$1"; mount --make-rslave "\$root\$1"; }
bind /proc; bind /sys; bind /dev; bind /run; bind /ebpflb
bind "/lib/modules/\$kernel"
for headers in /usr/src/linux-headers-*; do bind "\$headers"; done
cp -L /etc/resolv.conf "\$root/etc/resolv.conf"
exec chroot "\$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM="\${TERM:-dumb}" "\$@"
SH
    chmod 755 /usr/local/sbin/ebpflb-chroot
    cat > /usr/local/bin/ebpflb-make <<'SH'
#!/bin/sh
# make in the synced repository, as root, in the Debian 12 chroot
exec sudo /usr/local/sbin/ebpflb-chroot make -C /ebpflb "$@"
SH
fi
chmod 755 /usr/local/bin/ebpflb-make
/usr/local/bin/ebpflb-make setup
echo "test-vm.sh: ready on $kernel; run: vagrant ssh $(hostname | sed 's/^ebpflb-//') -c 'ebpflb-make test'"
