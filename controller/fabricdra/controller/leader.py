"""Leader election on a coordination.k8s.io/v1 Lease, so two controller replicas are safe:
only the holder runs the workers; the other waits and takes over when the lease expires."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta

from fabricdra.api.rest import LEASES, ApiError, Rest

log = logging.getLogger("fabricdra.controller.leader")


def _now() -> datetime:
    return datetime.now(UTC)


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


class LeaderElector:
    def __init__(
        self,
        rest: Rest,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_seconds: int = 15,
        renew_every: float = 2.0,
    ) -> None:
        self.rest, self.namespace, self.name, self.identity = rest, namespace, name, identity
        self.lease_seconds, self.renew_every = lease_seconds, renew_every
        self.leading = threading.Event()
        self.lost = threading.Event()

    def try_acquire_or_renew(self) -> bool:
        now = _now()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_seconds,
            "renewTime": _fmt(now),
        }
        try:
            lease = self.rest.get(LEASES, self.name, self.namespace)
        except ApiError as e:
            if not e.not_found:
                raise
            body = {
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": _fmt(now), "leaseTransitions": 0},
            }
            try:
                self.rest.create(LEASES, body, self.namespace)
            except ApiError as ce:
                if ce.conflict:
                    return False
                raise
            return True
        cur = lease.get("spec", {})
        holder = cur.get("holderIdentity")
        renew = cur.get("renewTime")
        expired = (
            renew is None
            or _parse(renew)
            + timedelta(seconds=int(cur.get("leaseDurationSeconds", self.lease_seconds)))
            < now
        )
        if holder and holder != self.identity and not expired:
            return False
        if holder != self.identity:
            spec["acquireTime"] = _fmt(now)
            spec["leaseTransitions"] = int(cur.get("leaseTransitions", 0)) + 1
        patch = {
            "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
            "spec": spec,
        }
        try:
            self.rest.patch(LEASES, self.name, patch, self.namespace)
        except ApiError as e:
            if e.conflict:
                return False
            raise
        return True

    def run(self, stop: threading.Event) -> None:
        """Loop: acquire, then renew; set `leading`, and `lost` if a renewal fails for longer
        than the lease (the caller must then stop working: another replica may lead)."""
        last_ok = 0.0
        while not stop.is_set():
            try:
                ok = self.try_acquire_or_renew()
            except ApiError as e:
                log.warning("leader election: %s", e)
                ok = False
            if ok:
                last_ok = time.monotonic()
                if not self.leading.is_set():
                    log.info("became leader %s", self.identity)
                    self.leading.set()
            elif self.leading.is_set() and time.monotonic() - last_ok > self.lease_seconds:
                log.error("lost leadership")
                self.leading.clear()
                self.lost.set()
                return
            stop.wait(self.renew_every)

    def release(self) -> None:
        """Give the lease up on a clean shutdown, so a standby takes over at once."""
        if not self.leading.is_set():
            return
        try:
            self.rest.patch(
                LEASES,
                self.name,
                {"spec": {"holderIdentity": None, "renewTime": None}},
                self.namespace,
            )
        except ApiError as e:
            log.warning("releasing the lease: %s", e)
