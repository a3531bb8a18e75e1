"""The pin directory: bpffs mounted, each pinned map checked against the contract's layout
for this configuration, and the pins removed again by `ebpflb cleanup`.

BCC opens any map pinned at a name it declares, whatever its shape, so the loader drops a
pin whose layout changed (a size flag or an upgrade) before compiling; the backend hash of
an older ebpflb is instead replaced by the array holding the same backends.
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import dataclasses
import errno
import logging
import os
import re
import stat
from pathlib import Path

import numpy as np

from ebpflb.config import Config
from ebpflb.datapath import contract
from ebpflb.datapath.contract import MapLayout, MapName
from ebpflb.datapath.maps import growable, pinlayout
from ebpflb.datapath.maps.elementio import ElementIO
from ebpflb.datapath.syscall import bpfsys
from ebpflb.datapath.syscall.mounts import is_bpffs
from ebpflb.errors import KernelSetupError

log = logging.getLogger(__name__)

# A program's pin: prog-<first 16 hex digits of its build hash>-<function name>.
PROGRAM_PIN = re.compile(r"^prog-([0-9a-f]{16})-(\w+)$")


def ensure_bpffs(pin_dir: Path) -> None:
    """Create the pin directory; mount bpffs at /sys/fs/bpf if nothing is mounted there."""
    if not any(is_bpffs(p) for p in (pin_dir, *pin_dir.parents)):
        default = Path("/sys/fs/bpf")
        if default not in (pin_dir, *pin_dir.parents):
            raise KernelSetupError(f"{pin_dir} is not on a bpf filesystem")
        rc = os.system("mount -t bpf bpf /sys/fs/bpf")
        if rc != 0:
            raise KernelSetupError("bpffs is not mounted at /sys/fs/bpf and mounting it failed")
        log.info("mounted bpffs at /sys/fs/bpf")
    try:
        pin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise KernelSetupError(f"cannot create pin directory {pin_dir}: {exc.strerror}") from exc
    restrict_pin_dir(pin_dir)


def restrict_pin_dir(pin_dir: Path) -> None:
    """Make the pin directory this agent's alone: 0700, and every pin in it 0600.

    A pin is the map itself: whoever may open it may send any Service anywhere. The kernel
    creates pins 0600 already, but bpffs's root is world-writable (1777), so another user
    could have made the directory first and could then swap the pins: such a directory, or
    a symlink in its place, is refused."""
    info = os.lstat(pin_dir)
    if not stat.S_ISDIR(info.st_mode):
        raise KernelSetupError(f"{pin_dir} is not a directory (a symlink?): remove it")
    if info.st_uid != os.geteuid():
        raise KernelSetupError(
            f"{pin_dir} belongs to uid {info.st_uid}, not to this agent (uid {os.geteuid()}),"
            " so its owner could replace the pins: remove it and start again"
        )
    os.chmod(pin_dir, 0o700)
    for entry in os.scandir(pin_dir):  # pins a previous agent (or an older ebpflb) left
        if entry.is_file(follow_symlinks=False):
            os.chmod(entry.path, 0o600)


def expected_map_layout(config: Config) -> dict[str, MapLayout]:
    """Type, key and value sizes, max entries and flags of every pinned map (a growable
    map's max entries: the limit it may grow to)."""
    return {name.value: spec.layout(config) for name, spec in contract.MAPS.items()}


def compatible(name: str, actual: MapLayout, expected: MapLayout) -> bool:
    """The pinned map can serve: its layout is the expected one, or, for a growable map,
    the same but no larger than its limit (it grew that far)."""
    if actual == expected:
        return True
    if MapName(name) not in contract.GROWABLE:
        return False
    return dataclasses.replace(actual, max_entries=expected.max_entries) == expected and (
        actual.max_entries <= expected.max_entries
    )


def pinned_layout(path: Path) -> MapLayout | None:
    """What the kernel says of the map pinned at `path`; None when nothing is there."""
    try:
        fd = bpfsys.obj_get(str(path))
    except bpfsys.BpfError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    try:
        info = bpfsys.map_info(fd, path.name)
    finally:
        os.close(fd)
    return MapLayout(info.type, info.key_size, info.value_size, info.max_entries, info.flags)


def drop_incompatible(config: Config) -> list[str]:
    """Unpin maps whose layout differs from this configuration (a size change or upgrade).

    BCC would otherwise reuse a pinned map of any shape. The service, backend and slot maps
    are rebuilt from the desired state right after start; a dropped reverse-translation map
    only costs getpeername() on sockets connected before the restart.
    """
    dropped = []
    for name, expected in expected_map_layout(config).items():
        path = config.bpffs_dir / name
        actual = pinned_layout(path)
        if actual is None or compatible(name, actual, expected):
            continue
        if name == MapName.BACKENDS and _backends_to_array(path, actual, expected):
            continue
        spec = contract.MAPS[MapName(name)]
        if spec.name in contract.GROWABLE and growable.migrate(spec, config, path):
            continue  # an older ebpflb's pool, copied: its tables stay readable
        if spec.name not in contract.GROWABLE and growable.copy_into_new_layout(spec, config, path):
            continue  # the same entries in the new layout: nothing to rebuild
        log.warning(
            "pinned map %s has layout %s, config wants %s: recreating it", path, actual, expected
        )
        try:
            path.unlink()
        except OSError as exc:
            raise KernelSetupError(f"cannot remove the stale pin {path}: {exc.strerror}") from exc
        dropped.append(name)
    for name, ref in contract.GROWABLE.items():
        if name.value in dropped:  # the ref map still holds the old one
            with contextlib.suppress(FileNotFoundError):
                (config.bpffs_dir / ref.value).unlink()
    return dropped


def _backends_to_array(path: Path, actual: MapLayout, expected: MapLayout) -> bool:
    """Replace the backend hash an older ebpflb pinned by the array this one uses, carrying
    every backend over at its id; whether it did. Traffic keeps flowing: the programs still
    attached keep the old hash (they hold it) until the new programs replace them, and the
    new ones find the same backends at the same ids, so the restarted agent rewrites
    nothing. Unpinned only once the array holding the same entries is pinned in its place."""
    if (actual.type, expected.type) != (contract.MapType.HASH, contract.MapType.ARRAY) or (
        actual.key_size,
        actual.value_size,
    ) != (expected.key_size, expected.value_size):
        return False
    old = bpfsys.obj_get(str(path))
    try:
        keys, values, count = ElementIO(
            old, path.name, actual.key_size, actual.value_size
        ).read_all(ct.c_uint32, contract.Lb4Backend)
    finally:
        os.close(old)
    ids = np.frombuffer(keys, dtype=np.uint32, count=count)
    fits = np.flatnonzero((ids > 0) & (ids < expected.max_entries))
    new = bpfsys.map_create(
        contract.MapType.ARRAY,
        expected.key_size,
        expected.value_size,
        expected.max_entries,
        f"the backend array {path}",
        expected.flags,
        name=path.name,
    )
    try:
        kept_keys = np.ascontiguousarray(ids[fits])
        rows = np.frombuffer(values, dtype=np.uint8, count=count * expected.value_size)
        kept_values = np.ascontiguousarray(rows.reshape(count, -1)[fits])
        io = ElementIO(new, path.name, expected.key_size, expected.value_size)
        failed = io.update(kept_keys.ctypes.data, kept_values.ctypes.data, len(fits))
        if failed:
            raise KernelSetupError(
                f"carrying backends over to the new array {path} failed: "
                f"{os.strerror(next(iter(failed.values())))}"
            )
        staged = path.with_name(path.name + "_new")  # bpffs refuses a "." in a pin name
        bpfsys.obj_pin(new, str(staged))
        os.replace(staged, path)  # bpffs renames atomically: never a moment without a pin
    finally:
        os.close(new)
    log.warning(
        "pinned map %s is the hash of an older ebpflb: replaced by an array indexed by backend"
        " id, %d of %d backends carried over%s; traffic keeps using the old map until the new"
        " programs are attached",
        path,
        len(fits),
        count,
        "" if len(fits) == count else " (ids beyond --max-backends are rewritten by the sync)",
    )
    return True


def remove_pins(bpffs_dir: Path) -> int:
    """Unpin every ebpflb map and program under `bpffs_dir` and the directory if it is then
    empty; the number of pins removed."""
    removed = 0
    if not bpffs_dir.exists():
        return 0
    # The maps, the programs pinned next to them (loader.program_pin), and a growable map's
    # "_next" pin (an agent killed while growing it: growable.py).
    names = [name.value for name in MapName]
    names += [p.name for p in bpffs_dir.iterdir() if PROGRAM_PIN.match(p.name)]
    names += [f"{name.value}_next" for name in contract.GROWABLE]
    names.append(pinlayout.PIN)
    for name in names:
        pin = bpffs_dir / name
        if pin.exists():
            try:
                pin.unlink()
            except OSError as exc:
                raise KernelSetupError(f"cannot remove pin {pin}: {exc.strerror}") from exc
            removed += 1
    with contextlib.suppress(OSError):  # not empty: somebody else's pins, keep them
        bpffs_dir.rmdir()
    return removed
