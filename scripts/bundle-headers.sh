#!/usr/bin/env bash
# A merged kernel header tree for BCC_KERNEL_SOURCE, from Debian's headers packages:
# linux-headers-<ver>-common (the generic include/ and arch/) overlaid with
# linux-headers-<ver>-<flavour> (the generated headers and the config). BCC reads a tree
# named by BCC_KERNEL_SOURCE as one root, not as Debian's build/ + source/ pair.
# Only include/ and the machine's arch/<arch>/include are kept: ebpflb's programs need
# nothing else (ebpflb/datapath/programs/headers.py).
#
#   scripts/bundle-headers.sh DEST [FLAVOUR_DIR]
# FLAVOUR_DIR defaults to the newest /usr/src/linux-headers-*-amd64 (or -arm64, by machine).
set -euo pipefail
dest=${1:?usage: bundle-headers.sh DEST [FLAVOUR_DIR]}
case "$(uname -m)" in
    x86_64) arch=x86 flavour=amd64 ;;
    aarch64) arch=arm64 flavour=arm64 ;;
    *) echo "bundle-headers: no Debian flavour known for $(uname -m)" >&2; exit 1 ;;
esac
flavoured=${2:-$(ls -d /usr/src/linux-headers-*-"$flavour" 2>/dev/null | sort -V | tail -1)}
[ -d "$flavoured/include/generated" ] || {
    echo "bundle-headers: no Debian kernel headers (/usr/src/linux-headers-*-$flavour): apt-get install linux-headers-$flavour" >&2
    exit 1
}
# linux-headers-6.1.0-57-amd64 -> linux-headers-6.1.0-57-common
common=${flavoured%-"$flavour"}-common
[ -d "$common/include/linux" ] || { echo "bundle-headers: $common is missing" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest/arch/$arch"
cp -a "$common/include" "$dest/"
cp -a "$common/arch/$arch/include" "$dest/arch/$arch/"
# The flavour's generated headers and config on top (include/generated, include/config,
# arch/<arch>/include/generated).
cp -a "$flavoured/include/." "$dest/include/"
cp -a "$flavoured/arch/$arch/include/." "$dest/arch/$arch/include/"
echo "bundle-headers: $dest from $(basename "$flavoured") ($(du -sh "$dest" | cut -f1))"
