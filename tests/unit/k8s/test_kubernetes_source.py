"""The Kubernetes source: the real `kubernetes` client over real HTTP to the fake API server
on 127.0.0.1, feeding a recording sink and the real Agent on fake maps. The source's
backoff runs on an injected clock, so retries do not sleep."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from ebpflb import cli
from ebpflb.clock import FakeClock
from ebpflb.config import Config
from ebpflb.datapath.maps import dump
from ebpflb.datapath.maps.fake import FakeMapSet
from ebpflb.errors import SourceError
from ebpflb.k8s.sources.base import Kind, ObjectSink
from ebpflb.k8s.sources.kubernetes import (
    ApiConfig,
    Backoff,
    KubernetesSource,
    WatchOptions,
    api_config,
)
from ebpflb.model import NamespacedName
from ebpflb.observe.metrics import Metrics
from ebpflb.sync.agent import Agent
from lab.harness.fakeapi import FakeApiServer, GoneMode, Request
from tests import REPO
from tests.factories import endpoint, endpoint_slice, service

SVC = Kind.SERVICE
EPS = Kind.ENDPOINT_SLICE


class Recorder:
    """An ObjectSink remembering every call, in order, and the picture it was given."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, Kind, str]] = []
        self.state: dict[tuple[Kind, str], str] = {}  # (kind, ns/name) -> resourceVersion

    def object_updated(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        ref = f"{meta['namespace']}/{meta['name']}"
        with self.lock:
            self.calls.append(("updated", kind, ref))
            self.state[(kind, ref)] = meta["resourceVersion"]

    def object_deleted(self, kind: Kind, ref: NamespacedName) -> None:
        with self.lock:
            self.calls.append(("deleted", kind, str(ref)))
            self.state.pop((kind, str(ref)), None)

    def initial_list_done(self, kind: Kind) -> None:
        with self.lock:
            self.calls.append(("done", kind, ""))

    def since(self, mark: int) -> list[tuple[str, Kind, str]]:
        with self.lock:
            return self.calls[mark:]

    def count(self, call: tuple[str, Kind, str]) -> int:
        with self.lock:
            return self.calls.count(call)


class Tee:
    def __init__(self, *sinks: ObjectSink) -> None:
        self.sinks = sinks

    def object_updated(self, kind: Kind, obj: Mapping[str, Any]) -> None:
        for sink in self.sinks:
            sink.object_updated(kind, obj)

    def object_deleted(self, kind: Kind, ref: NamespacedName) -> None:
        for sink in self.sinks:
            sink.object_deleted(kind, ref)

    def initial_list_done(self, kind: Kind) -> None:
        for sink in self.sinks:
            sink.initial_list_done(kind)


class RecordingClock(FakeClock):
    """Backoff waits return at once (time jumps), recorded per thread."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.waits: list[tuple[str, float]] = []

    def wait(self, event: threading.Event, timeout: float) -> bool:
        with self.lock:
            self.waits.append((threading.current_thread().name, timeout))
            result = super().wait(event, timeout)
        event.wait(0.005)  # yield, so a persistent failure cannot spin a core
        return result

    def waits_of(self, kind: Kind) -> list[float]:
        with self.lock:
            return [t for name, t in self.waits if name == f"kube-{kind.value}"]


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def server_state(api: FakeApiServer) -> dict[tuple[Kind, str], str]:
    return {
        (kind, f"{o['metadata']['namespace']}/{o['metadata']['name']}"): o["metadata"][
            "resourceVersion"
        ]
        for kind in Kind
        for o in api.objects(kind.value)
    }


def in_step(api: FakeApiServer, recorder: Recorder) -> Callable[[], bool]:
    return lambda: server_state(api) == dict(recorder.state)


def is_list(resource: str) -> Callable[[Request], bool]:
    return lambda r: r.resource == resource and not r.watch


def frontends(maps: FakeMapSet) -> dict[str, list[str]]:
    return {
        s["frontend"]: [b["address"] for b in s["backends"]] for s in dump.collect(maps)["services"]
    }


FAST = WatchOptions(page_size=2, watch_timeout=30, backoff=Backoff(initial=1.0, cap=4.0))


@pytest.fixture
def api(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    mode: GoneMode = getattr(request, "param", "event")
    server = FakeApiServer(gone_mode=mode).start()
    try:
        yield server
    finally:
        server.resume()
        server.close()


@pytest.fixture
def clock() -> RecordingClock:
    return RecordingClock()


SourceFactory = Callable[..., KubernetesSource]


@pytest.fixture
def start_source(api: FakeApiServer, clock: RecordingClock) -> Iterator[SourceFactory]:
    sources: list[KubernetesSource] = []

    def start(sink: ObjectSink, options: WatchOptions = FAST) -> KubernetesSource:
        source = KubernetesSource(
            sink, ApiConfig.from_host(api.url), options=options, clock=clock, rng=random.Random(7)
        )
        sources.append(source)
        source.start()
        return source

    try:
        yield start
    finally:
        api.resume()
        for source in sources:
            source.stop()


@pytest.fixture
def agent() -> Agent:
    return Agent(
        Config(min_sync_period=1.0, max_sync_period=60.0),
        FakeMapSet(),
        Metrics(CollectorRegistry()),
        clock=FakeClock(),
    )


def sync(agent: Agent) -> None:
    """Run the agent's next sync (its fake clock moved past the minimum interval)."""
    clock = agent.runner._clock
    assert isinstance(clock, FakeClock)
    clock.advance(2)
    agent.runner.run_once()


def agent_maps(agent: Agent) -> FakeMapSet:
    maps = agent.reconciler.maps
    assert isinstance(maps, FakeMapSet)
    return maps


def both_listed(recorder: Recorder) -> Callable[[], bool]:
    return lambda: recorder.count(("done", SVC, "")) == 1 and recorder.count(("done", EPS, "")) == 1


# ---- the whole path: API server -> source -> agent -> maps ---------------------------------


def test_create_update_delete_flow_into_the_maps(
    api: FakeApiServer, start_source: SourceFactory, agent: Agent
) -> None:
    api.create(service("web"))
    api.create(endpoint_slice("web-1"))
    recorder = Recorder()
    start_source(Tee(recorder, agent))
    wait_until(both_listed(recorder), "both initial lists")
    sync(agent)
    maps = agent_maps(agent)
    assert frontends(maps) == {
        "10.96.0.10:80/TCP": ["10.244.1.11:8080", "10.244.1.12:8080", "10.244.1.13:8080"]
    }

    api.update(
        endpoint_slice(
            "web-1", endpoints=[endpoint("10.244.1.11"), endpoint("10.244.1.13", ready=False)]
        )
    )
    wait_until(in_step(api, recorder), "the slice update")
    sync(agent)
    assert frontends(maps) == {"10.96.0.10:80/TCP": ["10.244.1.11:8080"]}

    api.create(
        service(
            "dns", cluster_ip="10.96.0.53", ports=[{"name": "dns", "protocol": "UDP", "port": 53}]
        )
    )
    api.create(
        endpoint_slice(
            "dns-1", service_name="dns", ports=[{"name": "dns", "protocol": "UDP", "port": 5353}]
        )
    )
    wait_until(in_step(api, recorder), "the new service")
    sync(agent)
    assert set(frontends(maps)) == {"10.96.0.10:80/TCP", "10.96.0.53:53/UDP"}

    api.delete("Service", "default", "web")
    wait_until(in_step(api, recorder), "the deletion")
    sync(agent)
    assert set(frontends(maps)) == {"10.96.0.53:53/UDP"}
    # Every change arrived exactly once: no relist, one list per kind.
    assert len(api.requests_for("services", watch=False)) == 1
    assert len(api.requests_for("endpointslices", watch=False)) == 1


def test_skipped_services_and_dual_stack_are_handled_as_from_manifests(
    api: FakeApiServer, start_source: SourceFactory, agent: Agent
) -> None:
    other = service("other", cluster_ip="10.96.0.20")
    other["metadata"]["labels"] = {"service.kubernetes.io/service-proxy-name": "someone-else"}
    api.create(other)
    api.create(endpoint_slice("other-1", service_name="other"))
    api.create(service("dual", cluster_ip="10.96.0.30", clusterIPs=["10.96.0.30", "fd00::30"]))
    api.create(endpoint_slice("dual-1", service_name="dual"))
    api.create(
        endpoint_slice(
            "dual-v6", service_name="dual", address_type="IPv6", endpoints=[endpoint("fd00::1")]
        )
    )
    recorder = Recorder()
    start_source(Tee(recorder, agent))
    wait_until(both_listed(recorder), "both initial lists")
    sync(agent)
    # Dual-stack: each family's cluster IP.
    assert sorted(frontends(agent_maps(agent))) == ["10.96.0.30:80/TCP", "[fd00::30]:80/TCP"]


# ---- initial list -------------------------------------------------------------------------


def test_initial_list_done_only_after_the_complete_paged_list(
    api: FakeApiServer, start_source: SourceFactory, clock: RecordingClock
) -> None:
    for i in range(7):
        api.create(service(f"s{i}", cluster_ip=f"10.96.0.{i + 1}"))
    # The third page fails once: the list starts over, and only then is it complete.
    api.fail_next(1, 500, when=lambda r: is_list("services")(r) and "continue" in r.params)
    api.delay_next(0.05, count=None, when=is_list("services"))
    recorder = Recorder()
    start_source(recorder)
    wait_until(both_listed(recorder), "both initial lists")
    service_calls = [c for c in recorder.calls if c[1] is SVC]
    assert service_calls[-1] == ("done", SVC, "")
    assert {ref for _, _, ref in service_calls[:-1]} == {f"default/s{i}" for i in range(7)}
    starts = [r for r in api.requests_for("services", watch=False) if "continue" not in r.params]
    assert len(starts) == 2 and all(r.params["limit"] == "2" for r in starts)
    assert len(clock.waits_of(SVC)) == 1
    # The restarted list handed on nothing twice: unchanged objects are skipped.
    assert len(service_calls) == 8


def test_expired_continue_token_restarts_the_list_in_one_request(
    api: FakeApiServer, start_source: SourceFactory
) -> None:
    for i in range(5):
        api.create(service(f"s{i}", cluster_ip=f"10.96.0.{i + 1}"))
    api.pause(when=lambda r: "continue" in r.params)
    recorder = Recorder()
    start_source(recorder)
    wait_until(lambda: any("continue" in r.params for r in api.requests), "a continued page")
    api.create(service("late", cluster_ip="10.96.0.9"))
    api.compact()  # the paged snapshot is gone: its continue token answers 410
    api.resume()
    wait_until(both_listed(recorder), "both initial lists")
    pages = api.requests_for("services", watch=False)
    assert [("continue" in r.params, r.params.get("limit")) for r in pages] == [
        (False, "2"),
        (True, "2"),
        (False, None),
    ]
    assert in_step(api, recorder)()
    assert recorder.count(("done", SVC, "")) == 1


def test_requests_carry_the_list_and_watch_parameters(
    api: FakeApiServer, start_source: SourceFactory
) -> None:
    """The source calls the API through the client's ApiClient, not its generated classes:
    the same paths and query parameters as list_*_for_all_namespaces."""
    for i in range(3):
        api.create(service(f"s{i}", cluster_ip=f"10.96.0.{i + 1}"))
    recorder = Recorder()
    source = start_source(recorder)
    wait_until(both_listed(recorder), "both initial lists")
    api.wait_for_watches(2)
    lists = api.requests_for("services", watch=False)
    assert [r.path for r in lists] == ["/api/v1/services"] * 2
    assert lists[0].params == {"limit": "2"}
    assert set(lists[1].params) == {"limit", "continue"}
    (watch,) = api.requests_for("endpointslices", watch=True)
    assert watch.path == "/apis/discovery.k8s.io/v1/endpointslices"
    assert watch.params["resourceVersion"] == source.resource_version(EPS)
    assert watch.params["allowWatchBookmarks"] == "true"
    assert 30 <= int(watch.params["timeoutSeconds"]) < 60


# ---- watch: renewal, drops, 410, bookmarks --------------------------------------------------


def test_watch_ended_by_the_server_is_renewed_from_the_last_version(
    api: FakeApiServer, start_source: SourceFactory
) -> None:
    api.create(service("web"))
    recorder = Recorder()
    source = start_source(recorder, WatchOptions(watch_timeout=1))
    wait_until(both_listed(recorder), "both initial lists")
    api.update(service("web", cluster_ip="10.96.0.11"))
    wait_until(in_step(api, recorder), "the update")
    version = source.resource_version(SVC)
    wait_until(lambda: len(api.requests_for("services", watch=True)) >= 2, "a renewed watch")
    renewed = api.requests_for("services", watch=True)[1]
    assert renewed.params["resourceVersion"] == version
    assert renewed.params["timeoutSeconds"] == "1"
    assert renewed.params["allowWatchBookmarks"] == "true"
    api.delete("Service", "default", "web")
    wait_until(in_step(api, recorder), "the deletion on the renewed watch")
    assert len(api.requests_for("services", watch=False)) == 1  # no relist


def test_dropped_watch_reconnects_and_misses_nothing(
    api: FakeApiServer, start_source: SourceFactory, agent: Agent
) -> None:
    api.create(service("web"))
    api.create(endpoint_slice("web-1"))
    recorder = Recorder()
    source = start_source(Tee(recorder, agent))
    wait_until(both_listed(recorder), "both initial lists")
    api.wait_for_watches(2)
    before = source.resource_version(SVC)
    watches = len(api.requests)
    # Cut both streams and hold the reconnections while the cluster changes.
    api.pause(when=lambda r: r.watch)
    assert api.drop_watches() == 2
    wait_until(lambda: sum(r.watch for r in api.requests[watches:]) >= 2, "reconnections")
    mark = len(recorder.calls)
    api.update(service("web", cluster_ip="10.96.0.12"))
    api.create(service("api", cluster_ip="10.96.0.13"))
    api.update(endpoint_slice("web-1", endpoints=[endpoint("10.244.1.12")]))
    api.resume()
    wait_until(in_step(api, recorder), "the changes made while disconnected")
    assert sorted(recorder.since(mark), key=str) == sorted(
        [
            ("updated", SVC, "default/web"),
            ("updated", SVC, "default/api"),
            ("updated", EPS, "default/web-1"),
        ],
        key=str,
    )
    reconnect = api.requests_for("services", watch=True)[1]
    assert reconnect.params["resourceVersion"] == before
    assert len(api.requests_for("services", watch=False)) == 1  # resumed, not relisted
    assert source.stats(SVC).failures >= 1
    sync(agent)
    assert frontends(agent_maps(agent)) == {
        "10.96.0.12:80/TCP": ["10.244.1.12:8080"],
        "10.96.0.13:80/TCP": [],
    }


def test_an_api_server_restart_is_ridden_out(
    api: FakeApiServer, start_source: SourceFactory, agent: Agent
) -> None:
    """The server goes away (connections refused for a while) and comes back on its
    address with its objects: the source reconnects and what changed is programmed."""
    api.create(service("web"))
    api.create(endpoint_slice("web-1"))
    recorder = Recorder()
    source = start_source(Tee(recorder, agent))
    wait_until(both_listed(recorder), "both initial lists")
    api.wait_for_watches(2)
    api.restart(down_for=0.3)
    api.create(service("api", cluster_ip="10.96.0.13"))
    wait_until(in_step(api, recorder), "the change made after the restart")
    assert source.stats(SVC).failures >= 1
    sync(agent)
    assert frontends(agent_maps(agent)) == {
        "10.96.0.10:80/TCP": ["10.244.1.11:8080", "10.244.1.12:8080", "10.244.1.13:8080"],
        "10.96.0.13:80/TCP": [],
    }


@pytest.mark.parametrize("api", ["status", "event"], indirect=True)
def test_410_relist_catches_up_with_the_gap(
    api: FakeApiServer, start_source: SourceFactory, agent: Agent
) -> None:
    for name, ip in (("a", "10.96.0.1"), ("b", "10.96.0.2"), ("c", "10.96.0.3")):
        api.create(service(name, cluster_ip=ip))
        api.create(endpoint_slice(f"{name}-1", service_name=name))
    recorder = Recorder()
    source = start_source(Tee(recorder, agent))
    wait_until(both_listed(recorder), "both initial lists")
    sync(agent)
    assert len(frontends(agent_maps(agent))) == 3
    watches = len(api.requests)
    api.pause(when=lambda r: r.watch)
    api.drop_watches()
    wait_until(lambda: sum(r.watch for r in api.requests[watches:]) >= 2, "reconnections")
    mark = len(recorder.calls)
    # The gap: a change, a deletion, a creation; then the history is compacted, so the
    # held watches (from the old version) get 410 Gone and the source must list again.
    api.update(endpoint_slice("a-1", service_name="a", endpoints=[endpoint("10.244.1.11")]))
    api.delete("Service", "default", "b")
    api.delete("EndpointSlice", "default", "b-1")
    api.create(service("d", cluster_ip="10.96.0.4"))
    api.compact()
    api.resume()
    wait_until(in_step(api, recorder), "the relist")
    # Only the difference was handed on: nothing about the unchanged c.
    assert sorted(recorder.since(mark), key=str) == sorted(
        [
            ("updated", EPS, "default/a-1"),
            ("deleted", SVC, "default/b"),
            ("deleted", EPS, "default/b-1"),
            ("updated", SVC, "default/d"),
        ],
        key=str,
    )
    assert source.stats(SVC).relists == 1 and source.stats(EPS).relists == 1
    assert recorder.count(("done", SVC, "")) == 1  # the initial list is done once only
    sync(agent)
    assert frontends(agent_maps(agent)) == {
        "10.96.0.1:80/TCP": ["10.244.1.11:8080"],
        "10.96.0.3:80/TCP": ["10.244.1.11:8080", "10.244.1.12:8080", "10.244.1.13:8080"],
        "10.96.0.4:80/TCP": [],
    }


def test_410_error_event_in_an_open_stream_relists(
    api: FakeApiServer, start_source: SourceFactory
) -> None:
    api.create(service("a", cluster_ip="10.96.0.1"))
    recorder = Recorder()
    source = start_source(recorder)
    wait_until(both_listed(recorder), "both initial lists")
    api.wait_for_watches(2)
    api.create(service("b", cluster_ip="10.96.0.2"))
    wait_until(in_step(api, recorder), "b")
    api.compact(expire_watches=True)
    api.update(service("a", cluster_ip="10.96.0.9"))
    # The update may reach the source through the old stream just before its 410: wait for
    # the relist itself too, not only for the update.
    wait_until(lambda: len(api.requests_for("services", watch=False)) == 2, "the relist")
    wait_until(in_step(api, recorder), "the update after the expiry")
    assert source.stats(SVC).relists == 1
    assert len(api.requests_for("services", watch=False)) == 2


def test_bookmarks_advance_the_version_and_spare_a_relist(
    api: FakeApiServer, start_source: SourceFactory
) -> None:
    api.create(service("web"))
    recorder = Recorder()
    source = start_source(recorder)
    wait_until(both_listed(recorder), "both initial lists")
    api.wait_for_watches(2)
    # Slices change, Services do not: the Service watch's version falls behind...
    for i in range(5):
        api.apply(endpoint_slice("web-1", endpoints=[endpoint(f"10.244.1.{20 + i}")]))
    listed = source.resource_version(SVC)
    # ...until a bookmark carries the current version to it.
    current = api.bookmark()
    wait_until(lambda: source.resource_version(SVC) == str(current), "the bookmark")
    assert int(listed or 0) < current
    assert ("updated", SVC, "default/web") not in recorder.since(2)  # a bookmark is no change
    # History up to now is forgotten and the stream cut: resuming from the bookmark's
    # version still works, so no relist is needed.
    api.compact()
    api.drop_watches()
    api.create(service("api", cluster_ip="10.96.0.13"))
    wait_until(in_step(api, recorder), "the service created after the bookmark")
    assert source.stats(SVC).relists == 0
    assert len(api.requests_for("services", watch=False)) == 1
    assert api.requests_for("services", watch=True)[-1].params["resourceVersion"] == str(current)


# ---- failures and backoff -------------------------------------------------------------------


def test_5xx_is_retried_with_capped_exponential_backoff(
    api: FakeApiServer, start_source: SourceFactory, clock: RecordingClock
) -> None:
    api.create(service("web"))
    api.fail_next(5, 503, when=is_list("services"))
    recorder = Recorder()
    source = start_source(recorder)
    wait_until(both_listed(recorder), "both initial lists after the failures")
    waits = clock.waits_of(SVC)
    assert len(waits) == 5
    for wait, base in zip(waits, [1.0, 2.0, 4.0, 4.0, 4.0], strict=True):
        assert base * 0.8 <= wait <= base  # jitter of 20% below, never above the cap
    assert clock.waits_of(EPS) == []  # the other kind was not held up
    assert source.stats(SVC).failures == 5
    # Progress resets the backoff: a later failure waits the initial delay again.
    api.fail_next(1, 500, when=lambda r: r.resource == "services" and r.watch)
    api.drop_watches()
    api.create(service("api", cluster_ip="10.96.0.13"))
    wait_until(in_step(api, recorder), "the change after the later failure")
    later = clock.waits_of(SVC)[5:]
    assert later and all(0.8 <= w <= 1.0 for w in later[:1])


def test_a_hung_list_times_out_and_is_retried(
    api: FakeApiServer, start_source: SourceFactory, clock: RecordingClock
) -> None:
    api.create(service("web"))
    api.delay_next(3.0, when=is_list("services"))
    recorder = Recorder()
    start_source(recorder, WatchOptions(list_timeout=0.3, backoff=Backoff(initial=0.01)))
    wait_until(both_listed(recorder), "the list after the timeout")
    assert len(api.requests_for("services", watch=False)) == 2
    assert len(clock.waits_of(SVC)) == 1


def test_backoff_is_exponential_capped_and_jittered() -> None:
    backoff = Backoff(initial=0.8, cap=30.0, factor=2.0, jitter=0.2)
    assert [backoff.delay(n, 0.0) for n in range(7)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0]
    assert backoff.delay(3, 0.5) == pytest.approx(6.4 * 0.9)
    assert backoff.delay(1000, 0.999) <= 30.0


# ---- configuration ---------------------------------------------------------------------------


def test_kubeconfig_file_is_used(api: FakeApiServer, tmp_path: Path, clock: RecordingClock) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{api.url}'}}}}]\n"
        "users: [{name: fake, user: {token: secret}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
    )
    api.create(service("web"))
    config = api_config(kubeconfig=kubeconfig)
    assert config.host == api.url
    recorder = Recorder()
    source = KubernetesSource(recorder, config, clock=clock)
    source.start()
    try:
        wait_until(both_listed(recorder), "both initial lists")
    finally:
        source.stop()
    assert ("updated", SVC, "default/web") in recorder.calls


