"""Is a daemon's report Lease still renewed? Judged the way leader election judges a leader
(leader.py): by this controller's own clock, from when it last saw the Lease's `renewTime`
change, never by comparing the daemon's `renewTime` with the local clock (the node's clock may
be off). A report that declares no `leaseDurationSeconds` promises no heartbeat and is never
judged stale.

After a controller start, every report counts as renewed at the moment it is first seen, so a
restart never marks the whole fleet dead; a daemon that is really gone shows after one lease
duration."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from fabricdra.api.jsontypes import JSON


@dataclass(frozen=True)
class Heartbeat:
    renew_time: str
    duration: float  # seconds; 0 = no heartbeat promised
    seen_at: float  # time.monotonic() when this renew_time was first seen


class Heartbeats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, Heartbeat] = {}  # lease key -> last heartbeat seen

    def observe(self, key: str, lease: JSON | None, now: float | None = None) -> None:
        """Record a Lease event (None: the Lease is gone)."""
        with self._lock:
            if lease is None:
                self._seen.pop(key, None)
                return
            spec = lease.get("spec", {}) or {}
            renew = str(spec.get("renewTime") or "")
            duration = float(spec.get("leaseDurationSeconds") or 0)
            old = self._seen.get(key)
            if old is None or old.renew_time != renew or old.duration != duration:
                at = time.monotonic() if now is None else now
                self._seen[key] = Heartbeat(renew, duration, at)

    def overdue(self, key: str, now: float | None = None) -> float | None:
        """Seconds since the heartbeat was due, when it is; None while renewed in time (or
        when no heartbeat was promised)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            beat = self._seen.get(key)
        if beat is None or beat.duration <= 0:
            return None
        late = now - (beat.seen_at + beat.duration)
        return late if late >= 0 else None

    def due_in(self, key: str, now: float | None = None) -> float | None:
        """Seconds until the heartbeat is overdue; None without a promise or when overdue."""
        now = time.monotonic() if now is None else now
        with self._lock:
            beat = self._seen.get(key)
        if beat is None or beat.duration <= 0:
            return None
        left = beat.seen_at + beat.duration - now
        return left if left > 0 else None
