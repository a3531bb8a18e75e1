"""The real agent serving the bench's services: set up, started, ready, removed.

The fake API server (lab.harness.fakeapi, real HTTP) holds N Services with one
EndpointSlice of K endpoints each before `ebpflb run --kubeconfig` starts, so "programmed
from nothing" is the agent's cold start. The agent gets its own bpffs directory, a test
cgroup (unless given one), map sizes with room for every service, and its health and
metrics servers on 127.0.0.1 of its namespace; it is ready when /readyz says so, and its
start-up figures come from /status (lab.bench.agent). On exit everything it made goes.
Used by `bench compare` (in the node namespace) and `bench sync`. With `manifests`, the
agent reads the services from one manifest file instead (`ebpflb run --manifests`), written
before the spawn; the API server is then left empty.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ebpflb.errors import EbpflbError
from lab.bench.agent import AgentError, Endpoints, startup
from lab.bench.manifests import ManifestFile
from lab.bench.measure.changes import ChangeTiming, change_latencies
from lab.bench.measure.cost import KernelMemoryCgroup, process_cpu_seconds, process_memory
from lab.bench.records.agent import AgentStartup, MapSizes, ProcessMemory
from lab.bench.scenario import BenchService, objects
from lab.harness.nshttp import free_ports, thread_in_netns

if TYPE_CHECKING:
    from lab.harness.agentproc import AgentProcess
    from lab.harness.fakeapi import FakeApiServer

START_TIMEOUT = 600.0


def map_sizes(services: int, endpoints: int, frontends: int | None = None) -> MapSizes:
    """--slot-pool-size, --max-services and --max-backends with room for every service's
    table, frontend and backend (and for resizes), never below the defaults."""
    from ebpflb.config import Config
    from ebpflb.maglev import table_size_for

    default = Config()
    frontends = frontends or services + 8

    def room(needed: int, floor: int) -> int:
        return max(1 << (needed * 5 // 4).bit_length(), floor)

    return MapSizes(
        slot_pool_size=room(services * table_size_for(endpoints), default.slot_pool_size),
        max_services=room(frontends, default.max_services),
        max_backends=room(services * endpoints, default.max_backends),
    )


def interfaces_in(args: Sequence[str]) -> list[str]:
    """The interfaces an `--interfaces` argument names (the only ones to clean up)."""
    names: list[str] = []
    for index, arg in enumerate(args):
        if arg.startswith("--interfaces="):
            names = arg.partition("=")[2].split(",")
        elif arg == "--interfaces" and index + 1 < len(args):
            names = args[index + 1].split(",")
    return [name for name in names if name]


@dataclass
class RunningAgent:
    """An `ebpflb run` process serving the bench's services, and its start-up figures."""

    agent: AgentProcess
    api: FakeApiServer
    services: Sequence[BenchService]
    bpffs: Path
    endpoints: Endpoints
    startup: AgentStartup
    spawn: Callable[[], tuple[AgentProcess, AgentStartup]]
    manifests: ManifestFile | None = None  # the agent's source, when not the API server

    def restart(self) -> AgentStartup:
        """Stop the agent (SIGTERM, as an upgrade would) and start it again on the same
        pins, cgroup and source; the new process's start-up figures."""
        self.agent.stop()
        self.agent, figures = self.spawn()
        return figures

    # The memory cgroup the agent runs in, if the caller made one (its kernel-memory figure).
    memory_cgroup: KernelMemoryCgroup | None = None

    @property
    def pid(self) -> int:
        return self.agent.proc.pid

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def memory(self) -> ProcessMemory:
        return process_memory(self.pid)

    def change_latencies(self, picks: Sequence[int], *, pause: float) -> list[ChangeTiming]:
        """One endpoint turning not ready per pick: in the API, or in the manifest file."""
        write = self.manifests.write_change if self.manifests else self.api.update
        return change_latencies(
            write, self.bpffs, self.services, picks, agent_pid=self.pid, pause=pause
        )


