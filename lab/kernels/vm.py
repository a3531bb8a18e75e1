"""Boot one kernel under qemu, run the guest's plan, read its result back.

Software emulation only (TCG): /dev/kvm on these machines is PVM, which runs no stock kernel
(shared/notes/kernel-matrix.md).
qemu exits 0 whatever the guest did, so the result is the guest's own: the exit-status file
it writes into the results share, or else its console line; neither means the run failed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lab.kernels import initramfs
from lab.kernels.debian import Kernel
from lab.kernels.guest import Plan
from lab.kernels.plan import guest_script

QEMU = "qemu-system-x86_64"
MEMORY = "2048M"  # the agent alone is ~300 MiB RSS, a BCC compile ~200 MiB more
# Two vCPUs (tests pin a client to CPU 0 and a server or the agent to CPU 1) run by one host
# thread (thread=single): the second vCPU costs no second host core, so two kernels booted
# at once still take one core each. Measured against one vCPU: ~10% slower (4.5 vs 4.0 min
# for the same imports and compiles), the price of running the tests that pin to CPU 1.
CPUS = 2
KERNEL_ARGS = (
    "console=ttyS0",
    "panic=-1",  # a panic reboots, and -no-reboot turns that into qemu's exit
    "quiet",
    "loglevel=4",
    "mitigations=off",  # nothing to protect in a throwaway guest; emulated barriers are slow
    "random.trust_cpu=on",  # the emulated RDRAND seeds the CRNG: getrandom() never waits
    "tsc=reliable",
)


@dataclass(frozen=True, slots=True)
class GuestResult:
    status: int | None  # the guest's exit status; None: it gave none
    seconds: float
    cpu_seconds: float  # qemu's CPU time: about the wall time on an otherwise idle core
    timed_out: bool
    console: Path


def qemu_argv(
    kernel: Path,
    initrd: Path,
    results: Path,
    memory: str = MEMORY,
    host_root: str = "/",
    cpus: int = CPUS,
) -> list[str]:
    return [
        QEMU,
        "-accel",
        "tcg,thread=single,tb-size=128",
        "-cpu",
        "max",
        "-smp",
        str(cpus),
        "-m",
        memory,
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        " ".join(KERNEL_ARGS),
        "-chardev",
        "stdio,id=console,signal=off",
        "-serial",
        "chardev:console",
        "-fsdev",
        f"local,id=hostroot,path={host_root},readonly=on,security_model=none,multidevs=remap",
        "-device",
        "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        "-fsdev",
        f"local,id=results,path={results},security_model=passthrough,multidevs=remap",
        "-device",
        "virtio-9p-pci,fsdev=results,mount_tag=results",
    ]


_STATUS = re.compile(re.escape(initramfs.STATUS_MARKER) + r"\s*(\d+)")


def status_from(results: Path, console: str) -> int | None:
    """The guest's exit status: its exit-status file, else the console's marker line."""
    with contextlib.suppress(OSError, ValueError):
        return int((results / "exit-status").read_text().strip())
    found = _STATUS.findall(console)
    return int(found[-1]) if found else None


def cpu_seconds_of(pid: int) -> float | None:
    """User + system CPU time of a running process (/proc/PID/stat), or None once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def boot(
    kernel: Kernel,
    plan: Plan,
    results: Path,
    timeout: float,
    echo: Callable[[str], None] = print,
) -> GuestResult:
    """Run `plan` in one boot of `kernel`; `results` is the (empty) shared directory.
    The VM is killed after `timeout` seconds (a stalled emulated guest never ends)."""
    results.mkdir(parents=True, exist_ok=True)
    (results / "plan.json").write_text(plan.to_json())
    (results / "guest.sh").write_text(guest_script(plan.repo))
    initrd = results / "initramfs.cpio"
    initrd.write_bytes(initramfs.build(kernel.root, kernel.modules))
    console = results / "console.log"
    argv = qemu_argv(kernel.vmlinuz, initrd, results)
    echo(f"$ {shlex.join(argv)}")
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a terminal's Ctrl-C reaches the harness, which stops it
    )
    assert proc.stdout is not None

    def copy_console() -> None:
        assert proc.stdout is not None
        with console.open("wb") as log:
            for raw in proc.stdout:
                log.write(raw)
                log.flush()
                echo(raw.decode(errors="replace").rstrip("\r\n"))

    reader = threading.Thread(target=copy_console, daemon=True)
    reader.start()
    timed_out = False
    cpu = 0.0
    deadline = started + timeout
    try:
        # Sampled until the end: the last sample is within a second of qemu's exit.
        while proc.poll() is None:
            cpu = cpu_seconds_of(proc.pid) or cpu
            if time.monotonic() > deadline:
                timed_out = True
                echo(
                    f"kernel matrix: the VM ran past {timeout:.0f}s: killing qemu (pid {proc.pid})"
                )
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    seconds = time.monotonic() - started
    initrd.unlink(missing_ok=True)
    text = console.read_text(errors="replace") if console.exists() else ""
    status = None if timed_out else status_from(results, text)
    return GuestResult(
        status=status, seconds=seconds, cpu_seconds=cpu, timed_out=timed_out, console=console
    )


def qemu_available() -> str | None:
    """Why the matrix cannot run here, or None."""
    for tool in (QEMU, "dpkg-deb", "depmod", "apt-get"):
        if shutil.which(tool) is None:
            return f"{tool} not found (scripts/kernels/install.sh installs what the matrix needs)"
    if not initramfs.BUSYBOX.exists():
        return f"{initramfs.BUSYBOX} missing (Debian's busybox-static)"
    if os.geteuid() != 0:
        return "the kernel matrix runs as root (its cache is in /var/cache, qemu shares /)"
    return None