def test_configuration_errors_are_source_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SourceError, match="no such file"):
        api_config(kubeconfig=tmp_path / "missing")
    (tmp_path / "bad").write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(SourceError, match=r"kubeconfig .*bad"):
        api_config(kubeconfig=tmp_path / "bad")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SourceError, match="--kubeconfig"):
        api_config()


def test_run_without_manifests_or_cluster_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert cli.main(["run", "--metrics-bind-address="]) == 1
    assert capsys.readouterr().err.startswith("ebpflb: no in-cluster configuration")
    assert cli.main(["run", "--kubeconfig", str(tmp_path / "nope")]) == 1
    missing = tmp_path / "nope"
    assert capsys.readouterr().err.strip() == f"ebpflb: kubeconfig {missing}: no such file"


def test_node_name_defaults_to_env_then_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-7")
    assert cli.node_name(None) == "node-7"
    assert cli.node_name("given") == "given"
    monkeypatch.delenv("NODE_NAME")
    monkeypatch.setattr(socket, "gethostname", lambda: "Host-A")
    assert cli.node_name(None) == "host-a"


# ---- boundaries and deployment ---------------------------------------------------------------


def test_deploy_manifests_grant_what_the_source_uses() -> None:
    rbac = list(yaml.safe_load_all((REPO / "deploy/base/rbac.yaml").read_text()))
    (role,) = [d for d in rbac if d["kind"] == "ClusterRole"]
    grants = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert grants == {
        ("", "services"): {"list", "watch"},
        ("discovery.k8s.io", "endpointslices"): {"list", "watch"},
    }
    (daemonset,) = yaml.safe_load_all((REPO / "deploy/base/daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["serviceAccountName"] == "ebpflb"
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/sys/fs/bpf" in mounts
    # No host kernel headers: the image carries a tree (deploy/Containerfile).
    assert not mounts & {"/lib/modules", "/usr/src"}
    assert "privileged" not in container["securityContext"]  # capabilities instead
