"""IMEX channel allocation: each live domain holds its own channel id.

Two domains on one host IMEX domain (host mode, or a rack whose daemons run cluster-wide)
must never share a channel, or one job could import the other's exported GPU memory. The
allocation is recorded in each domain's `status.channels`; this module only decides, from
what is already recorded, which id a new domain gets. Ids are unique cluster-wide, which is
stricter than needed (unique per host IMEX domain) and needs no knowledge of which hosts share
one; 2048 ids cover more live domains than a cluster has NVLink nodes.
"""

from __future__ import annotations

from collections.abc import Iterable

from fabricdra.api.computedomain import CHANNEL_COUNT


class ChannelsExhausted(Exception):
    """Every channel id of the range is held by a live domain."""


def lowest_free(held: Iterable[int], count: int = CHANNEL_COUNT) -> int:
    """The lowest id in [0, count) not in `held`. Lowest-first keeps ids small and stable,
    and makes a freed id the next one handed out (no unbounded drift)."""
    taken = set(held)
    for channel in range(count):
        if channel not in taken:
            return channel
    raise ChannelsExhausted(f"all {count} IMEX channels are held by live ComputeDomains")


def duplicates(held_by: dict[str, list[int]]) -> dict[int, list[str]]:
    """Channel ids recorded by more than one domain (keyed by domain), for a restart check:
    a duplicate can only come from an outside edit of status, and is reported, not fixed."""
    owners: dict[int, list[str]] = {}
    for domain, channels in held_by.items():
        for channel in channels:
            owners.setdefault(channel, []).append(domain)
    return {c: sorted(d) for c, d in owners.items() if len(d) > 1}
