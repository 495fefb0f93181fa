"""A list+watch cache of one Kubernetes resource collection, as client-go's reflector keeps.

The algorithm, in one background thread per collection:

1. **List** the collection: as a *streaming list* where the API server offers one (a watch
   with ``sendInitialEvents=true``, Kubernetes' WatchList, on by default since 1.32 and
   what client-go's reflector uses): the current objects arrive as ADDED events, a
   BOOKMARK annotated ``k8s.io/initial-events-end`` ends them, and the same stream goes on
   as the watch of step 2. The server writes objects while the connector parses them,
   instead of the two taking turns page by page, and no page is held whole in memory.
   A server that refuses it (400/422, the feature off) or ignores it (a plain watch's
   events before that bookmark) is listed in pages (``limit``/``continue``, a consistent
   read) from then on; a stream that merely ends early is followed by pages this time.
   Either way the cache becomes exactly that list, and its ``resourceVersion`` is where
   the watch starts. The informer is *synced* from here on.
2. **Watch** from that resource version with ``allowWatchBookmarks=true`` and a server-side
   timeout of 4–5 minutes (jittered, so many connectors do not reconnect in step). Each
   ADDED/MODIFIED/DELETED event is applied to the cache, moves the resource version, and
   calls ``on_change`` (unless ``relevant`` says the change does not matter); a BOOKMARK
   only moves the resource version. When the server ends
   the stream (its timeout) the watch resumes from the last resource version: nothing is
   lost and nothing is listed again.
3. **410 Gone** — the resource version was compacted away, answered either as the HTTP
   status or, more often, as an ERROR event inside the stream (the watch cache's "too old
   resource version") — means events were lost: list again (step 1), at once.
4. **Connection lost / other errors** (the API server restarts, a network blip, 5xx): the
   informer is not synced (``error`` says why), backs off exponentially with jitter
   (0.2 s … 10 s) and resumes the watch from the last resource version; if that has gone
   meanwhile, step 3 follows.

Objects are kept as the API serves them (parsed JSON, camelCase), less
``metadata.managedFields``, which is often most of an object and which nothing here reads:
client model classes would cost several times the memory and time for 10,000 pods. The
cache replaces objects whole and never mutates them, so ``items()`` and ``get()`` hand out
shared references — callers must not mutate them either.

**Changes for an incremental reader.** Besides the cache, the informer keeps the keys that
changed since the last :meth:`Informer.drain` — every ADDED/MODIFIED/DELETED, relevant or
not — and whether a list replaced the cache whole meanwhile. ``drain`` hands out, under
the cache's lock, either those keys with their objects now (None: deleted) or, after a
list, the whole cache; the reader that applied every drain in turn holds what ``items()``
holds (connectors.kubernetes.incremental relies on this).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from pydantic_core import from_json

from connectors.base import ConnectorError

logger = logging.getLogger(__name__)

Key = tuple[str | None, str]
Object = dict[str, Any]

# Server-side watch timeout range; the client's read timeout is longer, so a healthy but
# quiet stream is always ended by the server (bookmarks also arrive about once a minute).
WATCH_TIMEOUT_S = (240, 300)
READ_TIMEOUT_MARGIN_S = 60
CONNECT_TIMEOUT_S = 10.0
LIST_TIMEOUT_S = 60.0
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0
# The bookmark that ends a streaming list's initial events (k8s.io/apimachinery's
# metav1.InitialEventsAnnotationKey).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class _Gone(Exception):
    """The watch's resource version is too old (410): the cache must be listed again."""


def _key(obj: Object) -> Key:
    metadata = obj.get("metadata") or {}
    return metadata.get("namespace"), metadata["name"]


def _slim(obj: Object) -> Object:
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj["metadata"] = {k: v for k, v in metadata.items() if k != "managedFields"}
    return obj


