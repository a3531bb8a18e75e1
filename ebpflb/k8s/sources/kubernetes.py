"""A source reading v1 Services and discovery.k8s.io/v1 EndpointSlices from the API server.

The only module importing `kubernetes`. Per kind, a thread behaves like client-go's
reflector:

- list every object (in pages: limit/continue) and hand each to the sink; after the first
  complete list, `initial_list_done(kind)`, once;
- watch from the list's resourceVersion, bookmarks allowed, handing on every event; when
  the server ends a watch (its timeoutSeconds), watch again from the last version seen;
- on 410 Gone (an HTTP status, or an ERROR event with code 410) list again and hand on
  only the difference with what was handed on before: objects whose resourceVersion
  changed, and a deletion for each object gone during the gap;
- on a dropped connection, a 5xx or any other failure, retry after a capped exponential
  backoff with jitter: a watch from the last version seen, a list from the start.

Objects reach the sink as the API's JSON dicts (json.loads of the raw body); the client's
model classes are never built: at 10,000 objects they cost seconds, and translate.py
reads the JSON shape anyway. For the same reason requests go through the client's
ApiClient (configuration, authentication, TLS, errors) but not its generated API classes,
whose import and argument validation alone take a third of a second at start. Time and
randomness are injected, so tests run the backoff without sleeping.

Over 400 lines on purpose: the reflector (list, watch, relist on 410, backoff) is one state
machine per kind, and this is the only module allowed to import `kubernetes`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import urllib3

from ebpflb.clock import Clock, RealClock
from ebpflb.errors import SourceError
from ebpflb.k8s.sources.base import Kind, ListFigures, ObjectSink, SourceProgress
from ebpflb.k8s.translate import object_ref
from ebpflb.model import NamespacedName

# `kubernetes` registered without running its __init__, which imports every sub-package
# (dynamic brings jsonschema, stream websocket, ...): 45 ms of each agent start for modules
# never used here. The sub-modules imported below load as usual.
if "kubernetes" not in sys.modules:
    _spec = importlib.util.find_spec("kubernetes")
    if _spec is not None and _spec.submodule_search_locations is not None:
        sys.modules["kubernetes"] = importlib.util.module_from_spec(_spec)

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)

HTTP_GONE = 410


@dataclass(frozen=True, slots=True)
class _Resource:
    api_version: str
    path: str  # list (and watch) across all namespaces
    plural: str  # for messages


_RESOURCES = {
    Kind.SERVICE: _Resource("v1", "/api/v1/services", "Services"),
    Kind.ENDPOINT_SLICE: _Resource(
        "discovery.k8s.io/v1", "/apis/discovery.k8s.io/v1/endpointslices", "EndpointSlices"
    ),
}

# Keyword arguments of a list/watch request (as the generated API methods name them) ->
# query parameters.
_QUERY = {
    "limit": "limit",
    "_continue": "continue",
    "watch": "watch",
    "resource_version": "resourceVersion",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
}


def _list_request(client: Any, path: str) -> Callable[..., Any]:
    """A list/watch of `path` taking the generated API methods' keyword arguments: the raw
    urllib3 response, ApiException on an HTTP error status (as with _preload_content=False)."""

    def request(_request_timeout: Any = None, _preload_content: bool = False, **params: Any) -> Any:
        query = [(_QUERY[name], value) for name, value in params.items() if value is not None]
        method, url, headers, body, post = client.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = client.call_api(
            method, url, headers, body, post, _request_timeout=_request_timeout
        )
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response

    return request


class ApiConfig:
    """Where the API server is and how to authenticate (a client Configuration, kept
    opaque so that no other module touches `kubernetes`)."""

    def __init__(self, configuration: Any, origin: str) -> None:
        self._configuration = configuration
        self.origin = origin
        if _is_loopback(urlsplit(self.host).hostname):
            # As Go's net/http (so kube-proxy) does: a local API server (tests, `kubectl
            # proxy`) is never reached through an HTTP(S)_PROXY from the environment.
            configuration.proxy = None

    @property
    def host(self) -> str:
        return str(self._configuration.host)

    @classmethod
    def in_cluster(cls) -> ApiConfig:
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except k8s_config.ConfigException as exc:
            raise SourceError(
                f"no in-cluster configuration ({exc}); outside a pod pass --kubeconfig FILE"
                " or --manifests PATH"
            ) from exc
        return cls(configuration, "in-cluster service account")

    @classmethod
    def from_kubeconfig(cls, path: Path, context: str | None = None) -> ApiConfig:
        if not path.is_file():
            raise SourceError(f"kubeconfig {path}: no such file")
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(path),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except Exception as exc:  # ConfigException, YAML and key errors alike: bad file
            raise SourceError(f"kubeconfig {path}: {exc}") from exc
        return cls(configuration, f"kubeconfig {path}")

    @classmethod
    def from_host(cls, host: str) -> ApiConfig:
        """A plain URL, no authentication (tests, `kubectl proxy`)."""
        return cls(k8s_client.Configuration(host=host.rstrip("/")), host)

    def _new_client(self) -> Any:
        # No silent retries inside urllib3: every failure goes through the reflector's
        # backoff, is logged and counted once.
        self._configuration.retries = False
        return k8s_client.ApiClient(self._configuration)


def _is_loopback(host: str | None) -> bool:
    if host is None or host == "localhost":
        return host is not None
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def api_config(kubeconfig: Path | None = None, host: str | None = None) -> ApiConfig:
    """`host` if given, else the kubeconfig file if given, else in-cluster."""
    if host:
        return ApiConfig.from_host(host)
    if kubeconfig is not None:
        return ApiConfig.from_kubeconfig(kubeconfig)
    return ApiConfig.in_cluster()


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with jitter; defaults are client-go's reflector's."""

    initial: float = 0.8
    cap: float = 30.0
    factor: float = 2.0
    # A delay is drawn from [d * (1 - jitter), d]: agents restarted together spread out
    # their retries, and the cap is never exceeded.
    jitter: float = 0.2

    def delay(self, attempt: int, rand: float) -> float:
        """The wait before retry number `attempt` (0-based); `rand` is uniform in [0, 1)."""
        base = min(self.cap, self.initial * self.factor ** min(attempt, 64))
        return base * (1.0 - self.jitter * rand)


