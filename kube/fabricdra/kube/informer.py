"""List-then-watch caches ("informers"): one LIST, then a WATCH from its resourceVersion,
re-listing when the server says the version is too old (410) and re-delivering every object
on a resync period, so a missed event is repaired without polling the API.

Indexes (`add_index`, as client-go's indexers): a named function maps an object to the values
it is filed under (a claim to the nodes it is allocated on, a Lease to its domain), and the
index is kept up to date on every add, update, delete and re-list, so a reader asks for the
objects under one value (`by_index`) instead of scanning the whole cache: at 5,000 nodes a
reconcile that scans every claim and Lease costs more than the resync period allows."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable

import urllib3

from fabricdra.api.jsontypes import JSON
from fabricdra.kube.rest import ApiError, Gone, Kind, Rest

log = logging.getLogger("fabricdra.informer")
Handler = Callable[[str, JSON | None, JSON | None], None]  # (event, old, new)
IndexFunc = Callable[[JSON], Iterable[str]]  # an object -> the values it is filed under
Transform = Callable[[JSON], JSON]  # applied to every object before it is stored


def without_managed_fields(obj: JSON) -> JSON:
    """Drop `metadata.managedFields` (server-side apply bookkeeping nobody here reads): it is
    often the larger part of a small object, and a cache of thousands of Nodes, slices and
    Leases holds it for nothing (client-go's informers strip it too)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


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
        transform: Transform | None = None,
        page_size: int = 500,
    ) -> None:
        self.rest, self.kind = rest, kind
        self.namespace, self.label_selector, self.resync = namespace, label_selector, resync
        self.field_selector = field_selector
        self.transform = transform
        # The first LIST in pages: the whole fleet's slices parsed at once, before the
        # transform trims them, was the controller's peak memory at 5,000 nodes.
        self.page_size = page_size
        self._store: dict[str, JSON] = {}
        self._index_funcs: dict[str, IndexFunc] = {}
        # index name -> value -> keys filed under it; and key -> its values (to unfile it)
        self._indices: dict[str, dict[str, set[str]]] = {}
        self._filed: dict[str, dict[str, frozenset[str]]] = {}
        # Objects handed to readers (items, by_index, get): what a reconcile visited.
        self.reads = 0
        self._lock = threading.Lock()
        self._handlers: list[Handler] = []
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._response: urllib3.BaseHTTPResponse | None = None
        self._thread: threading.Thread | None = None

    def on_event(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def add_index(self, name: str, func: IndexFunc) -> None:
        """File every object (those cached already too) under the values `func` gives it."""
        with self._lock:
            self._index_funcs[name] = func
            self._indices[name] = {}
            self._filed[name] = {}
            for key, obj in self._store.items():
                self._file(name, key, obj)

    # -- reads ---------------------------------------------------------------------------
    def get(self, key: str) -> JSON | None:
        with self._lock:
            obj = self._store.get(key)
            self.reads += obj is not None
            return obj

    def items(self) -> list[JSON]:
        with self._lock:
            self.reads += len(self._store)
            return list(self._store.values())

    def by_index(self, name: str, value: str) -> list[JSON]:
        """The cached objects filed under `value` in index `name` (KeyError: no such index)."""
        with self._lock:
            keys = self._indices[name].get(value, ())
            self.reads += len(keys)
            return [self._store[k] for k in sorted(keys)]

    def index_values(self, name: str) -> dict[str, int]:
        """Each value of index `name` with how many objects are filed under it."""
        with self._lock:
            return {value: len(keys) for value, keys in self._indices[name].items()}

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    # -- the store and its indexes (under the lock) ---------------------------------------
    def _file(self, name: str, key: str, obj: JSON | None) -> None:
        index, filed = self._indices[name], self._filed[name]
        for value in filed.pop(key, frozenset()):
            keys = index.get(value)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[value]
        if obj is None:
            return
        values = frozenset(v for v in self._index_funcs[name](obj) if v)
        if values:
            filed[key] = values
            for value in values:
                index.setdefault(value, set()).add(key)

    def _put(self, key: str, obj: JSON | None) -> JSON | None:
        """Store (None: remove) one object, refiling it in every index; returns the old one."""
        old = self._store.get(key)
        if obj is None:
            self._store.pop(key, None)
        else:
            self._store[key] = obj
        for name in self._index_funcs:
            self._file(name, key, obj)
        return old

    def _replace_all(self, objects: Iterable[JSON]) -> tuple[dict[str, JSON], dict[str, JSON]]:
        """A fresh listing (transformed already) replaces the store; returns (old, new)."""
        fresh = {key_of(o): o for o in objects}
        with self._lock:
            old = self._store
            self._store = fresh
            for name in self._index_funcs:
                self._indices[name], self._filed[name] = {}, {}
                for key, obj in fresh.items():
                    self._file(name, key, obj)
        return old, fresh

    def _apply(self, kind: str, obj: JSON) -> tuple[JSON | None, JSON | None]:
        """One watch event into the store; returns (old, new) for the handlers."""
        obj = self._transformed(obj)
        key = key_of(obj)
        with self._lock:
            if kind == "DELETED":
                return self._put(key, None), None
            return self._put(key, obj), obj

    def _transformed(self, obj: JSON) -> JSON:
        return self.transform(obj) if self.transform is not None else obj

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

    def _list(self) -> tuple[list[JSON], str]:
        """Every object (transformed page by page) and the list's resourceVersion."""
        objects: list[JSON] = []
        version = ""
        for page in self.rest.pages(
            self.kind,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            limit=self.page_size,
        ):
            objects.extend(map(self._transformed, page.get("items") or []))
            # the last page's (all pages are one snapshot, one version)
            version = str((page.get("metadata") or {}).get("resourceVersion", ""))
        return objects, version

    def _relist(self) -> str:
        objects, version = self._list()
        old, fresh = self._replace_all(objects)
        for key, obj in fresh.items():
            self._emit("ADDED" if key not in old else "MODIFIED", old.get(key), obj)
        for key, obj in old.items():
            if key not in fresh:
                self._emit("DELETED", obj, None)
        self._synced.set()
        return version

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._relist()
                version = self._watch(version)
            except Gone:
                if self._stop.is_set():
                    return
                version = ""  # too old: list again
            except ApiError as e:
                if self._stop.is_set():
                    return  # stopping: the server or our caller closed the stream
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
            old, new = self._apply(str(kind), obj)
            self._emit(str(kind), old, new)
        # Server closed the stream after timeout_seconds: resync from the cache.
        with self._lock:
            everything = list(self._store.values())
        for obj in everything:
            self._emit("SYNC", obj, obj)
        return version
