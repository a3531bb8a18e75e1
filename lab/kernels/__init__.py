"""The kernel matrix: the kernel tests (tests/kernel/) on Debian's kernels, booted under qemu.

`python -m lab.kernels run` (`make test-kernels`) fetches each kernel line's
Debian image and headers into a cache outside the checkout (debian.py), boots it under
software emulation with the host's root filesystem shared read-only over 9p (initramfs.py,
vm.py), runs pytest inside (guest.py), and reads back a JUnit file per kernel (junit.py).
`... table` turns those files into the README's kernel table (features.py).

Nothing here imports bcc: the host side only prepares and reads files; inside the guest the
tests import what they import.
"""