@dataclass(frozen=True, slots=True)
class WatchOptions:
    page_size: int = 500  # objects per list request (limit/continue); 0 lists in one go
    # Each watch asks the server to end it after a time drawn from [t, 2t), as client-go
    # does, so that many agents do not reconnect in step.
    watch_timeout: float = 300.0
    list_timeout: float = 60.0  # read timeout of one list request
    connect_timeout: float = 10.0
    # A watch silent for its timeoutSeconds plus this long is dead (a half-open TCP
    # connection): reconnect.
    read_slack: float = 30.0
    # A watch ending sooner than this with no event counts as a failure, as in client-go,
    # so a server closing every watch at once is retried with backoff, not in a tight loop.
    min_watch: float = 1.0
    backoff: Backoff = field(default_factory=Backoff)


@dataclass(slots=True)
class ReflectorStats:
    lists: int = 0  # complete lists: the first one and every relist
    relists: int = 0  # of which after 410 Gone
    watches: int = 0  # watch requests answered with a stream
    events: int = 0  # watch events handled (bookmarks included)
    failures: int = 0  # requests or streams that failed and were retried after backoff


class _Expired(SourceError):
    """410 Gone: the resourceVersion or continue token is older than the server's history."""


class _Reflector:
    """List+watch of one kind, run by one thread."""

    def __init__(
        self,
        kind: Kind,
        api: ApiConfig,
        sink: ObjectSink,
        options: WatchOptions,
        clock: Clock,
        rng: random.Random,
        stop: threading.Event,
    ) -> None:
        self.kind = kind
        self.resource = _RESOURCES[kind]
        self.sink = sink
        self.options = options
        self._clock = clock
        self._rng = rng
        self._stop = stop
        self._client = api._new_client()
        self._list_fn = _list_request(self._client, self.resource.path)
        self.resource_version: str | None = None
        self.stats = ReflectorStats()
        self.first_list: ListFigures | None = None  # set once, before initial_list_done
        # What the sink was given, by name: its resourceVersion. A relist hands on only
        # what differs from this, and deletions for what is no longer there.
        self._known: dict[NamespacedName, str] = {}
        self._listed = False
        self._attempt = 0  # failures since the last progress, for the backoff
        self._watches_since_list = 0
        self._active: Any = None  # the response being read, so stop() can interrupt it
        self._active_lock = threading.Lock()

    @property
    def label(self) -> str:
        return self.resource.plural

    # ---- loop ----------------------------------------------------------------------------

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                self._watch()
                continue
            except _Expired as exc:
                if self._stop.is_set():
                    break
                log.info("%s: %s; listing again", self.label, exc)
                self.resource_version = None
                self.stats.relists += 1
                if self._watches_since_list > 1:
                    continue  # relist at once: the history moved on while we were away
                # The first watch after a list already expired: the list was slow or the
                # server is in a loop; list again, but after a backoff.
                failure = f"{exc} on the first watch after a list"
            except SourceError as exc:
                if self._stop.is_set():
                    break
                failure = str(exc)
            except Exception as exc:  # a failing sink must not end the source: retry later
                if self._stop.is_set():
                    break
                log.exception("%s: unexpected error", self.label)
                failure = f"unexpected {type(exc).__name__}: {exc}"
            self.stats.failures += 1
            delay = self.options.backoff.delay(self._attempt, self._rng.random())
            self._attempt += 1
            log.warning("%s: %s; retrying in %.1fs", self.label, failure, delay)
            self._clock.wait(self._stop, delay)

    def _progress(self) -> None:
        self._attempt = 0

    # ---- list ----------------------------------------------------------------------------

    def _list(self) -> None:
        started = time.monotonic()
        relist = self._listed
        seen: dict[NamespacedName, str] = {}
        page_size = self.options.page_size
        token: str | None = None
        resource_version = ""
        pages = changed = 0
        while True:
            try:
                body = self._list_page(page_size, token)
            except _Expired as exc:
                if token is None:  # a list from scratch cannot be too old: a server fault
                    raise SourceError(f"list {exc}") from exc
                # The continue token outlived the server's history: list again in one
                # request, as client-go does.
                log.info("%s: list continue token expired; listing in one request", self.label)
                token, page_size, pages, changed = None, 0, 0, 0
                seen.clear()
                continue
            pages += 1
            meta = body.get("metadata") or {}
            if token is None:
                resource_version = str(meta.get("resourceVersion") or "")
                if not resource_version:
                    raise SourceError("list answer has no resourceVersion")
            for item in body.get("items") or []:
                if isinstance(item, dict):
                    changed += self._listed_object(item, seen)
            token = meta.get("continue") or None
            if not token:
                break
        gone = sorted(self._known.keys() - seen.keys())
        for ref in gone:
            del self._known[ref]
            self.sink.object_deleted(self.kind, ref)
        self.resource_version = resource_version
        self._watches_since_list = 0
        self.stats.lists += 1
        self._progress()
        elapsed = time.monotonic() - started
        if relist:
            log.info(
                "relisted %s at resourceVersion %s: %d changed, %d deleted since the last"
                " version seen (%.3fs)",
                self.label,
                resource_version,
                changed,
                len(gone),
                elapsed,
            )
        else:
            log.info(
                "listed %d %s at resourceVersion %s in %.3fs (%d requests)",
                len(seen),
                self.label,
                resource_version,
                elapsed,
                pages,
            )
            self._listed = True
            self.first_list = ListFigures(objects=len(seen), seconds=elapsed)
            self.sink.initial_list_done(self.kind)

    def _listed_object(self, item: dict[str, Any], seen: dict[NamespacedName, str]) -> int:
        # List items carry no kind/apiVersion; watch events do. Make them alike.
        item.setdefault("kind", self.kind.value)
        item.setdefault("apiVersion", self.resource.api_version)
        ref = object_ref(item)
        version = str((item.get("metadata") or {}).get("resourceVersion") or "")
        seen[ref] = version
        if version and self._known.get(ref) == version:
            return 0  # handed on before, unchanged since
        self.sink.object_updated(self.kind, item)
        self._known[ref] = version
        return 1

    def _list_page(self, limit: int, token: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "_preload_content": False,
            "_request_timeout": (self.options.connect_timeout, self.options.list_timeout),
        }
        if limit > 0:
            kwargs["limit"] = limit
        if token:
            kwargs["_continue"] = token
        resp = self._request(**kwargs)
        try:
            data = resp.data
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SourceError(f"list answer broken: {exc}") from exc
        finally:
            self._release(resp, reuse=True)
        try:
            body = json.loads(data)
        except ValueError as exc:
            raise SourceError(f"list answer is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise SourceError("list answer is not a JSON object")
        return body

    # ---- watch ---------------------------------------------------------------------------

    def _watch(self) -> None:
        timeout = max(1, int(self.options.watch_timeout * (1.0 + self._rng.random())))
        self._watches_since_list += 1
        resp = self._request(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _preload_content=False,
            _request_timeout=(self.options.connect_timeout, timeout + self.options.read_slack),
        )
        self.stats.watches += 1
        started = self._clock.now()
        events = 0
        clean = False
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    return
                if line.strip():
                    self._event(line)
                    events += 1
            clean = True
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if self._stop.is_set():
                return
            raise SourceError(
                f"watch from resourceVersion {self.resource_version} broke"
                f" after {events} events: {exc}"
            ) from exc
        finally:
            self._release(resp, reuse=clean)
        lasted = self._clock.now() - started
        if events == 0 and lasted < min(self.options.min_watch, timeout / 2):
            raise SourceError(f"watch ended after {lasted:.1f}s without an event")
        log.debug(
            "%s: watch ended after %.0fs, %d events; watching again", self.label, lasted, events
        )

    def _event(self, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise SourceError(f"undecodable watch event {line[:200]!r}") from exc
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            raise SourceError(f"watch event without an object: {line[:200]!r}")
        kind = event.get("type")
        if kind == "ERROR":
            code = obj.get("code")
            message = f"{obj.get('reason') or 'error'}: {obj.get('message') or ''}"
            if code == HTTP_GONE:
                raise _Expired(f"watch answered 410 Gone ({message})")
            raise SourceError(f"watch error event {code} ({message})")
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind in ("ADDED", "MODIFIED"):
            ref = object_ref(obj)
            self.sink.object_updated(self.kind, obj)
            self._known[ref] = version
        elif kind == "DELETED":
            ref = object_ref(obj)
            self.sink.object_deleted(self.kind, ref)
            self._known.pop(ref, None)
        elif kind != "BOOKMARK":
            log.warning("%s: ignoring watch event of type %r", self.label, kind)
            return
        # Advanced only once the sink has the event: a failure before this point re-watches
        # from the previous version and the event comes again.
        if version:
            self.resource_version = version
        self.stats.events += 1
        self._progress()

    # ---- requests ------------------------------------------------------------------------

    def _request(self, **kwargs: Any) -> Any:
        try:
            resp = self._list_fn(**kwargs)
        except ApiException as exc:
            detail = _status_message(exc)
            if exc.status == HTTP_GONE:
                raise _Expired(f"answered 410 Gone ({detail})") from exc
            hint = (
                " (does the ClusterRole allow list and watch on services and"
                " endpointslices.discovery.k8s.io?)"
                if exc.status in (401, 403)
                else ""
            )
            raise SourceError(f"API server answered {exc.status} ({detail}){hint}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SourceError(f"cannot reach the API server: {exc}") from exc
        with self._active_lock:
            self._active = resp
        if self._stop.is_set():
            self.interrupt()
        return resp

    def _release(self, resp: Any, *, reuse: bool) -> None:
        with self._active_lock:
            if self._active is resp:
                self._active = None
        with contextlib.suppress(Exception):
            if not reuse:
                resp.close()  # a broken stream's connection must not go back to the pool
            resp.release_conn()

    def interrupt(self) -> None:
        """Unblock a read in progress (from stop(), another thread)."""
        with self._active_lock:
            resp = self._active
        if resp is None:
            return
        try:
            resp.shutdown()
        except (ValueError, RuntimeError, OSError):
            with contextlib.suppress(Exception):
                resp.connection.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()


def _status_message(exc: ApiException) -> str:
    """The Status message the server sent, else the HTTP reason."""
    try:
        body = json.loads(exc.body or b"")
    except (ValueError, TypeError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return f"{body.get('reason') or exc.reason}: {body['message']}"
    return str(exc.reason)


class KubernetesSource:
    """Delivers every Service and EndpointSlice of the cluster to a sink, then every change."""

    def __init__(
        self,
        sink: ObjectSink,
        api: ApiConfig,
        *,
        options: WatchOptions | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.sink = sink
        self.api = api
        self.options = options or WatchOptions()
        self._clock = clock or RealClock()
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._reflectors: dict[Kind, _Reflector] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        log.info("watching Services and EndpointSlices at %s (%s)", self.api.host, self.api.origin)
        for kind in Kind:
            reflector = _Reflector(
                kind, self.api, self.sink, self.options, self._clock, self._rng, self._stop
            )
            self._reflectors[kind] = reflector
            thread = threading.Thread(target=reflector.run, name=f"kube-{kind.value}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for reflector in self._reflectors.values():
            reflector.interrupt()
        for thread in self._threads:
            thread.join(timeout=10)
        for reflector in self._reflectors.values():
            reflector.close()

    def resource_version(self, kind: Kind) -> str | None:
        reflector = self._reflectors.get(kind)
        return reflector.resource_version if reflector else None

    def stats(self, kind: Kind) -> ReflectorStats:
        reflector = self._reflectors.get(kind)
        return dataclasses.replace(reflector.stats) if reflector else ReflectorStats()

    def counters(self) -> dict[str, dict[str, int]]:
        """Per kind: lists, relists, watches, events, failures (for metrics)."""
        return {kind.value: dataclasses.asdict(self.stats(kind)) for kind in self._reflectors}

    def progress(self) -> SourceProgress:
        """The initial lists done so far: objects and seconds each."""
        lists = {
            kind: reflector.first_list
            for kind, reflector in self._reflectors.items()
            if reflector.first_list is not None
        }
        return SourceProgress(lists=lists)
