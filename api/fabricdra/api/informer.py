"""List-then-watch caches ("informers"): one LIST, then a WATCH from its resourceVersion,
re-listing when the server says the version is too old (410) and re-delivering every object
on a resync period, so a missed event is repaired without polling the API."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

import urllib3

from fabricdra.api.rest import ApiError, Kind, Rest

from .jsontypes import JSON

log = logging.getLogger("fabricdra.informer")
Handler = Callable[[str, JSON | None, JSON | None], None]  # (event, old, new)


def key_of(obj: JSON) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


class Informer:
    def __init__(
        self,
        rest: Rest,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resync: float = 300.0,
    ) -> None:
        self.rest, self.kind = rest, kind
        self.namespace, self.label_selector, self.resync = namespace, label_selector, resync
        self.field_selector = field_selector
        self._store: dict[str, JSON] = {}
        self._lock = threading.Lock()
        self._handlers: list[Handler] = []
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._response: urllib3.BaseHTTPResponse | None = None
        self._thread: threading.Thread | None = None

    def on_event(self, handler: Handler) -> None:
        self._handlers.append(handler)

    # -- reads ---------------------------------------------------------------------------
    def get(self, key: str) -> JSON | None:
        with self._lock:
            return self._store.get(key)

    def items(self) -> list[JSON]:
        with self._lock:
            return list(self._store.values())

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float = 30.0) -> bool:
        return self._synced.wait(timeout)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{self.kind.plural}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop, ending the open watch now: left open, it would hold a connection (and the
        server's watch) until its timeout, minutes later."""
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # already closed or never read
                response.shutdown()

    def _opened(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response
        if self._stop.is_set():  # stopped while the watch was being opened
            response.shutdown()

    def _emit(self, event: str, old: JSON | None, new: JSON | None) -> None:
        for handler in self._handlers:
            try:
                handler(event, old, new)
            except Exception:  # a handler bug must not kill the watch
                log.exception("informer handler failed")

    def _relist(self) -> str:
        listing = self.rest.list(
            self.kind,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
        )
        fresh = {key_of(o): o for o in listing.get("items", [])}
        with self._lock:
            old = self._store
            self._store = fresh
        for key, obj in fresh.items():
            self._emit("ADDED" if key not in old else "MODIFIED", old.get(key), obj)
        for key, obj in old.items():
            if key not in fresh:
                self._emit("DELETED", obj, None)
        self._synced.set()
        return str(listing.get("metadata", {}).get("resourceVersion", ""))

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._relist()
                version = self._watch(version)
            except ApiError as e:
                if self._stop.is_set():
                    return  # stopping: the server or our caller closed the stream
                if e.gone:
                    version = ""  # too old: list again
                    continue
                log.warning("watch %s failed: %s", self.kind.plural, e)
                self._stop.wait(1.0)
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("watch %s crashed", self.kind.plural)
                self._stop.wait(1.0)

    def _watch(self, version: str) -> str:
        """Watch until the resync period is over; then re-deliver everything (resync)."""
        stream = self.rest.watch(
            self.kind,
            version,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=max(1, int(self.resync)),
            opened=self._opened,
        )
        for event in stream:
            if self._stop.is_set():
                return version
            kind, obj = event.get("type"), event.get("object", {})
            if kind == "ERROR":
                code = int(obj.get("code", 0))
                raise ApiError(code, str(obj.get("message", "")))
            version = str(obj.get("metadata", {}).get("resourceVersion", version))
            if kind == "BOOKMARK":
                continue
            key = key_of(obj)
            with self._lock:
                old = self._store.get(key)
                if kind == "DELETED":
                    self._store.pop(key, None)
                else:
                    self._store[key] = obj
            self._emit(str(kind), old, None if kind == "DELETED" else obj)
        # Server closed the stream after timeout_seconds: resync from the cache.
        for obj in self.items():
            self._emit("SYNC", obj, obj)
        return version
