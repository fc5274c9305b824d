"""Which domain holds a node: the one-ComputeDomain-per-node rule (pure).

How the scheduler sees the rule (see docs/compute-domains.md, "One domain per node"):
- each node's `compute-domain.fabricdra.io` ResourceSlice offers one `channel` device that
  many claims may share (`allowMultipleAllocations`), with an `owner` attribute: `free` or the
  UID of the domain holding the node;
- a domain's workload claim template selects `owner in ['free', <its uid>]`, so once a node is
  held the scheduler will not even consider it for another domain's pod: that pod stays
  Pending (Unschedulable), never ContainerCreating;
- the device carries a binding condition: a pod allocated the channel waits in the
  scheduler's PreBind until this controller admits its claim. The controller decides
  node by node, one decision at a time, so two domains' pods scheduled onto one free node in
  the same instant get one admission and one conflict; the conflicting claim's allocation
  is dropped by the scheduler and its pod retried, by then seeing the node as held.

A node becomes free again when no claim of its owner is allocated on it any more, also once
its owner is deleted: a deleted domain's admitted claims hold the node while they are
allocated (their pods may still run). Which domain a claim belongs to is what its
configuration names (claims.claim_domain), never its label, which the claim's owner can edit.

A domain's nodes share one NVLink fabric domain (clique): the first admission pins it there.
A domain that opted in with `spec.allowMultipleCliques` (`multi_clique`) is never pinned and
takes nodes of any clique; one domain per node holds all the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

from fabricdra.api.computedomain import FREE_OWNER


@dataclass(frozen=True)
class ClaimOnNode:
    key: str  # namespace/name
    domain: str  # the domain UID the claim's configuration names, "" if none (claim_domain)
    state: str  # "admitted" | "pending" | "conflict"
    since: str  # allocation timestamp (RFC 3339), for first-come ordering


@dataclass(frozen=True)
class Decision:
    owner: str  # domain UID or FREE_OWNER
    admit: list[str] = field(default_factory=list)
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (claim key, message)
    fabric_pins: dict[str, str] = field(default_factory=dict)  # domains whose fabric this fixes


def decide(
    node: str,
    node_fabric: str,
    claims: Sequence[ClaimOnNode],
    live_domains: Mapping[str, str | None],
    current_owner: str = FREE_OWNER,
    multi_clique: Set[str] = frozenset(),
    names: Mapping[str, str] | None = None,
) -> Decision:
    """`live_domains`: UID -> the domain's fabric domain, None while not fixed yet. A domain
    not in the map is gone (or being deleted) and gets no new nodes. `multi_clique`: UIDs of
    domains allowed to span several fabric domains (never pinned). `names`: UID ->
    "namespace/name", so a refusal names the domain holding the node."""
    admitted = {c.domain for c in claims if c.state == "admitted" and c.domain}
    if admitted:
        owner = current_owner if current_owner in admitted else min(admitted)
    elif current_owner in live_domains and _pending_of(claims, current_owner):
        # Admitted a moment ago; the claim's new condition is not in our cache yet.
        owner = current_owner
    else:
        owner = FREE_OWNER
        pending = sorted(
            (c for c in claims if c.state == "pending"), key=lambda c: (c.since, c.key)
        )
        for claim in pending:
            if _fits(claim.domain, node_fabric, live_domains, multi_clique):
                owner = claim.domain
                break

    admit, conflicts, pins = [], [], {}
    for claim in claims:
        if claim.state != "pending":
            continue
        mine = claim.domain == owner and owner != FREE_OWNER
        if mine and _fits(claim.domain, node_fabric, live_domains, multi_clique):
            admit.append(claim.key)
            if live_domains[claim.domain] is None and claim.domain not in multi_clique:
                pins[claim.domain] = node_fabric
            continue
        why = _why(claim, node, node_fabric, owner, live_domains, names or {})
        conflicts.append((claim.key, why))
    return Decision(owner=owner, admit=sorted(admit), conflicts=sorted(conflicts), fabric_pins=pins)


def _pending_of(claims: Sequence[ClaimOnNode], domain: str) -> bool:
    return any(c.domain == domain and c.state == "pending" for c in claims)


def _fits(
    domain: str, node_fabric: str, live: Mapping[str, str | None], multi_clique: Set[str]
) -> bool:
    if not domain or domain not in live:
        return False
    if domain in multi_clique:
        return True
    pinned = live[domain]
    return pinned is None or pinned == node_fabric


def _why(
    claim: ClaimOnNode,
    node: str,
    fabric: str,
    owner: str,
    live: Mapping[str, str | None],
    names: Mapping[str, str],
) -> str:
    if not claim.domain:
        return "the claim names no ComputeDomain (label missing)"
    if claim.domain not in live:
        return "the claim's ComputeDomain no longer exists or is being deleted"
    pinned = live[claim.domain]
    if pinned is not None and pinned != fabric:
        return (
            f"node {node} is in NVLink fabric domain {fabric or '(none)'} but the "
            f"ComputeDomain's nodes are in {pinned or '(none)'}; a domain never spans two "
            "unless its spec sets allowMultipleCliques: true"
        )
    if owner in names:
        return f"node {node} is held by another ComputeDomain, {names[owner]} (UID {owner})"
    if owner not in live:
        return (
            f"node {node} is held by claims of ComputeDomain {owner}, which is deleted, "
            "until they are no longer allocated (their pods may still run)"
        )
    return f"node {node} is held by another ComputeDomain ({owner})"
