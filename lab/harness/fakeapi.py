"""A small Kubernetes API server for tests and benchmarks: list and watch of v1 Services and
discovery.k8s.io/v1 EndpointSlices across all namespaces, over real HTTP on 127.0.0.1.

It speaks the parts of the API server's protocol a list+watch client relies on:

- ``GET /api/v1/services`` and ``GET /apis/discovery.k8s.io/v1/endpointslices``: a JSON
  list whose ``metadata.resourceVersion`` is the snapshot's; ``limit``/``continue`` pages a
  consistent snapshot (a continue token older than the last compaction answers 410).
- ``?watch=true&resourceVersion=N``: a chunked stream of ADDED / MODIFIED / DELETED events
  after N, BOOKMARK events when asked for (``allowWatchBookmarks=true``) and triggered by
  ``bookmark()``, and the end of the stream (a final chunk) after ``timeoutSeconds``.
  A resourceVersion older than the last ``compact()`` is answered with 410 Gone, either as
  an HTTP status or as an ERROR event carrying code 410 (``gone_mode``), like the real
  server's watch cache does.

Resource versions are one counter shared by both kinds, as etcd's revision is. Tests steer
failures with ``fail_next`` (5xx answers), ``delay_next`` (slow answers), ``pause`` (hold
requests until ``resume``), ``drop_watches`` (cut open streams without a final chunk) and
``compact(expire_watches=True)`` (an ERROR 410 inside open streams). Everything it starts
stops in ``close()``.

Over 400 lines on purpose: lists, pages, watch streams, bookmarks and compaction all read
and write one event log; split, each part would reach into the others' state.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)

Obj = dict[str, Any]
GoneMode = Literal["status", "event"]


@dataclass(frozen=True, slots=True)
class Resource:
    name: str  # plural, as in the URL
    path: str
    kind: str
    api_version: str

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


SERVICES = Resource("services", "/api/v1/services", "Service", "v1")
ENDPOINT_SLICES = Resource(
    "endpointslices",
    "/apis/discovery.k8s.io/v1/endpointslices",
    "EndpointSlice",
    "discovery.k8s.io/v1",
)
RESOURCES = {r.path: r for r in (SERVICES, ENDPOINT_SLICES)}
_BY_KIND = {r.kind: r for r in (SERVICES, ENDPOINT_SLICES)}
DEFAULT_WATCH_TIMEOUT = 1800  # the real server's default upper bound is 30 min


@dataclass(frozen=True, slots=True)
class Request:
    """One request the server received (for assertions and for `when` predicates)."""

    method: str
    path: str
    resource: str | None  # "services", "endpointslices" or None (unknown path)
    watch: bool
    params: Mapping[str, str]


Predicate = Callable[[Request], bool]


@dataclass(slots=True)
class _Stored:
    obj: Obj  # with kind, apiVersion and metadata.resourceVersion
    rv: int
    event_json: bytes  # the object as watch events carry it
    item_json: bytes  # the object as list items carry it (no kind/apiVersion)


@dataclass(frozen=True, slots=True)
class _Event:
    rv: int
    resource: str
    type: str
    object_json: bytes


@dataclass(slots=True)
class _Rule:
    """A fault applied to the next `count` requests matching `when` (None: forever)."""

    when: Predicate | None
    count: int | None
    status: int = 500
    seconds: float = 0.0

    def take(self, request: Request) -> bool:
        if self.count is not None and self.count <= 0:
            return False
        if self.when is not None and not self.when(request):
            return False
        if self.count is not None:
            self.count -= 1
        return True


@dataclass(eq=False, slots=True)  # identity: watchers live in a set
class _Watcher:
    resource: str
    rv: int  # every event up to this one has been sent
    bookmarks: bool
    bookmark_generation: int
    dropped: bool = False
    expired: bool = False


@dataclass(slots=True)
class _Snapshot:
    """A consistent list being paged through with continue tokens."""

    rv: int
    items: list[bytes] = field(default_factory=list)


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class FakeApiServer:
    def __init__(self, *, gone_mode: GoneMode = "event", host: str = "127.0.0.1") -> None:
        self.gone_mode: GoneMode = gone_mode
        self._host = host
        self._lock = threading.Condition()
        self._rv = 1
        self._compacted = 0  # watches from an older resourceVersion get 410
        self._objects: dict[str, dict[tuple[str, str], _Stored]] = {
            r.name: {} for r in RESOURCES.values()
        }
        self._log: list[_Event] = []
        self._log_rvs: list[int] = []  # parallel to _log, for bisect
        self._watchers: set[_Watcher] = set()
        self._bookmark_generation = 0
        self._snapshots: dict[str, _Snapshot] = {}
        self._failures: list[_Rule] = []
        self._delays: list[_Rule] = []
        self._pause_when: Predicate | None = None
        self._resumed = threading.Event()
        self._resumed.set()
        self._closing = threading.Event()
        self.requests: list[Request] = []
        self._server: ThreadingHTTPServer | None = None
        self._port: int | None = None  # the port served, kept across a restart
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self, port: int = 0) -> FakeApiServer:
        server = _Server((self._host, port), _Handler)
        server.api = self
        self._server = server
        self._port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fakeapi"
        )
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig naming this server, for `ebpflb run --kubeconfig`."""
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: fake, user: {token: test}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
        )
        return path

    def close(self) -> None:
        """Stop serving, end every open stream and connection, join every thread."""
        self._closing.set()
        self._resumed.set()
        with self._lock:
            self._lock.notify_all()
        if self._server is None:
            return
        self._server.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()  # joins the handler threads (daemon_threads is off)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None

    def restart(self, down_for: float = 0.0) -> None:
        """Stop serving as close() does (every watch and connection cut), stay down for
        `down_for` seconds, then serve again on the same address: the objects and the
        resourceVersions continue, as an API server restarted over the same etcd. Call it
        in the network namespace start() ran in."""
        self.close()
        time.sleep(down_for)
        self.restart_stopped()

    def restart_stopped(self) -> None:
        """Serve again, after close(), on the address served before (restart's second
        half, for a caller doing something while the server is down)."""
        assert self._port is not None, "start() first"
        self._closing.clear()
        self.start(self._port)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- objects -------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def create(self, obj: Mapping[str, Any]) -> Obj:
        return self._write(obj, "ADDED")

    def update(self, obj: Mapping[str, Any]) -> Obj:
        return self._write(obj, "MODIFIED")

    def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Create or update, whichever applies."""
        return self._write(obj, None)

    def load(self, objects: Iterable[Mapping[str, Any]]) -> int:
        """Create many objects at once (one lock, one wake-up); the last resourceVersion."""
        with self._lock:
            for obj in objects:
                self._write_locked(obj, "ADDED")
            self._lock.notify_all()
            return self._rv

    def delete(self, kind: str, namespace: str, name: str) -> Obj:
        resource = _BY_KIND[kind]
        with self._lock:
            stored = self._objects[resource.name].pop((namespace, name), None)
            if stored is None:
                raise KeyError(f"{kind} {namespace}/{name} does not exist")
            self._rv += 1
            obj = copy.deepcopy(stored.obj)
            obj["metadata"]["resourceVersion"] = str(self._rv)  # the deletion's version
            self._append(resource.name, "DELETED", _dumps(obj))
            self._lock.notify_all()
            return obj

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        with self._lock:
            stored = self._objects[_BY_KIND[kind].name].get((namespace, name))
            return copy.deepcopy(stored.obj) if stored else None

    def objects(self, kind: str) -> list[Obj]:
        with self._lock:
            stored = self._objects[_BY_KIND[kind].name]
            return [copy.deepcopy(stored[key].obj) for key in sorted(stored)]

    def _write(self, obj: Mapping[str, Any], event: str | None) -> Obj:
        with self._lock:
            stored = self._write_locked(obj, event)
            self._lock.notify_all()
            return copy.deepcopy(stored)

    def _write_locked(self, obj: Mapping[str, Any], event: str | None) -> Obj:
        resource = _BY_KIND.get(str(obj.get("kind")))
        if resource is None:
            raise ValueError(f"fakeapi serves Services and EndpointSlices, not {obj.get('kind')}")
        new = copy.deepcopy(dict(obj))
        new["apiVersion"] = resource.api_version
        meta = new.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        key = (str(meta["namespace"]), str(meta["name"]))
        existing = self._objects[resource.name].get(key)
        if event == "ADDED" and existing is not None:
            raise KeyError(f"{resource.kind} {key[0]}/{key[1]} already exists")
        if event == "MODIFIED" and existing is None:
            raise KeyError(f"{resource.kind} {key[0]}/{key[1]} does not exist")
        self._rv += 1
        if existing is not None:
            meta["uid"] = existing.obj["metadata"]["uid"]
            meta["creationTimestamp"] = existing.obj["metadata"]["creationTimestamp"]
        else:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        meta["resourceVersion"] = str(self._rv)
        item = {k: v for k, v in new.items() if k not in ("kind", "apiVersion")}
        stored = _Stored(new, self._rv, _dumps(new), _dumps(item))
        self._objects[resource.name][key] = stored
        self._append(resource.name, "MODIFIED" if existing else "ADDED", stored.event_json)
        return new

    def _append(self, resource: str, type_: str, object_json: bytes) -> None:
        self._log.append(_Event(self._rv, resource, type_, object_json))
        self._log_rvs.append(self._rv)

    # ---- controls ------------------------------------------------------------------------

    def compact(self, *, expire_watches: bool = False) -> int:
        """Forget the history up to now: a watch from an older resourceVersion gets 410 Gone.
        With `expire_watches`, open watches also end with an ERROR event carrying 410."""
        with self._lock:
            self._compacted = self._rv
            if expire_watches:
                for watcher in self._watchers:
                    watcher.expired = True
            # Open streams still get what they have not read yet (as from the watch cache).
            needed = min((w.rv for w in self._watchers if not w.expired), default=self._rv)
            keep = bisect.bisect_right(self._log_rvs, needed)
            del self._log[:keep]
            del self._log_rvs[:keep]
            self._snapshots.clear()  # continue tokens expire too
            self._lock.notify_all()
            return self._rv

    def drop_watches(self) -> int:
        """Cut every open watch stream mid-stream (no final chunk); how many were cut."""
        with self._lock:
            for watcher in self._watchers:
                watcher.dropped = True
            self._lock.notify_all()
            return len(self._watchers)

    def bookmark(self) -> int:
        """Send a BOOKMARK with the current resourceVersion to watches that accept them."""
        with self._lock:
            self._bookmark_generation += 1
            self._lock.notify_all()
            return self._rv

    def fail_next(self, count: int = 1, status: int = 500, when: Predicate | None = None) -> None:
        """Answer the next `count` requests (matching `when`) with `status`."""
        with self._lock:
            self._failures.append(_Rule(when, count, status=status))

    def delay_next(
        self, seconds: float, count: int | None = 1, when: Predicate | None = None
    ) -> None:
        """Hold the next `count` requests (None: all) matching `when` for `seconds`."""
        with self._lock:
            self._delays.append(_Rule(when, count, seconds=seconds))

    def pause(self, when: Predicate | None = None) -> None:
        """Hold requests (matching `when`) until resume()."""
        with self._lock:
            self._pause_when = when or (lambda _request: True)
            self._resumed.clear()

    def resume(self) -> None:
        with self._lock:
            self._pause_when = None
            self._resumed.set()

    # ---- observations --------------------------------------------------------------------

    def open_watches(self, resource: str | None = None) -> int:
        with self._lock:
            return sum(1 for w in self._watchers if resource in (None, w.resource))

    def wait_for_watches(
        self, count: int, resource: str | None = None, timeout: float = 10.0
    ) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while sum(1 for w in self._watchers if resource in (None, w.resource)) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"fewer than {count} open {resource or ''} watches")
                self._lock.wait(remaining)

    def requests_for(self, resource: str, *, watch: bool | None = None) -> list[Request]:
        with self._lock:
            return [
                r
                for r in self.requests
                if r.resource == resource and (watch is None or r.watch == watch)
            ]

    # ---- request handling (handler threads) ----------------------------------------------

    def _admit(self, request: Request) -> int | None:
        """Apply pause, delay and failure rules; an HTTP status to fail with, or None."""
        with self._lock:
            self.requests.append(request)
            pause = self._pause_when is not None and self._pause_when(request)
            delay = next((r.seconds for r in self._delays if r.take(request)), 0.0)
            failure = next((r.status for r in self._failures if r.take(request)), None)
            self._lock.notify_all()
        if pause:
            while not self._resumed.wait(0.05) and not self._closing.is_set():
                pass
        if delay:
            self._closing.wait(delay)
        return failure

    def _list(self, resource: Resource, params: Mapping[str, str]) -> tuple[int, bytes]:
        limit = int(params.get("limit") or 0)
        token = params.get("continue")
        with self._lock:
            if token:
                snap_id, _, offset_text = token.partition(":")
                snapshot = self._snapshots.get(snap_id)
                if snapshot is None:
                    return 410, _dumps(
                        _status(410, "Expired", "The provided continue parameter is too old")
                    )
                offset = int(offset_text)
            else:
                stored = sorted(self._objects[resource.name].items())
                snapshot = _Snapshot(self._rv, [s.item_json for _, s in stored])
                snap_id, offset = uuid.uuid4().hex, 0
            end = len(snapshot.items) if limit <= 0 else min(offset + limit, len(snapshot.items))
            page = snapshot.items[offset:end]
            meta: Obj = {"resourceVersion": str(snapshot.rv)}
            if end < len(snapshot.items):
                self._snapshots[snap_id] = snapshot
                meta["continue"] = f"{snap_id}:{end}"
                meta["remainingItemCount"] = len(snapshot.items) - end
            else:
                self._snapshots.pop(snap_id, None)
        head = _dumps(
            {"kind": resource.list_kind, "apiVersion": resource.api_version, "metadata": meta}
        )
        body = head[:-1] + b',"items":[' + b",".join(page) + b"]}"
        return 200, body

    def _open_watch(
        self, resource: Resource, params: Mapping[str, str]
    ) -> tuple[_Watcher | None, list[bytes], int | None]:
        """Register a watch: (watcher, initial event lines, 410's too-old version or None)."""
        rv_text = params.get("resourceVersion") or ""
        bookmarks = params.get("allowWatchBookmarks", "").lower() == "true"
        with self._lock:
            initial: list[bytes] = []
            if rv_text in ("", "0"):
                # "Any" version: synthetic ADDED events for what exists, then changes.
                start = self._rv
                for stored in self._objects[resource.name].values():
                    initial.append(_event_line("ADDED", stored.event_json))
            else:
                start = int(rv_text)
                if start < self._compacted:
                    return None, [], start
            watcher = _Watcher(resource.name, start, bookmarks, self._bookmark_generation)
            self._watchers.add(watcher)
            self._lock.notify_all()
            return watcher, initial, None

    def _next_batch(self, watcher: _Watcher, deadline: float) -> tuple[list[bytes], str | None]:
        """Wait for events for `watcher`; (lines to send, why the stream ends or None)."""
        with self._lock:
            while True:
                if self._closing.is_set():
                    return [], "closing"
                if watcher.dropped:
                    return [], "dropped"
                lines = []
                index = bisect.bisect_right(self._log_rvs, watcher.rv)
                # A slice, not islice: islice walks the log from its start on every wake-up,
                # O(history) per event under sustained churn (the bench's 1,000/s).
                for event in self._log[index:]:
                    if event.resource == watcher.resource:
                        lines.append(_event_line(event.type, event.object_json))
                if self._log_rvs:
                    watcher.rv = max(watcher.rv, self._log_rvs[-1])
                if watcher.expired:
                    status = _status(410, "Expired", "too old resource version")
                    return [*lines, _event_line("ERROR", _dumps(status))], "expired"
                if watcher.bookmarks and watcher.bookmark_generation != self._bookmark_generation:
                    watcher.bookmark_generation = self._bookmark_generation
                    resource = next(r for r in RESOURCES.values() if r.name == watcher.resource)
                    mark = {
                        "kind": resource.kind,
                        "apiVersion": resource.api_version,
                        "metadata": {"resourceVersion": str(self._rv)},
                    }
                    watcher.rv = self._rv
                    lines.append(_event_line("BOOKMARK", _dumps(mark)))
                if lines:
                    return lines, None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return [], "timeout"
                self._lock.wait(min(remaining, 1.0))

    def _close_watch(self, watcher: _Watcher) -> None:
        with self._lock:
            self._watchers.discard(watcher)
            self._lock.notify_all()

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)