@contextlib.contextmanager
def running_agent(
    services: Sequence[BenchService],
    *,
    extra_args: Sequence[str] = (),
    netns: str | None = None,
    cgroup: Path | None = None,
    sync_period: float = 3600.0,
    min_sync_period: float = 0.1,
    preexec_fn: Callable[[], None] | None = None,
    manifests: bool = False,
) -> Iterator[RunningAgent]:
    """Serve `services` from a fake API server, start `ebpflb run` on it (inside `netns` if
    given, with `extra_args` such as `--interfaces eth0,eth1`), wait until it is ready and
    yield it with its start-up figures; stop it and remove everything it made on exit.

    `cgroup`: where socket-LB attaches (default: a test cgroup made here). `preexec_fn`
    runs in the agent's process before exec (e.g. CPU affinity, a memory cgroup).
    `manifests`: the services come from one manifest file, not the API server. Root only.
    """
    # Imported here so that `bench --help` works without bcc and without root.
    from ebpflb.datapath.programs import loader
    from ebpflb.maglev import table_size_for
    from lab.harness.agentproc import AgentProcess, cleanup_datapath
    from lab.harness.fakeapi import FakeApiServer
    from lab.harness.netns import Cgroup

    if os.geteuid() != 0:
        raise EbpflbError("the agent loads BPF programs: run the bench as root")
    tag = uuid.uuid4().hex[:8]
    bpffs = Path(f"/sys/fs/bpf/ebpflb-bench-{tag}")
    workdir = Path(tempfile.mkdtemp(prefix="ebpflb-bench-"))
    api = FakeApiServer()
    own_cgroup: Cgroup | None = None
    agents: list[AgentProcess] = []
    manifest_file: ManifestFile | None = None
    try:
        # The agent's 127.0.0.1 is its namespace's: the API server must listen there.
        with thread_in_netns(netns) if netns else contextlib.nullcontext():
            api.start()
        loaded = time.perf_counter()
        if manifests:
            manifest_file = ManifestFile.write(workdir / "services.yaml", services)
            source_args = ["--manifests", str(manifest_file.path)]
        else:
            api.load(objects(list(services)))
            api.compact()
            source_args = ["--kubeconfig", str(api.write_kubeconfig(workdir / "kubeconfig"))]
        api_load_s = time.perf_counter() - loaded
        # The stored objects live as long as the run: out of the cyclic GC's reach, or its
        # full collections (over a second at 100,000 x 10 endpoints) stall this process's
        # API server, writers and pollers mid-measurement.
        gc.freeze()
        if cgroup is None:
            own_cgroup = Cgroup.create(f"ebpflb-bench-{tag}")
            cgroup = own_cgroup.path
        sizes = map_sizes(len(services), services[0].endpoint_count)
        health_port, metrics_port = free_ports(2, netns)
        endpoints = Endpoints(
            health=f"127.0.0.1:{health_port}", metrics=f"127.0.0.1:{metrics_port}", netns=netns
        )
        argv = [
            *source_args,
            "--bpffs",
            str(bpffs),
            "--cgroup",
            str(cgroup),
            f"--slot-pool-size={sizes.slot_pool_size}",
            f"--max-services={sizes.max_services}",
            f"--max-backends={sizes.max_backends}",
            f"--sync-period={sync_period}",
            f"--min-sync-period={min_sync_period}",
            f"--healthz-bind-address={endpoints.health}",
            f"--metrics-bind-address={endpoints.metrics}",
            *extra_args,
        ]

        def spawn() -> tuple[AgentProcess, AgentStartup]:
            spawned_at = time.time()
            agent = AgentProcess(
                argv, netns=netns, log_file=workdir / "agent.log", preexec_fn=preexec_fn
            )
            agents.append(agent)
            try:
                endpoints.wait_ready(lambda: agent.proc.poll() is None, START_TIMEOUT)
                cpu = process_cpu_seconds(agent.proc.pid)
                figures = startup(endpoints.status(), spawned_at, cpu)
            except AgentError as exc:  # the agent died, hung or answered oddly: say why
                raise EbpflbError(f"ebpflb run: {exc}\n{agent.output()[-3000:]}") from exc
            return agent, figures

        agent, figures = spawn()
        if figures.sync_errors or figures.frontends < len(services):
            raise EbpflbError(
                f"unexpected first sync: {figures.frontends} frontends for {len(services)}"
                f" services, {figures.sync_errors} errors\n{agent.output()[-3000:]}"
            )
        figures = replace(
            figures,
            api_load_s=api_load_s,
            map_sizes=sizes,
            table_size=table_size_for(services[0].endpoint_count),
        )
        yield RunningAgent(agent, api, services, bpffs, endpoints, figures, spawn, manifest_file)
    finally:
        for started in agents:
            started.stop()
        api.close()
        if cgroup is not None:
            cleanup_datapath(bpffs, cgroup, interfaces_in(extra_args), netns=netns)
        if bpffs.exists():  # pins the cleanup did not know (or cleanup failed)
            loader.cleanup(bpffs, Path("/nonexistent"), interfaces=())
        if own_cgroup is not None:
            own_cgroup.close()
        shutil.rmtree(workdir, ignore_errors=True)  # failures quote the agent's log already
        gc.unfreeze()
