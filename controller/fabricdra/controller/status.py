"""A ComputeDomain's status, computed from what the controller observes (pure).

The controller is the only writer of `status`: daemons report into their own Lease objects and
the controller folds those reports in here, so there is one writer per object and no write
conflicts however many nodes join (NVIDIA's design has every daemon write the shared status,
which produced 409 storms on large jobs). Node indices are assigned here too, per clique (each
clique is its own IMEX ensemble, whose peer slots its nodes' indices are, as in NVIDIA's
driver): a node keeps its index while it stays in its clique, and a newcomer takes the lowest
index free in its clique.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import (
    ComputeDomain,
    ComputeDomainStatus,
    Condition,
    NodeStatus,
    SegmentStatus,
)
from fabricdra.api.fabriccheck import MeasuredLoss
from fabricdra.kube.events import EventType


@dataclass(frozen=True)
class HeldNode:
    """A node admitted for the domain (it has the domain's claims allocated on it)."""

    name: str
    ip: str
    fabric_domain: str
    # The clique its fabric label names now, when that differs from the one its row keeps
    # (re-cabled while held: it keeps its old row until its claims are released).
    moved_to: str | None = None


@dataclass(frozen=True)
class DaemonReport:
    """What a node's IMEX daemon last reported (its Lease)."""

    ready: bool
    message: str = ""
    ip: str = ""
    silent: bool = False  # its Lease missed its heartbeat (liveness.py): the node may be off


@dataclass(frozen=True)
class Observed:
    objects_ready: bool  # the claim templates (and DaemonSet) exist
    objects_message: str
    held: Sequence[HeldNode]
    reports: Mapping[str, DaemonReport]
    fabric_conflicts: Sequence[str] = ()  # claims of the domain allocated outside its fabric
    objects_reason: str = "CreatingObjects"  # Ready's reason while objects_ready is False
    unpin: bool = False  # no node and no allocated claim left: the fabric domain is free again
    too_large: str = ""  # why numNodes can never fit one fabric domain ("" when it can)
    placed: str | None = None  # a gang's fabric domain (placement.py), recorded in status
    finished: bool = False  # a gang that ran and whose pods are gone (domains.py)
    gang_timeout: str = ""  # what its last gang timeout did, until it runs (placement.py)
    # Its claims refused a node whose fabric domain failed the multi-node NVLink check
    # (nodes.py, elastic and multi-clique domains), with why.
    fabric_check_refused: Sequence[str] = ()
    # The newest measured loss the fabric check took in the gang's fabric domains
    # (fabricloss.for_fabrics): shown by a spanning gang (status.placement) only.
    measured_loss: MeasuredLoss | None = None


@dataclass(frozen=True)
class Event:
    """An Event the controller records (kube/events.py builds its body)."""

    type: EventType
    reason: str
    message: str


def _indices(domain: ComputeDomain, held: Sequence[HeldNode]) -> dict[str, int]:
    """Each held node's slot in its clique's IMEX peer list: kept while the node stays in the
    same clique, else the lowest free one there."""
    previous = {n.name: n for n in domain.status.nodes}
    taken: dict[str, set[int]] = {}
    out: dict[str, int] = {}
    ordered = sorted(held, key=lambda h: h.name)
    for h in ordered:
        old = previous.get(h.name)
        used = taken.setdefault(h.fabric_domain, set())
        if old is not None and old.fabricDomain == h.fabric_domain and old.index not in used:
            out[h.name] = old.index
            used.add(old.index)
    for h in ordered:
        if h.name not in out:
            used = taken[h.fabric_domain]
            out[h.name] = next(i for i in range(len(used) + 1) if i not in used)
            used.add(out[h.name])
    return out


def node_rows(domain: ComputeDomain, obs: Observed) -> list[NodeStatus]:
    host_mode = domain.spec.imexMode == "host"
    indices = _indices(domain, obs.held)
    rows = []
    for held in sorted(obs.held, key=lambda h: h.name):
        index = indices[held.name]
        report = obs.reports.get(held.name)
        if host_mode and report is None:
            # No report is not READY: the node plugin has not said the host's IMEX serves.
            ready, message = False, "waiting for the node plugin's report on the host IMEX"
        elif report is None:
            ready, message = False, "waiting for the IMEX daemon to report"
        else:
            ready, message = report.ready, report.message
        ip = (report.ip if report is not None and report.ip else "") or held.ip
        rows.append(
            NodeStatus(
                name=held.name,
                ipAddress=ip,
                fabricDomain=held.fabric_domain,
                index=index,
                ready=ready,
                message=message,
                # Each segment its own IMEX domain: the daemons of one segment list only each
                # other as peers (daemon.peers_of); slots are kept, so a node keeps its segment.
                segment=index // size if (size := domain.spec.segmentSize) else None,
            )
        )
    return sorted(rows, key=lambda r: (r.fabricDomain, r.index))


def segment_rows(domain: ComputeDomain, rows: Sequence[NodeStatus]) -> list[SegmentStatus]:
    """With segmentSize: each segment (fabric domain, number) its nodes have formed."""
    size = domain.spec.segmentSize
    if not size:
        return []
    groups: dict[tuple[str, int], list[NodeStatus]] = {}
    for r in rows:
        groups.setdefault((r.fabricDomain, r.segment or 0), []).append(r)
    return [
        SegmentStatus(
            fabricDomain=fabric,
            segment=k,
            nodes=[r.name for r in members],
            ready=len(members) == size and all(r.ready for r in members),
        )
        for (fabric, k), members in sorted(groups.items())
    ]


def too_large(
    want: int | None, sizes: Counter[str], *, pinned: str | None, multi_clique: bool
) -> str:
    """Why `numNodes` can never fit ("" when it can). `sizes`: compute-domain nodes per fabric
    domain (nodes without one are not judged: no multi-node NVLink there). The limit is the
    fabric's: the pinned fabric domain, else the largest one; with allowMultipleCliques, all
    cliques together."""
    if not want or want <= 1 or not sizes:
        return ""
    if multi_clique:
        total = sum(sizes.values())
        if want <= total:
            return ""
        return (
            f"numNodes {want} cannot fit: the {len(sizes)} clique(s) (NVLink fabric domains) "
            f"have {total} node(s) with the compute-domain plugin together"
        )
    if pinned:
        fabric, size = pinned, sizes.get(pinned, 0)
    else:
        fabric, size = max(sizes.items(), key=lambda kv: (kv[1], kv[0]))
    if want <= size:
        return ""
    which = "its" if pinned else "the largest"
    return (
        f"numNodes {want} cannot fit: {which} NVLink fabric domain {fabric} has {size} "
        "node(s) with the compute-domain plugin; a domain never spans two fabric domains "
        "unless its spec sets allowMultipleCliques: true"
    )


def _condition(
    previous: Mapping[str, Condition],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int,
) -> Condition:
    value: Literal["True", "False"] = "True" if status else "False"
    old = previous.get(type_)
    since = old.lastTransitionTime if old is not None and old.status == value else now
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message[:32768],
        lastTransitionTime=since,
        observedGeneration=generation,
    )