def _event_line(type_: str, object_json: bytes) -> bytes:
    return b'{"type":"' + type_.encode() + b'","object":' + object_json + b"}\n"


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins handler threads: nothing outlives close()
    api: FakeApiServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as the real server
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.api._track(self.connection, True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.api._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fakeapi: " + format, *args)

    def do_GET(self) -> None:
        api = self.server.api
        url = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        resource = RESOURCES.get(url.path)
        watch = params.get("watch", "").lower() in ("true", "1")
        request = Request("GET", url.path, resource.name if resource else None, watch, params)
        failure = api._admit(request)
        if api._closing.is_set():
            self.close_connection = True
            return
        if failure is not None:
            self._send_json(failure, _dumps(_status(failure, "InternalError", "injected")))
        elif resource is None:
            self._send_json(404, _dumps(_status(404, "NotFound", f"{url.path} not found")))
        elif watch:
            self._watch(resource, params)
        else:
            self._send_json(*api._list(resource, params))

    def _send_json(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _watch(self, resource: Resource, params: Mapping[str, str]) -> None:
        api = self.server.api
        watcher, initial, too_old = api._open_watch(resource, params)
        message = f"too old resource version: {too_old} ({api._compacted})"
        gone = _dumps(_status(410, "Expired", message))
        if watcher is None and api.gone_mode == "status":
            self._send_json(410, gone)
            return
        timeout = float(params.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
        deadline = time.monotonic() + timeout
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if watcher is None:
                self._chunk(_event_line("ERROR", gone))
                self._chunk(b"")
                return
            for line in _batched(initial):
                self._chunk(line)
            while True:
                lines, end = api._next_batch(watcher, deadline)
                for line in _batched(lines):
                    self._chunk(line)
                if end in ("dropped", "closing"):
                    # Cut without the final chunk: the client sees a broken stream.
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if end is not None:  # timeout or expired: a clean end of the stream
                    self._chunk(b"")
                    return
        except OSError:  # the client went away
            self.close_connection = True
        finally:
            if watcher is not None:
                api._close_watch(watcher)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))


def _batched(lines: list[bytes], size: int = 256) -> Iterator[bytes]:
    """Join event lines into chunks of up to `size` events (fewer writes for big bursts)."""
    for start in range(0, len(lines), size):
        yield b"".join(lines[start : start + size])
