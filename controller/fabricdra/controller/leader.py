"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules, so two
controller replicas never act at once:

- **observed time**: a replica judges a peer's lease expired by *its own* clock, from the
  moment it last saw the lease record change, never from the peer's `renewTime` (the clocks
  of two machines disagree; a peer whose clock runs an hour behind still leads while it
  renews);
- **renew deadline < lease duration**: a leader that has not renewed for `renew_deadline`
  stops leading, and every request it makes is bounded by what is left of that deadline, so it
  has stopped before any standby can see the lease run out (`lease_seconds` after the standby
  last saw a change, which is after the leader's last renewal);
- every write is conditional on the resourceVersion read, so two replicas racing for an
  expired lease produce one winner.

The `kubernetes` package's own `leaderelection` module (37.x, the version pyproject.toml
requires) was considered. It now judges expiry by observed time as well (older releases judged
it from the holder's `renewTime`; that is no longer a reason), but two still hold: a renew
request has no time bound (its renew loop checks the deadline only between requests, so one
request hung past `renew_deadline` keeps a replica leading after a standby may have taken
over), and its `LeaseLock` builds on the typed `CoordinationV1Api` with the process-wide
default configuration, not the `Rest` client every part of this code base shares
(kube/rest.py: per-call timeouts, typed errors, counted writes). This module is the same
algorithm as client-go's, in ~150 lines.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from fabricdra.kube.patches import conditional
from fabricdra.kube.rest import LEASES, ApiError, Conflict, NotFound, Rest

log = logging.getLogger("fabricdra.controller.leader")


def _stamp() -> str:
    # The Lease's times are informational (other tools show them); expiry never reads them.
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(spec: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(
        spec.get(k)
        for k in (
            "holderIdentity",
            "renewTime",
            "acquireTime",
            "leaseTransitions",
            "leaseDurationSeconds",
        )
    )


class LeaderElector:
    def __init__(
        self,
        rest: Rest,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_seconds: float = 15.0,
        renew_deadline: float | None = None,
        renew_every: float = 2.0,
    ) -> None:
        self.rest, self.namespace, self.name, self.identity = rest, namespace, name, identity
        self.lease_seconds = lease_seconds
        # client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry period.
        self.renew_deadline = (
            renew_deadline if renew_deadline is not None else lease_seconds * 2 / 3
        )
        if not 0 < self.renew_deadline < self.lease_seconds:
            raise ValueError("the renew deadline must be shorter than the lease duration")
        self.renew_every = renew_every
        self.leading = threading.Event()
        self.lost = threading.Event()
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0  # time.monotonic() when _observed was first seen

    def _observe(self, spec: dict[str, Any], now: float) -> None:
        record = _record(spec)
        if record != self._observed:
            self._observed, self._observed_at = record, now

    def _create(self, spec: dict[str, Any], now: float, timeout: float) -> bool:
        """The first holder's Lease; False when another candidate created it first."""
        body = {
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {**spec, "acquireTime": spec["renewTime"], "leaseTransitions": 0},
        }
        try:
            created = self.rest.create(LEASES, body, self.namespace, timeout=timeout)
        except Conflict:
            return False
        self._observe(created.get("spec", {}), now)
        return True

    def try_acquire_or_renew(self, timeout: float = 5.0) -> bool:
        """One attempt; each request waits at most `timeout` seconds."""
        now = time.monotonic()
        seconds = max(1, round(self.lease_seconds))
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": seconds,
            "renewTime": _stamp(),
        }
        try:
            lease = self.rest.get(LEASES, self.name, self.namespace, timeout=timeout)
        except NotFound:
            return self._create(spec, now, timeout)
        current = lease.get("spec", {}) or {}
        self._observe(current, now)
        holder = current.get("holderIdentity")
        duration = float(current.get("leaseDurationSeconds") or self.lease_seconds)
        if holder and holder != self.identity and now < self._observed_at + duration:
            return False
        if holder != self.identity:
            spec["acquireTime"] = spec["renewTime"]
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        patch = conditional(lease["metadata"]["resourceVersion"], {"spec": spec})
        try:
            written = self.rest.patch(LEASES, self.name, patch, self.namespace, timeout=timeout)
        except Conflict:
            return False
        self._observe(written.get("spec", {}), now)
        return True

    def _attempt(self, timeout: float) -> bool:
        try:
            return self.try_acquire_or_renew(timeout=max(0.1, timeout))
        except ApiError as e:
            log.warning("leader election: %s", e)
            return False

    def run(self, stop: threading.Event) -> None:
        """Acquire (retrying every `renew_every`), then renew; set `leading` while leading, and
        `lost` once a renewal has not succeeded for `renew_deadline` (the caller must then
        stop acting: another replica may lead soon)."""
        while not stop.is_set() and not self._attempt(self.renew_every):
            stop.wait(self.renew_every)
        if stop.is_set():
            return
        log.info("became leader %s", self.identity)
        self.leading.set()
        last_renewal = time.monotonic()
        wait = self.renew_every
        while not stop.wait(wait):
            left = self.renew_deadline - (time.monotonic() - last_renewal)
            # A GET and a PATCH: together they must end before the deadline does.
            if left > 0 and self._attempt(min(self.renew_every, left / 2)):
                last_renewal, wait = time.monotonic(), self.renew_every
                continue
            left = self.renew_deadline - (time.monotonic() - last_renewal)
            if left <= 0:
                log.error("lost leadership: no renewal for %.1fs", self.renew_deadline)
                self.leading.clear()
                self.lost.set()
                return
            wait = min(self.renew_every, left)

    def release(self) -> None:
        """Give the lease up on a clean shutdown, so a standby takes over at once."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        try:
            self.rest.patch(
                LEASES,
                self.name,
                {"spec": {"holderIdentity": None, "renewTime": None}},
                self.namespace,
                timeout=self.renew_every,
            )
        except ApiError as e:
            log.warning("releasing the lease: %s", e)