def without_fabric(
    domain: ComputeDomain, rows: Sequence[NodeStatus]
) -> tuple[bool, str, str] | None:
    """DaemonsReady for a managed domain whose joined nodes all lack a multi-node NVLink
    fabric (HGX, PCIe): their daemons run no IMEX, as NVIDIA's skip it for an empty clique id,
    and report ready (daemon.py); the condition says IMEX is not used. None: not that case."""
    if domain.spec.imexMode == "host" or not rows:
        return None
    if any(r.fabricDomain or not r.ready for r in rows):
        return None
    return (
        True,
        "NoFabric",
        f"{len(rows)} node(s) without a multi-node NVLink fabric: IMEX is not run there "
        "(nothing is imported across nodes); the domain's IMEX channel still isolates its "
        "workloads",
    )


# A condition's (status, reason, message), as compute decides it.
Verdict = tuple[bool, str, str]


def compute(
    domain: ComputeDomain, obs: Observed, now: str
) -> tuple[ComputeDomainStatus, list[Event]]:
    rows = node_rows(domain, obs)
    previous = {c.type: c for c in domain.status.conditions}
    gen = domain.generation
    held_names = {h.name for h in obs.held}
    silent = sorted(n for n, rep in obs.reports.items() if rep.silent and n in held_names)
    moved = _moved(obs)
    daemons = _daemons_ready(domain, rows, silent)
    conditions = [
        _condition(previous, cd.READY, *_ready(domain, obs, rows, daemons, moved), now, gen),
        _condition(previous, cd.DAEMONS_READY, *daemons, now, gen),
        _condition(previous, cd.DEGRADED, *_degraded(obs, rows, moved, silent), now, gen),
    ]
    status = domain.status.model_copy(
        update={
            "conditions": conditions,
            "nodes": rows,
            "segments": segment_rows(domain, rows),
            "measuredLoss": obs.measured_loss if domain.status.placement is not None else None,
            "observedGeneration": gen,
            "fabricDomain": _fabric_domain(domain, obs, rows),
        }
    )
    return status, transitions(domain, status)


