"""A matrix run: fetch each kernel, boot it once with the plan, collect JUnit and a summary.

Per kernel, .ci/out/kernels/<line>/ gets junit.xml (the guest's, or a stand-in failure when
the guest gave no result), console.log, guest.json (the release it ran), features.json when
the plan probes; .ci/out/kernels/junit.xml merges them all. The run fails when any kernel
has a failed test, no result, or no test at all.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from lab.kernels import debian, junit, plan, vm

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / ".ci" / "out" / "kernels"
# A hard limit per VM, so that a stalled guest cannot hold a run forever. The whole suite
# takes about two hours per kernel under emulation with both kernels at once on a 2-core
# host; CI's selection runs with a tighter limit (Makefile, test-kernels-ci) so that .ci/run
# (make test first) ends within CI's 90 minutes.
DEFAULT_VM_TIMEOUT = 180 * 60
# The agent's own kernel feature probe; its report (features.json) feeds the README table.
FEATURE_PROBE = ("ebpflb.datapath.probes", "--json")


@dataclass(frozen=True, slots=True)
class Options:
    kernels: tuple[str, ...]
    selection: tuple[str, ...] = (plan.KERNEL_TESTS,)
    out: Path = DEFAULT_OUT
    cache: Path = debian.DEFAULT_CACHE
    jobs: int = 2
    vm_timeout: float = DEFAULT_VM_TIMEOUT
    refresh: bool = False
    probe: tuple[str, ...] = ()
    # A selection per kernel line (CI's, lab/kernels/ci.py) over `selection`.
    per_line: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def selection_on(self, line: str) -> tuple[str, ...]:
        return self.per_line.get(line, self.selection)


def run_kernel(line: str, options: Options, echo: Callable[[str], None]) -> junit.KernelResult:
    started = time.monotonic()
    out = options.out / line
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    excluded = plan.excluded_on(line)
    release = ""
    try:
        kernel = debian.fetch(debian.kernel_line(line), options.cache, options.refresh)
        release = kernel.release
        echo(f"kernel {release} ({kernel.manifest.key}) from {options.cache}")
        guest_plan = plan.guest_plan(
            str(REPO), line, options.selection_on(line), probe=list(options.probe) or None
        )
        # The share lives outside the checkout: the guest writes nothing into it.
        with tempfile.TemporaryDirectory(prefix=f"ebpflb-kernel-{line}-", dir="/var/tmp") as tmp:
            shared = Path(tmp)
            result = vm.boot(kernel, guest_plan, shared, options.vm_timeout, echo)
            for path in shared.iterdir():  # all the guest wrote, and the console
                if path.is_file() and path.name not in ("initramfs.cpio", "guest.sh"):
                    shutil.copyfile(path, out / path.name)
        problem = ""
        if result.timed_out:
            problem = f"VM killed after {options.vm_timeout / 60:.0f} min"
            console = out / "console.log"
            if console.is_file():
                echo(junit.progress_from_console(console.read_text(errors="replace")))
        elif result.status is None:
            problem = "no exit status from the guest (it crashed or never ran the tests)"
        elif not (out / "junit.xml").exists():
            problem = f"guest exited {result.status} without a JUnit file"
    except debian.KernelFetchError as exc:
        problem = f"fetching the kernel failed: {exc}"
        result = None
    if problem:
        echo(f"FAILED: {problem}")
        (out / "junit.xml").write_text(junit.missing_result(line, problem))
        cases: tuple[junit.Case, ...] = ()
    else:
        cases = tuple(junit.read_cases(out / "junit.xml"))
        if result is not None and result.status not in (0, 1):
            problem = f"pytest exited {result.status}"  # 1 is failed tests, counted below
        elif not cases:
            problem = "no test ran"
    return junit.KernelResult(
        kernel=line,
        release=release,
        cases=cases,
        seconds=time.monotonic() - started,
        cpu_seconds=result.cpu_seconds if result is not None else 0.0,
        excluded=len(excluded),
        problem=problem,
    )


def run(options: Options) -> int:
    lock = threading.Lock()

    def echo_for(line: str) -> Callable[[str], None]:
        def echo(text: str) -> None:
            with lock:
                print(f"[{line}] {text}", flush=True)

        return echo

    why_not = vm.qemu_available()
    if why_not:
        print(f"kernel matrix: {why_not}", file=sys.stderr)
        return 2
    for line in options.kernels:
        if line in options.per_line:
            echo_for(line)(f"runs {' '.join(options.per_line[line])}")
        for exclusion in plan.excluded_on(line):
            print(f"[{line}] excluded {exclusion.nodeid}: {exclusion.reason}")
    with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        futures = [
            pool.submit(run_kernel, line, options, echo_for(line)) for line in options.kernels
        ]
        results = [f.result() for f in futures]
    (options.out / "junit.xml").write_text(
        junit.merge([(r.kernel, options.out / r.kernel / "junit.xml") for r in results])
    )
    (options.out / "summary.json").write_text(
        json.dumps(junit.summary_rows(results), indent=2) + "\n"
    )
    print()
    print(junit.summary(results), end="")
    for r in results:
        for case in r.cases:
            if case.outcome is junit.Outcome.FAILED:
                first = case.message.splitlines()[0] if case.message else ""
                print(f"  {r.kernel}: FAILED {case.nodeid}: {first[:200]}")
    passed, failed, skipped = (
        sum(r.count(o) for r in results)
        for o in (junit.Outcome.PASSED, junit.Outcome.FAILED, junit.Outcome.SKIPPED)
    )
    # The plain closing line CI's log reader counts.
    print(f"kernels: {passed} passed, {failed} failed, {skipped} skipped")
    return 0 if all(r.ok for r in results) else 1


def parse_kernels(text: str) -> tuple[str, ...]:
    lines = tuple(text.replace(",", " ").split())
    for line in lines:
        debian.kernel_line(line)  # unknown lines fail before anything boots
    return lines


def selection_or_default(tests: Sequence[str]) -> tuple[str, ...]:
    return tuple(tests) or (plan.KERNEL_TESTS,)
