"""Placement of a gang larger than one NVLink domain (pure: counts in, a plan out).

A spanning ComputeDomain (`allowMultipleCliques` with `topology`, `segmentSize` or
`parallelism`; docs/compute-domains.md) is placed as one gang: a share of its `numNodes` in
each of the fewest NVLink fabric domains, all under one switch of the lowest scale-out tier
(`fabricdra.io/network.tier-1`, `-2`, `-3`, nearest first) that has the room, or nowhere (it
waits whole: a partial placement would hold nodes another job could run on while this one
cannot start).

Each fabric domain's share is a multiple of the gang's atom: a segment (`segmentSize`), else a
TPxEP group (`parallelism`), else one node. So a segment or a group never straddles two NVLink
domains, and the holes a share fits are whatever room a fabric domain has, rounded down to
whole atoms.

Which switch a fabric domain is under, per tier, is the one switch all its counted nodes'
tier label names; a fabric domain whose nodes name different switches, or lack the label,
claims no closeness at that tier (it still counts at the tiers above, and with no tier at
all). Tier labels are written per node by the scale-out controller (api/scaleout.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from fabricdra.api.computedomain import TIERS, Tier
from fabricdra.api.jsontypes import JSON
from fabricdra.api.scaleout import TIER_LABELS

# A plan's tier when no switch tier holds the gang (only without `topology.required`).
ANY = "any"


@dataclass(frozen=True)
class Plan:
    """Where a spanning gang goes: node count per fabric domain (multiples of the atom),
    the tier it stays under (`ANY`: none) and that tier's switch ("" with `ANY`)."""

    shares: Mapping[str, int]
    tier: str
    switch: str = ""

    @property
    def fabrics(self) -> list[str]:
        return sorted(self.shares)


@dataclass(frozen=True)
class Wait:
    """Why a spanning gang is not placed (its status' message)."""

    message: str


@dataclass
class Switches:
    """Fabric domain -> its switch at each tier (None: its nodes claim no single switch)."""

    by_fabric: dict[str, tuple[str | None, ...]] = field(default_factory=dict)

    @classmethod
    def of(
        cls, fabrics: Mapping[str, Iterable[str]], node: Callable[[str], JSON | None]
    ) -> Switches:
        """From the nodes counted per fabric domain and the Node object of a name."""
        out: dict[str, tuple[str | None, ...]] = {}
        for fabric, names in fabrics.items():
            per_tier: list[str | None] = []
            for label in TIER_LABELS:
                seen = {
                    ((node(n) or {}).get("metadata") or {}).get("labels", {}).get(label)
                    for n in names
                }
                per_tier.append(seen.pop() if len(seen) == 1 else None)
            out[fabric] = tuple(per_tier)
        return cls(out)

    def switch(self, fabric: str, tier: int) -> str | None:
        tiers = self.by_fabric.get(fabric, ())
        return tiers[tier] if tier < len(tiers) else None


def _fill(want: int, atom: int, holes: Mapping[str, int]) -> dict[str, int] | None:
    """Shares for `want` nodes over the fewest of `holes` (fabric -> free nodes), each a
    multiple of `atom`, or None. The largest holes are taken whole first (fewest domains);
    the remainder goes to the tightest hole that takes it (best fit: the larger holes stay
    for larger gangs), ties by name."""
    room = {f: (n // atom) * atom for f, n in holes.items() if n >= atom}
    if sum(room.values()) < want:
        return None
    shares: dict[str, int] = {}
    left = want
    order = sorted(room, key=lambda f: (-room[f], f))
    while left:
        fits = [f for f in order if f not in shares and room[f] >= left]
        if fits:
            last = min(fits, key=lambda f: (room[f] - left, holes[f], f))
            shares[last] = left
            return shares
        biggest = next(f for f in order if f not in shares)
        shares[biggest] = room[biggest]
        left -= room[biggest]
    return shares


def _leftover(shares: Mapping[str, int], holes: Mapping[str, int]) -> int:
    return sum(holes[f] for f in holes) - sum(shares.values())


def place(
    want: int,
    holes: Mapping[str, int],
    switches: Switches,
    *,
    atom: int = 1,
    required: Tier | None = None,
) -> Plan | Wait:
    """The plan for a gang of `want` nodes in shares of `atom` nodes: under the lowest tier
    (up to `required`; past tier-3 to any node when nothing is required) where one switch has
    room, the fewest fabric domains under that switch; among switches of that tier the one
    left with the least room (best fit), then the fewest fabric domains, then by name."""
    if want % atom:
        raise ValueError(f"{want} nodes are not whole shares of {atom}")
    last = TIERS.index(required) if required else len(TIERS) - 1
    largest: dict[str, int] = {}
    for tier in range(last + 1):
        groups: dict[str, dict[str, int]] = {}
        for fabric, free in holes.items():
            switch = switches.switch(fabric, tier)
            if switch is not None:
                groups.setdefault(switch, {})[fabric] = free
        best: tuple[tuple[int, int, str], dict[str, int], str] | None = None
        for switch, under in groups.items():
            shares = _fill(want, atom, under)
            largest[TIERS[tier]] = max(
                largest.get(TIERS[tier], 0), sum((n // atom) * atom for n in under.values())
            )
            if shares is None:
                continue
            rank = (_leftover(shares, under), len(shares), switch)
            if best is None or rank < best[0]:
                best = (rank, shares, switch)
        if best is not None:
            return Plan(best[1], TIERS[tier], best[2])
    if required is None:
        shares = _fill(want, atom, holes)
        if shares is not None:
            return Plan(shares, ANY)
        return Wait(
            f"numNodes {want} in shares of {atom} node(s): the NVLink fabric domains have "
            f"room for {sum((n // atom) * atom for n in holes.values())} now (counting the "
            "nodes other gangs placed there still expect); waiting whole for room"
        )
    room = largest.get(required, 0)
    tier = TIERS.index(required)
    if not any(switches.switch(f, tier) for f in holes):
        return Wait(
            f"numNodes {want} must stay under one {required} switch (topology.required), but "
            f"no NVLink fabric domain's nodes carry one {TIER_LABELS[tier]} label (written by "
            "the scale-out controller, docs/scale-out.md); waiting whole"
        )
    return Wait(
        f"numNodes {want} in shares of {atom} node(s) under one {required} switch "
        f"(topology.required): the most room under one {required} switch is {room} node(s) "
        "now (counting the nodes other gangs placed there still expect); waiting whole for "
        "room"
    )


def segments(shares: Mapping[str, int], size: int) -> list[tuple[str, int]]:
    """The segments a plan's shares make: (fabric domain, segment number in it), in order."""
    return [(f, k) for f in sorted(shares) for k in range(shares[f] // size)]