def _daemons_ready(domain: ComputeDomain, rows: Sequence[NodeStatus], silent: list[str]) -> Verdict:
    """DaemonsReady: every joined node's IMEX daemon (or host service) ready."""
    want = domain.num_nodes
    ready_rows = [r for r in rows if r.ready]
    not_ready = [r for r in rows if not r.ready]
    if domain.spec.imexMode == "host" and not not_ready:
        return (
            True,
            "HostManaged",
            "IMEX runs on the hosts; each node's IMEX service is "
            "checked when a workload's channel is prepared",
        )
    if not_ready:
        failing = [r for r in not_ready if r.message and not r.message.startswith("waiting")]
        reason = "ImexNotReady" if failing else "WaitingForDaemons"
        if silent:
            reason = "DaemonUnresponsive"
        detail = "; ".join(f"{r.name}: {r.message}" for r in not_ready[:10])
        return (False, reason, f"{len(ready_rows)}/{len(rows)} IMEX daemons ready; {detail}")
    if want is not None and len(rows) < want:
        return (False, "WaitingForNodes", f"{len(rows)}/{want} nodes joined")
    if no_fabric := without_fabric(domain, rows):
        return no_fabric
    return (True, "AllDaemonsReady", f"{len(rows)} IMEX daemon(s) ready")


def _moved(obs: Observed) -> str:
    """Held nodes whose fabric label moved them to another clique ("" for none)."""
    return "; ".join(
        f"node {h.name} moved from NVLink fabric domain {h.fabric_domain} to "
        f"{h.moved_to or '(none)'} while held; it keeps its row and IMEX peer slot in "
        f"{h.fabric_domain} until the domain's claims on it are released"
        for h in sorted(obs.held, key=lambda h: h.name)
        if h.moved_to is not None
    )


def _ready(
    domain: ComputeDomain,
    obs: Observed,
    rows: Sequence[NodeStatus],
    daemons: Verdict,
    moved: str,
) -> Verdict:
    """Ready, the first reason in order of precedence that the domain is not."""
    ready = _ready_before_timeout(domain, obs, rows, daemons, moved)
    if not ready[0] and ready[1] == "WaitingForNodes" and obs.gang_timeout:
        # Why the gang waits again, where `kubectl describe` shows it.
        return (False, ready[1], f"{ready[2]}; the gang timeout released it: {obs.gang_timeout}")
    return ready


