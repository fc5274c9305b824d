"""The latest device-health snapshot, shared between a driver and kubelet's health streams.

The driver calls `HealthBroadcaster.publish(devices)` with the complete list whenever it has
re-read health (each discovery pass is fine: nothing is sent unless something changed, apart
from the periodic refresh). Each open `NodeWatchResources` stream sends the full list at
once, again whenever it changes, and at least every `resend_seconds` so that kubelet's
per-device timeout (30 s by default) never turns a quiet device Unknown.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .driver import DeviceHealth

# kubelet truncates longer messages to 1021 characters + "..."; do it here, the same way.
MAX_MESSAGE = 1024


def _clip(message: str | None) -> str | None:
    if message is None or len(message) <= MAX_MESSAGE:
        return message
    return message[: MAX_MESSAGE - 3] + "..."


class HealthBroadcaster:
    def __init__(self, resend_seconds: float = 10.0) -> None:
        self.resend_seconds = resend_seconds
        self._cond = threading.Condition()
        self._version = 0
        self._devices: tuple[DeviceHealth, ...] = ()
        self._closed = False
        self._wakes = 0

    def publish(self, devices: Iterable[DeviceHealth]) -> bool:
        """Replace the snapshot; wake the streams when it changed. Returns whether it did."""
        snapshot = tuple(
            sorted(
                (
                    DeviceHealth(d.pool_name, d.device_name, d.health, _clip(d.message))
                    for d in devices
                ),
                key=lambda d: (d.pool_name, d.device_name),
            )
        )
        with self._cond:
            if snapshot == self._devices:
                return False
            self._devices = snapshot
            self._version += 1
            self._cond.notify_all()
            return True

    def snapshot(self) -> tuple[int, tuple[DeviceHealth, ...]]:
        with self._cond:
            return self._version, self._devices

    def wait(self, seen: int, timeout: float) -> tuple[int, tuple[DeviceHealth, ...]] | None:
        """Block until the snapshot is newer than `seen` or `timeout` passes; the (possibly
        unchanged) snapshot, or None once closed."""
        with self._cond:
            wakes = self._wakes
            self._cond.wait_for(
                lambda: self._closed or self._version != seen or self._wakes != wakes, timeout
            )
            if self._closed:
                return None
            return self._version, self._devices

    def wake(self) -> None:
        """Let every waiting stream re-check whether its RPC is still alive."""
        with self._cond:
            self._wakes += 1
            self._cond.notify_all()

    def close(self) -> None:
        """End every stream (server shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def reopen(self) -> None:
        with self._cond:
            self._closed = False