class Informer:
    """A thread-safe cache of one collection (``path``, e.g. ``/api/v1/pods``), kept
    current by list+watch; see the module docstring for the algorithm."""

    def __init__(
        self,
        *,
        api: ApiClient,
        path: str,
        name: str | None = None,
        page_size: int = 500,
        stream_list: bool = True,
        on_change: Callable[[], None] | None = None,
        relevant: Callable[[Object | None, Object | None], bool] | None = None,
    ) -> None:
        self.api = api
        self.path = path
        self.name = name or path.rstrip("/").rsplit("/", 1)[-1]
        self.page_size = page_size
        # Whether to list by a streaming list (step 1); turned off for good when the
        # server does not offer one.
        self.stream_list = stream_list
        self.on_change = on_change
        # Whether a change (old, new; None for absent) is worth on_change: a node's
        # heartbeat every few seconds is not. Every change is applied to the cache anyway.
        self.relevant = relevant
        # Why the informer is not synced now; None while it is.
        self.error: ConnectorError | None = ConnectorError(
            f"{self.name}: not listed yet", retryable=True
        )
        # Counters, for logs, tests and the benchmark.
        self.lists = 0
        self.gone = 0
        self.watch_failures = 0
        self.events = 0
        self._objects: dict[Key, Object] = {}
        # Keys changed since the last drain(), and whether a list replaced the cache.
        self._dirty: set[Key] = set()
        self._replaced = False
        self._resource_version: str | None = None
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._response: urllib3.BaseHTTPResponse | None = None
        self._thread: threading.Thread | None = None
        self._rng = random.Random()

    # --- control ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._close_response()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=CONNECT_TIMEOUT_S)

    def wait_synced(self, timeout_s: float) -> bool:
        return self._synced.wait(timeout_s)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    @property
    def resource_version(self) -> str | None:
        return self._resource_version

    # --- reads -----------------------------------------------------------------------------

    def items(self) -> list[Object]:
        with self._lock:
            return list(self._objects.values())

    def get(self, namespace: str | None, name: str) -> Object | None:
        with self._lock:
            return self._objects.get((namespace, name))

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def drain(self, *, whole: bool = False) -> tuple[bool, dict[Key, Object | None]]:
        """What changed since the previous drain: ``(False, {key: object now, or None when
        deleted})``, or ``(True, the whole cache)`` after a list replaced it (or when
        ``whole`` is asked for) — then keys absent from it are gone. Consumes the changes."""
        with self._lock:
            replaced = whole or self._replaced
            changed: dict[Key, Object | None]
            if replaced:
                changed = dict(self._objects)
            else:
                changed = {key: self._objects.get(key) for key in self._dirty}
            self._dirty = set()
            self._replaced = False
        return replaced, changed

    # --- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        attempt = 0
        # A restarted informer (start after stop) resumes its watch where it stopped.
        must_list = self._resource_version is None
        while not self._stop.is_set():
            try:
                if must_list and self.stream_list:
                    # Lists, then goes on watching on the same stream until it ends.
                    listed = self._stream_list()
                    must_list = not listed
                    if listed:
                        attempt = 0
                        continue
                if must_list:
                    self._list()
                    must_list = False
                self._watch()
                attempt = 0
            except _Gone as gone:
                self.gone += 1
                self._unsynced(f"{self.name}: {gone}; listing again")
                logger.info("%s: resource version gone (%s); listing again", self.name, gone)
                must_list = True
                attempt = 0
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as error:
                if self._stop.is_set():
                    break
                self.watch_failures += 1
                delay = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2**attempt)
                delay *= 0.5 + 0.5 * self._rng.random()
                self._unsynced(f"{self.name}: {_describe(error)}")
                logger.warning(
                    "%s: %s; watching again in %.1f s", self.name, _describe(error), delay
                )
                attempt += 1
                self._stop.wait(delay)
            finally:
                self._close_response()

    def _unsynced(self, reason: str) -> None:
        self._synced.clear()
        self.error = ConnectorError(reason, retryable=True)

    def _request(self, query: list[tuple[str, str]], *, timeout: tuple[float, float]) -> Any:
        return self.api.call_api(
            self.path,
            "GET",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=timeout,
        )

    def _list(self) -> None:
        started = time.monotonic()
        objects: dict[Key, Object] = {}
        continue_token: str | None = None
        while True:
            query = [("limit", str(self.page_size))]
            if continue_token:
                query.append(("continue", continue_token))
            try:
                response = self._request(query, timeout=(CONNECT_TIMEOUT_S, LIST_TIMEOUT_S))
            except ApiException as error:
                if error.status == 410:
                    # The continue token expired between pages: the pages do not make one
                    # consistent list; start over.
                    raise _Gone("the list's continue token expired") from error
                raise
            try:
                page = _parse(response.data)
            finally:
                response.release_conn()
            for obj in page.get("items") or []:
                obj = _slim(obj)
                objects[_key(obj)] = obj
            metadata = page.get("metadata") or {}
            continue_token = metadata.get("continue")
            if not continue_token:
                resource_version = metadata.get("resourceVersion")
                break
            if self._stop.is_set():
                return
        self._listed(objects, resource_version, started)

    def _stream_list(self) -> bool:
        """Step 1 as a streaming list, then step 2 on the same stream until it ends. False
        when the server offers no streaming list: then ``stream_list`` is off for good."""
        started = time.monotonic()
        timeout_s = self._rng.randint(*WATCH_TIMEOUT_S)
        query = [
            ("watch", "true"),
            ("sendInitialEvents", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        try:
            response = self._request(
                query, timeout=(CONNECT_TIMEOUT_S, timeout_s + READ_TIMEOUT_MARGIN_S)
            )
        except ApiException as error:
            if error.status in (400, 403, 422):
                return self._no_stream_list(f"the API server answered {error.status}")
            raise
        self._response = response
        objects: dict[Key, Object] = {}
        lines = _lines(response)
        for line in lines:
            if self._stop.is_set():
                return True
            event = _parse(line)
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ADDED":
                obj = _slim(obj)
                objects[_key(obj)] = obj
                continue
            if kind == "BOOKMARK":
                metadata = obj.get("metadata") or {}
                if (metadata.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                    self._listed(objects, metadata.get("resourceVersion"), started)
                    break
            if kind == "ERROR":
                self._apply(event)  # raises: 410 → list again, else back off
            # Nothing else comes before the initial events end: a server that ignores
            # sendInitialEvents (older than 1.27) sends a plain watch's events and
            # bookmarks without the annotation.
            return self._no_stream_list(f"a {kind} event before the initial events ended")
        else:
            # The stream ended before the bookmark: a server shutting down, or a list
            # longer than the watch's timeout. This list goes by pages; the next one
            # streams again (a server that ignores sendInitialEvents sends bookmarks
            # without the annotation, or other events, and is caught above).
            logger.info("%s: the streaming list ended early; listing in pages", self.name)
            return False
        self.error = None
        for line in lines:
            if self._stop.is_set():
                break
            self._apply(_parse(line))
        return True

    def _no_stream_list(self, why: str) -> bool:
        logger.info("%s: no streaming list (%s); listing in pages", self.name, why)
        self.stream_list = False
        return False

    def _listed(
        self, objects: dict[Key, Object], resource_version: str | None, started: float
    ) -> None:
        """The cache becomes a whole list: synced from here on."""
        self._replace(objects, resource_version)
        self.lists += 1
        self.error = None
        self._synced.set()
        log = logger.info if self.lists > 1 else logger.debug
        log(
            "%s: listed %d objects at resource version %s in %.2f s",
            self.name,
            len(objects),
            resource_version,
            time.monotonic() - started,
        )
        self._changed()

    def _replace(self, objects: dict[Key, Object], resource_version: str | None) -> None:
        with self._lock:
            self._objects = objects
            self._resource_version = resource_version
            self._dirty = set()
            self._replaced = True

    def _watch(self) -> None:
        timeout_s = self._rng.randint(*WATCH_TIMEOUT_S)
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        if self._resource_version:
            query.append(("resourceVersion", self._resource_version))
        try:
            response = self._request(
                query, timeout=(CONNECT_TIMEOUT_S, timeout_s + READ_TIMEOUT_MARGIN_S)
            )
        except ApiException as error:
            if error.status == 410:
                raise _Gone(f"410 on watch from {self._resource_version}") from error
            raise
        self._response = response
        if self._stop.is_set():
            return
        # The stream is open from where the cache stands: nothing was missed.
        self.error = None
        self._synced.set()
        for line in _lines(response):
            if self._stop.is_set():
                return
            self._apply(_parse(line))

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            message = obj.get("message", "")
            if code == 410:
                raise _Gone(message or "410 Gone")
            raise ApiException(status=code or 0, reason=f"watch error: {message}")
        resource_version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self._resource_version = resource_version or self._resource_version
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            logger.warning("%s: unknown watch event %r ignored", self.name, kind)
            return
        obj = _slim(obj)
        key = _key(obj)
        with self._lock:
            if kind == "DELETED":
                old = self._objects.pop(key, None)
                new: Object | None = None
            else:
                old, new = self._objects.get(key), obj
                self._objects[key] = obj
            self._dirty.add(key)
            if resource_version:
                self._resource_version = resource_version
        self.events += 1
        if self.relevant is None or self.relevant(old, new):
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # a listener's bug must not stop the cache
                logger.exception("%s: on_change failed", self.name)

    def _close_response(self) -> None:
        response, self._response = self._response, None
        if response is None:
            return
        try:
            # shutdown() ends a read blocked in another thread; close() alone would not.
            response.shutdown()
            response.release_conn()
        except Exception as error:  # closing is best effort
            logger.debug("%s: closing the watch stream: %r", self.name, error)


def _parse(document: str | bytes) -> Any:
    """A JSON document, its object keys shared with every other document parsed so
    (pydantic-core's string cache): 10,000 pods parsed event by event would otherwise
    each hold their own copies of "metadata", "name", "resources"… — 40 MiB more at
    10,000 pods than the same pods parsed in pages of 500 by ``json.loads``."""
    return from_json(document, cache_strings="keys")


def _lines(response: urllib3.BaseHTTPResponse) -> Iterator[str]:
    """The stream's newline-delimited JSON documents, as complete lines."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=True):
        pending += chunk
        if b"\n" not in pending:
            continue
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line.decode("utf-8")
    if pending.strip():
        yield pending.decode("utf-8")


def _describe(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"API server answered {error.status} {error.reason}".strip()
    return f"{type(error).__name__}: {error}"
