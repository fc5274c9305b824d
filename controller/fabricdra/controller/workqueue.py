"""A work queue keyed by object key, in the style of client-go's: a key waiting to be
processed is queued once however many events arrive for it, a key is processed by one worker
at a time, and a failed key comes back after an exponential backoff.

Two priorities: keys added on an event (`add`) are processed before keys added by a periodic
resync (`add(key, resync=True)`), so that a claim's admission does not wait behind a sweep
over every node (at 5,000 nodes, 5,000 keys). A resync key that an event adds again is
promoted. Resync keys are not starved: once the oldest has waited `resync_max_wait` seconds,
resync keys (oldest first) alternate with event keys until none is overdue."""

from __future__ import annotations

import heapq
import threading
import time
from collections import OrderedDict


class WorkQueue:
    def __init__(
        self, base_delay: float = 0.05, max_delay: float = 30.0, resync_max_wait: float = 60.0
    ) -> None:
        self._cond = threading.Condition()
        # Insertion-ordered sets: FIFO, with O(1) removal when a resync key is promoted.
        self._events: OrderedDict[str, None] = OrderedDict()
        self._resyncs: OrderedDict[str, float] = OrderedDict()  # key -> when queued
        self._active: set[str] = set()
        self._dirty: dict[str, bool] = {}  # added while active: requeue when done (resync?)
        self._delayed: list[tuple[float, str]] = []
        self._failures: dict[str, int] = {}
        self._base, self._max = base_delay, max_delay
        self._resync_max_wait = resync_max_wait
        self._took_overdue = False  # the last key taken was an overdue resync key
        self._closed = False

    def _enqueue(self, key: str, resync: bool, now: float) -> None:
        """Queue `key` (lock held). An event key promotes a queued resync key."""
        if key in self._active:
            # Requeued when done; an event's mark wins over a resync's.
            self._dirty[key] = self._dirty.get(key, True) and resync
        elif key in self._events:
            return
        elif resync:
            if key not in self._resyncs:
                self._resyncs[key] = now
                self._cond.notify()
        else:
            self._resyncs.pop(key, None)
            self._events[key] = None
            self._cond.notify()

    def add(self, key: str, resync: bool = False) -> None:
        """Queue `key`: an event's (first) or, with `resync`, a periodic re-check's."""
        with self._cond:
            self._enqueue(key, resync, time.monotonic())

    def add_after(self, key: str, delay: float) -> None:
        with self._cond:
            heapq.heappush(self._delayed, (time.monotonic() + delay, key))
            self._cond.notify()

    def retry(self, key: str) -> float:
        """Requeue a failed key after its backoff; returns the delay."""
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        delay: float = min(self._base * (2.0**n), self._max)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def _pop(self, now: float) -> str | None:
        """The next key to process (lock held): an overdue resync key, else an event key,
        else a resync key."""
        if self._resyncs:
            key, since = next(iter(self._resyncs.items()))
            overdue = now - since >= self._resync_max_wait and not self._took_overdue
            if not self._events or overdue:
                # Overdue resync keys alternate with event keys: the sweep advances, and an
                # event waits behind one resync key at most, not behind the whole sweep.
                self._took_overdue = bool(self._events)
                del self._resyncs[key]
                return key
        self._took_overdue = False
        if self._events:
            key, _ = self._events.popitem(last=False)
            return key
        return None

    def get(self, timeout: float | None = None) -> str | None:
        """The next key (now marked active), or None when closed or on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    _, due = heapq.heappop(self._delayed)
                    self._enqueue(due, False, now)  # a retry or a planned re-check
                if self._closed:
                    return None
                nxt = self._pop(now)
                if nxt is not None:
                    self._active.add(nxt)
                    return nxt
                wait = None if deadline is None else deadline - now
                if self._delayed:
                    until = self._delayed[0][0] - now
                    wait = until if wait is None else min(wait, until)
                if wait is not None and wait <= 0:
                    if deadline is not None and now >= deadline:
                        return None
                    continue
                self._cond.wait(wait)

    def done(self, key: str) -> None:
        with self._cond:
            self._active.discard(key)
            if key in self._dirty:
                self._enqueue(key, self._dirty.pop(key), time.monotonic())

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def depth(self) -> tuple[int, int]:
        """Keys waiting: (event keys, resync keys), delayed ones not counted."""
        with self._cond:
            return len(self._events), len(self._resyncs)

    def __len__(self) -> int:
        with self._cond:
            return len(self._events) + len(self._resyncs) + len(self._delayed)
