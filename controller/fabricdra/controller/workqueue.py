"""A work queue keyed by object key, in the style of client-go's: a key waiting to be
processed is queued once however many events arrive for it, a key is processed by one worker
at a time, and a failed key comes back after an exponential backoff."""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque


class WorkQueue:
    def __init__(self, base_delay: float = 0.05, max_delay: float = 30.0) -> None:
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._dirty: set[str] = set()  # added while active: requeue when done
        self._delayed: list[tuple[float, str]] = []
        self._failures: dict[str, int] = {}
        self._base, self._max = base_delay, max_delay
        self._closed = False

    def add(self, key: str) -> None:
        with self._cond:
            if key in self._active:
                self._dirty.add(key)
            elif key not in self._queued:
                self._queued.add(key)
                self._queue.append(key)
                self._cond.notify()

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

    def get(self, timeout: float | None = None) -> str | None:
        """The next key (now marked active), or None when closed or on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    _, key = heapq.heappop(self._delayed)
                    if key in self._active:
                        self._dirty.add(key)
                    elif key not in self._queued:
                        self._queued.add(key)
                        self._queue.append(key)
                if self._closed:
                    return None
                if self._queue:
                    key = self._queue.popleft()
                    self._queued.discard(key)
                    self._active.add(key)
                    return key
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
                self._dirty.discard(key)
                if key not in self._queued:
                    self._queued.add(key)
                    self._queue.append(key)
                    self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue) + len(self._delayed)
