"""The controller's in-memory ownership state, with its one lock: which domain holds which
node, which fabric domain each domain is pinned to, the channels reserved for domains whose
status does not show them yet, and which domain key a UID names.

Everything here is a cache of what the API already says (slices, domain statuses) or is
about to say (a reservation lasts until the status write that records it is seen): a
restarted controller rebuilds it from the API before deciding anything (`rebuild`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from fabricdra.api.computedomain import FREE_OWNER

from . import channels


class Ownership:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owners: dict[str, str] = {}  # node -> domain UID (FREE_OWNER if none)
        # domain UID -> the nodes it holds (the reverse of _owners, FREE_OWNER left out): a
        # domain's nodes without a scan of every node's owner (5,000 at scale).
        self._held: dict[str, set[str]] = {}
        self._pins: dict[str, str] = {}  # domain UID -> fabric domain fixed by admission
        self._reserved: dict[str, int] = {}  # domain UID -> channel, until status shows it
        self._keys: dict[str, str] = {}  # domain UID -> "namespace/name"
        self._waiting_for_channel: set[str] = set()  # domain keys refused a channel
        # Gang timers in wall-clock seconds: they start from the claims' allocation time,
        # which the API records (kube-scheduler's clock), not from when this process saw them.
        self._gang_since: dict[str, float] = {}  # claim key -> when it was allocated
        self._gang_start: dict[tuple[str, str], float] = {}  # (uid, fabric) -> timer start
        self._gang_cut: dict[tuple[str, str], float] = {}  # (uid, fabric) -> last release

    # -- nodes -----------------------------------------------------------------------------
    def owner(self, node: str) -> str:
        with self._lock:
            return self._owners.get(node, FREE_OWNER)

    def set_owner(self, node: str, uid: str) -> None:
        with self._lock:
            self._unhold(node)
            self._owners[node] = uid
            if uid != FREE_OWNER:
                self._held.setdefault(uid, set()).add(node)

    def forget_node(self, node: str) -> None:
        with self._lock:
            self._unhold(node)
            self._owners.pop(node, None)

    def _unhold(self, node: str) -> None:
        before = self._owners.get(node, FREE_OWNER)
        nodes = self._held.get(before)
        if nodes is not None:
            nodes.discard(node)
            if not nodes:
                del self._held[before]

    def nodes_of(self, uid: str) -> list[str]:
        with self._lock:
            if uid == FREE_OWNER:
                return sorted(n for n, o in self._owners.items() if o == uid)
            return sorted(self._held.get(uid, ()))

    def known_nodes(self) -> set[str]:
        with self._lock:
            return set(self._owners)

    def held_count(self) -> int:
        with self._lock:
            return sum(len(nodes) for nodes in self._held.values())

    # -- fabric pins -----------------------------------------------------------------------
    def pin(self, uid: str, fabric: str) -> None:
        with self._lock:
            self._pins[uid] = fabric

    def pin_of(self, uid: str) -> str | None:
        with self._lock:
            return self._pins.get(uid)

    def unpin(self, uid: str) -> None:
        with self._lock:
            self._pins.pop(uid, None)

    # -- domain keys -----------------------------------------------------------------------
    def set_key(self, uid: str, key: str) -> None:
        with self._lock:
            self._keys[uid] = key

    def forget_domain(self, uid: str) -> None:
        with self._lock:
            self._keys.pop(uid, None)
            self._pins.pop(uid, None)
            self._reserved.pop(uid, None)

    def key_of(self, uid: str) -> str | None:
        with self._lock:
            return self._keys.get(uid)

    # -- gangs -----------------------------------------------------------------------------
    # One timer per gang (domain, fabric domain), started when its first claim was allocated
    # (the claim's `status.allocation.allocationTimestamp`, so a restarted or newly elected
    # controller goes on with the same timer instead of starting a new one): when it runs
    # out, every claim held before that moment is released together, so the whole job is
    # placed again (releasing claims one by one would leave the rest pinning the job there).
    def gang_hold(
        self,
        claim_key: str,
        gang: tuple[str, str],
        timeout: float,
        allocated_at: float | None = None,
        now: float | None = None,
    ) -> float | None:
        """Hold `claim_key` for `gang`: seconds left to wait, or None when it must be
        released now (the gang's time ran out, now or for an earlier cut). `allocated_at`:
        when the claim was allocated (epoch seconds; None when the API does not say: from
        now); never later than now (a scheduler clock ahead of ours does not extend it)."""
        now = time.time() if now is None else now
        start_at = now if allocated_at is None else min(allocated_at, now)
        with self._lock:
            if allocated_at is None:
                held_at = self._gang_since.setdefault(claim_key, start_at)
            else:  # the claim says: also after it was allocated again
                held_at = self._gang_since[claim_key] = start_at
            cut = self._gang_cut.get(gang)
            if cut is not None and held_at <= cut:
                self._gang_since.pop(claim_key, None)
                return None
            start = min(self._gang_start.get(gang, held_at), held_at)
            self._gang_start[gang] = start
            left = start + timeout - now
            if left > 0:
                return left
            self._gang_cut[gang] = now
            self._gang_start.pop(gang, None)
            self._gang_since.pop(claim_key, None)
            return None

    def gang_done(self, claim_key: str, gang: tuple[str, str]) -> None:
        with self._lock:
            self._gang_since.pop(claim_key, None)
            self._gang_start.pop(gang, None)

    # -- channels --------------------------------------------------------------------------
    def channel_for(self, uid: str, key: str, held: Callable[[], Iterable[int]], count: int) -> int:
        """The channel reserved for `uid`, else the lowest id neither `held()` (recorded in
        statuses, or still used by claims) nor reserved for another domain shows. Raises
        ChannelsExhausted (and remembers `key` as waiting) when there is none."""
        with self._lock:
            channel = self._reserved.get(uid)
            if channel is not None:
                return channel
            try:
                channel = channels.lowest_free([*held(), *self._reserved.values()], count)
            except channels.ChannelsExhausted:
                self._waiting_for_channel.add(key)
                raise
            self._waiting_for_channel.discard(key)
            self._reserved[uid] = channel
            return channel

    def recorded(self, uid: str) -> None:
        """The domain's status shows its channel: the reservation is no longer needed."""
        with self._lock:
            self._reserved.pop(uid, None)

    def waiting_for_channel(self) -> list[str]:
        with self._lock:
            return sorted(self._waiting_for_channel)

    def no_longer_waiting(self, key: str) -> None:
        with self._lock:
            self._waiting_for_channel.discard(key)