def _ready_before_timeout(
    domain: ComputeDomain,
    obs: Observed,
    rows: Sequence[NodeStatus],
    daemons: Verdict,
    moved: str,
) -> Verdict:
    want = domain.num_nodes
    ready_rows = [r for r in rows if r.ready]
    if obs.finished:
        return (
            False,
            "Finished",
            f"the gang ran and its pods are gone (no node held, no claim allocated): its "
            f"placement in fabric domain {domain.status.fabricDomain or '-'} no longer holds "
            "room for it; delete the ComputeDomain when its job is done",
        )
    if obs.too_large:  # before the objects: a gang too large is never placed either
        return (False, "FabricTooSmall", obs.too_large)
    if not obs.objects_ready:
        return (False, obs.objects_reason, obs.objects_message)
    if moved:  # its NVLink to the others is gone: the domain is not whole
        return (False, "CliqueChanged", moved)
    if not daemons[0]:
        return (False, daemons[1], daemons[2])
    if want is not None and len(ready_rows) < want:
        return (False, "WaitingForNodes", f"{len(ready_rows)}/{want} nodes ready")
    return (
        True,
        "Ready",
        f"{len(rows)} node(s) ready; channel "
        f"{domain.status.channels[0] if domain.status.channels else '-'}",
    )


def _degraded(obs: Observed, rows: Sequence[NodeStatus], moved: str, silent: list[str]) -> Verdict:
    """Degraded, the first reason in order of precedence (docs/compute-domains.md)."""
    errors = [
        f"{r.name}: {r.message}"
        for r in rows
        if not r.ready and r.message and not r.message.startswith("waiting")
    ]
    if obs.fabric_conflicts:
        return (True, "FabricConflict", "; ".join(obs.fabric_conflicts[:10]))
    if obs.fabric_check_refused:
        return (True, "FabricCheckFailed", "; ".join(obs.fabric_check_refused[:10]))
    if moved:
        return (True, "CliqueChanged", moved)
    if silent:
        return (
            True,
            "DaemonUnresponsive",
            "no heartbeat from the IMEX daemon (or host report) of "
            + ", ".join(silent[:10])
            + "; the node may be down",
        )
    if errors:
        return (True, "ImexError", "; ".join(errors[:10]))
    return (False, "AsExpected", "")


def _fabric_domain(domain: ComputeDomain, obs: Observed, rows: Sequence[NodeStatus]) -> str:
    """status.fabricDomain: the gang's placement, else the recorded one or the first row's."""
    if domain.spec.allowMultipleCliques:
        return ""  # a multi-clique domain has no one fabric domain: its rows name each node's
    if obs.placed:
        return obs.placed
    if obs.unpin and not rows:
        return ""
    return domain.status.fabricDomain or next((r.fabricDomain for r in rows if r.fabricDomain), "")


def transitions(domain: ComputeDomain, new: ComputeDomainStatus) -> list[Event]:
    """Events a user wants to see: nodes joining/leaving, conditions changing."""
    events = []
    old_nodes = {n.name for n in domain.status.nodes}
    new_nodes = {n.name for n in new.nodes}
    for name in sorted(new_nodes - old_nodes):
        events.append(Event("Normal", "NodeJoined", f"node {name} joined the domain"))
    for name in sorted(old_nodes - new_nodes):
        events.append(Event("Normal", "NodeLeft", f"node {name} left the domain"))
    old = {c.type: c for c in domain.status.conditions}
    ready_changed = any(
        c.type == cd.READY and (old.get(c.type) is None or old[c.type].status != c.status)
        for c in new.conditions
    )
    for c in new.conditions:
        if c.type == cd.DAEMONS_READY and ready_changed:
            continue  # said by the Ready event already
        before = old.get(c.type)
        if before is not None and before.status == c.status and before.reason == c.reason:
            continue
        if before is None and c.status == "False" and c.type == cd.DEGRADED:
            continue  # "not degraded" at birth is not news
        warn = (c.type == cd.DEGRADED) == (c.status == "True")
        events.append(
            Event(
                "Warning" if warn and c.type == cd.DEGRADED else "Normal",
                f"{c.type}{c.status}"
                if c.type != cd.DEGRADED or c.status == "True"
                else "Recovered",
                c.message or c.reason,
            )
        )
    return events


def status_patch(old: ComputeDomainStatus, new: ComputeDomainStatus) -> dict[str, object] | None:
    """The merge patch turning `old` into `new`, or None when nothing changed (no write)."""
    before = old.model_dump(mode="json")
    after = new.model_dump(mode="json")
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    return {"status": changed} if changed else None
