"""Gang placement: which NVLink fabric domain a ComputeDomain with `numNodes` runs in, decided
by the controller before any of its pods is scheduled.

Why above the scheduler: kube-scheduler places a job's first pod without knowing it belongs to a
gang, so the first pods of several jobs land in one fabric domain, each job's podAffinity then
keeps the rest of its pods there, and the jobs split the fabric's nodes between them: none gets
`numNodes`, all wait at binding until the gang timeout releases them, and they may land
together again (bench/scale.py at 200 nodes: 8 of 10 domains Ready after 900 s). Pinning the
claim template after the first admission comes too late: the claims were made from the
unpinned template when the pods were created.

So a gang domain is placed when it is first reconciled, before its workload claim template
exists: best fit (the fabric domain left with the fewest free nodes, ties by name) on the
nodes that are free for it, counting the nodes other gangs placed in that fabric domain still
expect. The template is created
pinned to that fabric domain, so every claim made from it can only be allocated there. A
domain that fits nowhere now gets no template (its pods wait for their claims, quietly
Pending) and `Ready=False, WaitingForFabric`; it is placed as soon as room appears (a domain
deleted, a node freed or added), and the claim controller makes its pods' claims when the
template appears. A placement lasts as long as the domain: it is recorded in
`status.fabricDomain` before the template is created from it (records.py), so a restarted
controller or a new leader keeps it. A claim allocated before the
placement existed (made from an older template) on a node of another fabric domain that has
room for the whole gang moves the placement there, while the domain holds no node yet
(recorded before that claim is admitted).
A gang is never moved (gang timeout, lost room) away from claims its pods already have that
were made from its template pinned to where it is: those can be allocated nowhere else, so
a gang placed elsewhere refused them at binding (`NodeHeld`) for as long as their pods
lived; it stays, and moves once those pods are gone (`_left_behind`).
Clusters without any fabric-labelled node place nothing (gangs then rely on the gang timeout).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fabricdra.api.computedomain import FREE_OWNER, ComputeDomain, gang_size, placed_by_kueue
from fabricdra.api.jsontypes import JSON

from . import capacity, hierarchy, podfit, records
from .capacity import FINISHED, finished
from .indexes import BY_DOMAIN, BY_FABRIC, BY_NODE
from .objects import pinned_fabric
from .workloads import narrow_to_topology

__all__ = ["FINISHED", "Gang", "Placed", "Placement", "best_fit", "finished", "free_nodes"]

if TYPE_CHECKING:
    from .deps import Cache, PlacementDeps

log = logging.getLogger("fabricdra.controller")


@dataclass(frozen=True)
class Gang:
    uid: str
    want: int  # numNodes
    fabric: str  # the fabric domain it is placed in ("" for a spanning gang)
    # A spanning gang's nodes per fabric domain (hierarchy.py); None: all `want` in `fabric`.
    shares: Mapping[str, int] | None = None

    @property
    def parts(self) -> Mapping[str, int]:
        return self.shares if self.shares is not None else {self.fabric: self.want}


def free_nodes(
    fabrics: Mapping[str, Iterable[str]],
    owners: Mapping[str, str],
    gangs: Iterable[Gang],
    for_uid: str,
) -> dict[str, int]:
    """Per fabric domain, how many of its nodes domain `for_uid` may count on: its nodes,
    less those another domain holds, less what other gangs placed there still expect
    (numNodes minus the nodes they already hold there). `fabrics`: fabric -> node names;
    `owners`: node -> holder (FREE_OWNER or a domain UID)."""
    free: dict[str, int] = {}
    members = {f: list(nodes) for f, nodes in fabrics.items()}
    for fabric, nodes in members.items():
        held = sum(1 for n in nodes if owners.get(n, FREE_OWNER) not in (FREE_OWNER, for_uid))
        free[fabric] = len(nodes) - held
    for gang in gangs:
        if gang.uid == for_uid:
            continue
        for fabric, share in gang.parts.items():
            if fabric not in members:
                continue
            have = sum(1 for n in members[fabric] if owners.get(n) == gang.uid)
            free[fabric] -= max(share - have, 0)
    return free


def best_fit(want: int, free: Mapping[str, int]) -> str | None:
    """The fabric domain with room for `want` nodes that is left with the fewest free nodes
    (ties by name): the tightest hole, so the larger holes stay whole for larger gangs. First
    fit by name put a gang of 12 in the first rack (18 free) and left racks of 17 and 12, so a
    gang of 18 arriving later waited for ever although the 12 fitted the last rack exactly."""
    fitting = [f for f in free if free[f] >= want]
    return min(fitting, key=lambda f: (free[f] - want, f), default=None)


@dataclass(frozen=True)
class Placed:
    fabric: str | None  # where the gang runs; None: not placed
    waiting: str = ""  # why it is not placed yet ("" when placement does not apply)
    # A spanning gang's placement (status.placement as JSON), None for any other domain.
    plan: JSON | None = None

    @property
    def fabrics(self) -> list[str] | None:
        """The fabric domains a spanning gang's template is pinned to (None: not spanning)."""
        if self.plan is None:
            return None
        return sorted(s["fabricDomain"] for s in self.plan.get("shares") or [])


def plan_json(plan: hierarchy.Plan) -> JSON:
    """A plan as recorded in status.placement (PlacementStatus)."""
    return {
        "tier": plan.tier,
        "switch": plan.switch,
        "shares": [{"fabricDomain": f, "nodes": plan.shares[f]} for f in plan.fabrics],
    }


def recorded_shares(obj: Mapping[str, Any]) -> dict[str, int] | None:
    """A spanning gang's recorded shares (status.placement), None when not placed."""
    placement = (obj.get("status") or {}).get("placement") or {}
    shares = placement.get("shares") or []
    return {s["fabricDomain"]: int(s["nodes"]) for s in shares} or None


def is_gang(domain: ComputeDomain) -> bool:
    """A gang placed in one fabric domain: `numNodes` > 1, and not a domain that may span
    several cliques (that one is never steered to a fabric domain), nor one whose nodes Kueue
    assigns (its pods are gated until Kueue's topology assignment: a fabric domain chosen
    here could differ from it, and its claims, pinned there, could then go nowhere)."""
    return (
        (domain.num_nodes or 1) > 1
        and not domain.spec.allowMultipleCliques
        and not placed_by_kueue({"metadata": domain.metadata})
    )


class GpuRoom(Mapping[str, int]):
    """Node -> its free GPUs (capacity.gpu_room), computed from that node's own slices and
    claims (the informers' by-node indexes) and cached until one of them changes
    (`changed`): a placement at 5,000 nodes would otherwise parse every GPU slice and claim
    each time an allocation anywhere changed. Nodes that publish no GPU are absent."""

    def __init__(self, device_slices: Cache, allocations: Cache) -> None:
        self.device_slices, self.allocations = device_slices, allocations
        self._lock = threading.Lock()
        self._cache: dict[str, int | None] = {}
        self._version: dict[str, int] = {}  # bumped by `changed`: a read older than it is void

    def changed(self, nodes: Iterable[str]) -> None:
        with self._lock:
            for node in nodes:
                self._cache.pop(node, None)
                self._version[node] = self._version.get(node, 0) + 1

    def __getitem__(self, node: str) -> int:
        with self._lock:
            if node in self._cache:
                cached = self._cache[node]
                if cached is None:
                    raise KeyError(node)
                return cached
            version = self._version.get(node, 0)
        room = capacity.gpu_room(
            self.device_slices.by_index(BY_NODE, node), self.allocations.by_index(BY_NODE, node)
        ).get(node)
        with self._lock:
            if self._version.get(node, 0) == version:  # nothing changed while we read
                self._cache[node] = room
        if room is None:
            raise KeyError(node)
        return room

    def __iter__(self) -> Iterator[str]:
        return iter([n for n in self.device_slices.index_values(BY_NODE) if n in self])

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _Nodes(Mapping[str, JSON]):
    """The node cache as a read-only mapping (name -> Node)."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def __getitem__(self, name: str) -> JSON:
        obj = self.cache.get(name)
        if obj is None:
            raise KeyError(name)
        return obj

    def __iter__(self) -> Iterator[str]:
        return iter(o["metadata"]["name"] for o in self.cache.items())

    def __len__(self) -> int:
        return len(self.cache.items())


class Placement:
    """The placement decisions, one at a time (domain workers run in parallel)."""

    def __init__(self, deps: PlacementDeps) -> None:
        self.d = deps
        self._lock = threading.Lock()
        self._waiting: set[str] = set()  # domain keys that fit nowhere yet
        self._excluded: dict[str, set[str]] = {}  # domain UID -> nodes that failed its gang
        self._again: set[str] = set()  # UIDs of gangs to place again (their recorded one failed)
        self._ran: set[str] = set()  # UIDs of gangs seen holding all their nodes (or Ready)
        # UID -> what its last gang timeout did (failed), shown in its Ready message until it
        # runs (memory only).
        self._timed_out: dict[str, str] = {}
        # capacity.gpu_room per node, recomputed only for nodes whose slices or claims
        # changed (devices_changed).
        self._room = GpuRoom(deps.device_slices, deps.allocations)
        # UID -> a spanning gang's shares, until its status records them (the informer's
        # copy may lag the write).
        self._plans: dict[str, dict[str, int]] = {}

    def _current(self, uid: str, recorded: str) -> str | None:
        pinned = self.d.ownership.pin_of(uid)
        current = pinned if pinned is not None else recorded or None
        if uid in self._again and not (current and self._left_behind(uid, current)):
            return None  # to be placed again (failed), now that no pod of it is tied here
        return current

    def _left_behind(self, uid: str, fabric: str) -> int:
        """How many claims of gang `uid` (its pods') were made from its template pinned to
        `fabric`, and so can be allocated there only (a claim's spec never changes). Moved
        elsewhere, the gang would refuse every allocation of theirs at binding (`NodeHeld`,
        "... the ComputeDomain's nodes are in <the other>") for as long as their pods exist:
        pods nobody makes again (bare pods, a Job whose pods stay Pending) never ran."""
        key = self.d.ownership.key_of(uid)
        namespace = key.split("/", 1)[0] if key else None
        return sum(
            1
            for claim in self.d.claims.by_index(BY_DOMAIN, uid)
            if claim["metadata"].get("namespace") == namespace
            and not claim["metadata"].get("deletionTimestamp")
            and pinned_fabric(claim) == fabric
        )

    def _view(
        self, for_uid: str, exclude: bool = True, topology_key: str | None = None
    ) -> tuple[dict[str, list[str]], dict[str, str], list[Gang]]:
        """The nodes that count (capacity.py: Ready, schedulable, verified and fabric-checked
        where required, a free healthy GPU unless the gang holds it already; without those
        that failed this gang before, if `exclude`; narrowed by its PodGroup's topology
        constraint: `topology_key`, else the one its status records), who holds them, and the
        other gangs' placements."""
        d = self.d
        fabrics = capacity.usable_by_fabric(
            d.nodes.items(),
            require_verified=d.require_verified_nodes,
            require_fabric_verified=d.require_fabric_verified,
            exclude=self._excluded.get(for_uid, set()) if exclude else frozenset(),
            gpu_room=self._room,
            keep=set(d.ownership.nodes_of(for_uid)),
        )
        fabrics = self._narrow(fabrics, for_uid)
        owners = {n: d.ownership.owner(n) for nodes in fabrics.values() for n in nodes}
        key = self._topology_key(for_uid) if topology_key is None else topology_key
        if key:  # the PodGroup's topology constraint (workloads.py)
            fabrics = narrow_to_topology(
                fabrics,
                key,
                lambda n: str(
                    ((d.nodes.get(n) or {}).get("metadata") or {}).get("labels", {}).get(key, "")
                ),
                lambda n: owners.get(n, FREE_OWNER) in (FREE_OWNER, for_uid),
            )
        return fabrics, owners, self._gangs(for_uid)

    def _gangs(self, for_uid: str) -> list[Gang]:
        """The placements of the gangs other than `for_uid` that still expect nodes."""
        gangs = []
        for obj in self.d.domains.items():
            meta = obj["metadata"]
            want = gang_size(obj) or 1
            if meta.get("deletionTimestamp") or want <= 1 or meta["uid"] == for_uid:
                continue
            if finished(obj):  # its pods are done: it expects no node any more
                continue
            if (obj.get("spec") or {}).get("allowMultipleCliques") is True:
                shares = self._plans.get(meta["uid"]) or recorded_shares(obj)
                if shares:
                    gangs.append(Gang(meta["uid"], want, "", shares))
                continue
            placed = self._current(meta["uid"], (obj.get("status") or {}).get("fabricDomain", ""))
            if placed:
                gangs.append(Gang(meta["uid"], want, placed))
        return gangs

    def reserved(self, node: str, fabric: str, for_uid: str) -> str:
        """Why domain `for_uid` may not take the free `node` of `fabric` ("" if it may): the
        gangs placed in `fabric` still expect every free node there. Admitted, an elastic (or
        single-node, or unplaced) domain took a tray a placed gang's pinned claims can go
        nowhere but; the gang timed out, was released and placed there again, for ever,
        while another rack was free (issue 28 point 4c). Its pod is refused at binding
        instead and the scheduler tries it again, elsewhere if elsewhere has room."""
        d = self.d
        if not fabric:
            return ""
        with self._lock:
            here = [g for g in self._gangs("") if fabric in g.parts]
            if not here or any(g.uid == for_uid for g in here):
                return ""  # no gang placed here, or the claim's own gang is one of them
            gangs = here
            fabrics = capacity.usable_by_fabric(
                d.nodes.by_index(BY_FABRIC, fabric),
                require_verified=d.require_verified_nodes,
                require_fabric_verified=d.require_fabric_verified,
            )
            if node not in fabrics.get(fabric, []):
                return ""  # not room any gang counts on
            owners = {n: d.ownership.owner(n) for n in fabrics[fabric]}
            if free_nodes(fabrics, owners, gangs, for_uid).get(fabric, 0) > 0:
                return ""
        names = sorted(d.ownership.key_of(g.uid) or g.uid for g in gangs)
        return (
            f"node {node} is reserved: the gang(s) placed in fabric domain {fabric} "
            f"({', '.join(names)}) still expect every free node there"
        )

    def _needs(self, uid: str) -> podfit.PodNeeds:
        """What each pod of domain `uid` needs of a node (its spec; defaults if unknown)."""
        key = self.d.ownership.key_of(uid)
        obj = self.d.domains.get(key) if key else None
        try:
            return podfit.PodNeeds.of(ComputeDomain.model_validate(obj).spec)
        except ValueError:  # unknown or unreadable: what capacity.py counts
            return podfit.PodNeeds()

    def _narrow(self, fabrics: dict[str, list[str]], uid: str) -> dict[str, list[str]]:
        """`fabrics` without the nodes domain `uid`'s pods cannot run on (podfit.py: a taint
        they do not tolerate, fewer free GPUs than a pod uses): counted, a gang was placed
        where it could never fill, timed out and was placed there again while another rack
        was free (issue 28 point 4c)."""
        d, needs = self.d, self._needs(uid)
        listed = [n for names in fabrics.values() for n in names]
        tainted = any((d.nodes.get(n) or {}).get("spec", {}).get("taints") for n in listed)
        if not tainted and needs.gpus <= 1:
            return fabrics  # capacity.py counted a free GPU already: nothing more to judge
        common = (
            podfit.fleet_taints(n for n in d.nodes.items() if capacity.in_fabric(n))
            if tainted
            else frozenset()
        )
        return podfit.narrow(
            fabrics,
            _Nodes(d.nodes),
            needs,
            self._room,
            common,
            keep=d.ownership.nodes_of(uid),
        )

    def _topology_key(self, uid: str) -> str:
        """The node label the gang must stay within one value of: its PodGroup's topology
        constraint (KEP-5732), recorded in its status; "" without one."""
        key = self.d.ownership.key_of(uid)
        obj = self.d.domains.get(key) if key else None
        group = ((obj or {}).get("status") or {}).get("podGroup") or {}
        return str(group.get("topologyKey") or "")

    def _held_back(self, for_uid: str) -> str:
        """Why the multi-node NVLink check keeps nodes from the gang (capacity
        .held_back_by_fabric_check; "" without --fabric-check): a gang waiting for a check
        that cannot run (no verification image) or failed says so, not only "no room"."""
        d = self.d
        if not d.require_fabric_verified:
            return ""
        nodes, keep = d.nodes.items(), set(d.ownership.nodes_of(for_uid))

        def counted(fabric_checked: bool) -> dict[str, list[str]]:
            return capacity.usable_by_fabric(
                nodes,
                require_verified=d.require_verified_nodes,
                require_fabric_verified=fabric_checked,
                gpu_room=self._room,
                keep=keep,
            )

        return capacity.held_back_by_fabric_check(
            counted(True),
            counted(False),
            d.nodes.get,
            d.fabric_check_state,
        )

    def devices_changed(self, nodes: Iterable[str]) -> None:
        """A GPU slice or a claim's allocation on `nodes` changed: their GPU room is computed
        again when next read."""
        self._room.changed(nodes)

    def place(self, domain: ComputeDomain, key: str) -> Placed:
        """The gang's fabric domain, placing it now (best fit) if it has none yet."""
        if placed_by_kueue({"metadata": domain.metadata}):
            return Placed(None)  # Kueue chose its nodes: it follows its claims (is_gang)
        if domain.spec.spans:
            return self._place_spanning(domain, key)
        if not is_gang(domain):
            return Placed(None)
        want = domain.num_nodes or 1
        with self._lock:
            current = self._current(domain.uid, domain.status.fabricDomain)
            if current is not None:
                if not finished(domain.model_dump(mode="json")):
                    current = self._still_fits(domain.uid, key, want, current)
                self._waiting.discard(key)
                self.d.ownership.pin(domain.uid, current)
                return Placed(current)
            # The domain as the caller has it (its PodGroup may have just been recorded).
            topology = domain.status.podGroup.topologyKey if domain.status.podGroup else ""
            fabrics, owners, gangs = self._view(domain.uid, topology_key=topology)
            if not fabrics:  # no NVLink fabric domain known: nothing to place in
                self._waiting.discard(key)
                return Placed(None)
            free = free_nodes(fabrics, owners, gangs, domain.uid)
            fabric = best_fit(want, free)
            if fabric is None and self._excluded.get(domain.uid):
                # The nodes that failed it are a preference, not a ban: with nowhere else
                # to go, it is placed as if they had not (they may work now).
                fabrics, owners, gangs = self._view(
                    domain.uid, exclude=False, topology_key=topology
                )
                free = free_nodes(fabrics, owners, gangs, domain.uid)
                fabric = best_fit(want, free)
            if fabric is None:
                self._waiting.add(key)
                log.info("ComputeDomain %s (numNodes %d) fits nowhere yet: %s", key, want, free)
                # A message without the counts: it is written to status, which must not
                # change (and be rewritten) every time another node is held or freed.
                waiting = (
                    f"numNodes {want}: no NVLink fabric domain has {want} nodes free now "
                    "(counting the nodes other gangs placed there still expect); waiting "
                    "for room; the claim template is created once the domain is placed"
                )
                if topology:
                    waiting += (
                        f"; its PodGroup's topology constraint counts only nodes sharing one "
                        f"value of {topology}"
                    )
                held_back = self._held_back(domain.uid)
                return Placed(None, f"{waiting}; {held_back}" if held_back else waiting)
            self._waiting.discard(key)
            if domain.uid in self._again and domain.uid in self._timed_out:
                # Its Ready message said where it stayed, or that it would move: now it has.
                self._timed_out[domain.uid] = (
                    f"the gang is placed again, in fabric domain {fabric}, without the nodes "
                    "that failed it; pods made from now on follow its claim template"
                )
            self._again.discard(domain.uid)
            self.d.ownership.pin(domain.uid, fabric)
            log.info("placed ComputeDomain %s (numNodes %d) in fabric domain %s", key, want, fabric)
            return Placed(fabric)

    def _place_spanning(self, domain: ComputeDomain, key: str) -> Placed:
        """A gang across NVLink fabric domains (hierarchy.py): its recorded placement, else
        the fewest fabric domains under the lowest switch tier with room, or it waits whole
        (no template, so none of its pods' claims is made or allocated anywhere)."""
        spec, want = domain.spec, domain.spec.numNodes or 1
        recorded = domain.status.placement
        with self._lock:
            if recorded is not None and recorded.shares:
                self._waiting.discard(key)
                self._plans.pop(domain.uid, None)
                return Placed(None, plan=recorded.model_dump(mode="json"))
            fabrics, owners, gangs = self._view(domain.uid)
            if not fabrics:  # no NVLink fabric domain known: nothing to place in
                self._waiting.discard(key)
                return Placed(None)
            free = free_nodes(fabrics, owners, gangs, domain.uid)
            switches = hierarchy.Switches.of(fabrics, self.d.nodes.get)
            required = spec.topology.required if spec.topology else None
            out = hierarchy.place(want, free, switches, atom=spec.atom, required=required)
            if isinstance(out, hierarchy.Wait):
                self._waiting.add(key)
                log.info("ComputeDomain %s (numNodes %d) fits nowhere yet: %s", key, want, free)
                held_back = self._held_back(domain.uid)
                return Placed(None, f"{out.message}; {held_back}" if held_back else out.message)
            self._waiting.discard(key)
            self._plans[domain.uid] = dict(out.shares)
            log.info(
                "placed ComputeDomain %s (numNodes %d) under %s %s: %s",
                key,
                want,
                out.tier,
                out.switch or "-",
                dict(out.shares),
            )
            return Placed(None, plan=plan_json(out))

    def _still_fits(self, uid: str, key: str, want: int, current: str) -> str:
        """The gang's fabric domain, after checking a placement that has not got all its nodes
        yet: if a node of it failed (NotReady, cordoned, deleted: capacity.unusable) so that
        `current` no longer has room for the whole gang, and another fabric domain has, the
        gang moves there (best fit; domains.py records it and re-pins the template). With
        nowhere else to go it stays: the node may come back. A gang that holds all its nodes
        (all its pods were admitted) never moves. A node another domain holds (an elastic
        one too), a taint its pods do not tolerate and too few free GPUs count as lost room
        (podfit.py)."""
        d = self.d
        if len(d.ownership.nodes_of(uid)) >= want:
            return current
        # Only `current`'s nodes for the check (its fabric index): the whole fleet is read
        # only when the gang has to move.
        fabrics = self._narrow(
            capacity.usable_by_fabric(
                d.nodes.by_index(BY_FABRIC, current),
                require_verified=d.require_verified_nodes,
                require_fabric_verified=d.require_fabric_verified,
            ),
            uid,
        )
        _, _, gangs = self._view(uid)
        # Every other domain's hold counts, an elastic domain's too: a tray it took is as
        # lost to this gang as a failed one (issue 28 point 4c: counted only by the gang
        # timeout, the gang cycled through timeouts while another rack was free).
        owners = {n: d.ownership.owner(n) for nodes in fabrics.values() for n in nodes}
        if free_nodes(fabrics, owners, gangs, uid).get(current, 0) >= want:
            return current
        fabrics, owners, gangs = self._view(uid)
        free = free_nodes(fabrics, owners, gangs, uid)
        other = best_fit(want, {f: n for f, n in free.items() if f != current})
        if other is None:
            return current
        left = self._left_behind(uid, current)
        if left:  # its pods' claims can go nowhere else: it moves once they are gone
            log.info(
                "ComputeDomain %s (numNodes %d) lost room in fabric domain %s, but %d claims "
                "of its pods were made for it there; it stays until they are gone",
                key,
                want,
                current,
                left,
            )
            return current
        log.info(
            "ComputeDomain %s (numNodes %d) lost room in fabric domain %s before it got all "
            "its nodes; placing it in %s",
            key,
            want,
            current,
            other,
        )
        self._again.discard(uid)
        return other

    def room_may_have_gone(self) -> None:
        """A node changed: placed gangs that have not got all their nodes may have to move."""
        d = self.d
        keys = []
        for obj in d.domains.items():
            meta, spec = obj["metadata"], obj.get("spec") or {}
            want = gang_size(obj) or 1
            if meta.get("deletionTimestamp") or want <= 1 or spec.get("allowMultipleCliques"):
                continue
            placed = (obj.get("status") or {}).get("fabricDomain")
            if placed and not finished(obj) and len(d.ownership.nodes_of(meta["uid"])) < want:
                keys.append(f"{meta['namespace']}/{meta['name']}")
        for key in keys:
            d.enqueue_domain(key)

    def failed(self, uid: str, fabric: str, held: Iterable[str]) -> str:
        """Gang `uid` timed out in `fabric` holding only `held`: the other nodes of `fabric`
        that counted for it failed it (its pods did not get there in time: a taint, a
        resource its pods need, a node we cannot see is broken, or only a scheduler too
        busy). Place it again without them, so it does not land in the same place for ever
        while another fabric domain has room; but not while claims of its pods were made
        for `fabric` (`_left_behind`): they can be allocated nowhere else, so the gang stays
        and the scheduler retries those pods there; it is placed again once they are gone
        (deleted: Kueue's waitForPodsReady requeue, or the job's owner, makes new ones, whose
        claims follow the new template). Returns what happens next, for the release's
        message ("" when the gang is placed elsewhere already)."""
        d = self.d
        key = d.ownership.key_of(uid)
        obj = d.domains.get(key) if key else None
        if obj is None or not fabric:
            return ""
        if placed_by_kueue(obj):
            # Not placed here, so nothing to place again: Kueue's assignment stands.
            return (
                "Kueue assigned the gang's nodes (fabricdra.io/placed-by): its pods are "
                "retried there, and Kueue's waitForPodsReady requeues the workload"
            )
        with self._lock:
            recorded = (obj.get("status") or {}).get("fabricDomain", "")
            if self._current(uid, recorded) != fabric:
                return ""  # placed elsewhere already (another claim of the gang said so)
            left = self._left_behind(uid, fabric)
            if uid not in self._again:  # the first release of this gang's nodes decides
                nodes = capacity.usable_by_fabric(
                    d.nodes.by_index(BY_FABRIC, fabric),
                    require_verified=d.require_verified_nodes,
                    require_fabric_verified=d.require_fabric_verified,
                ).get(fabric, [])
                failing = set(nodes) - set(held)
                self._excluded.setdefault(uid, set()).update(failing)
                self._again.add(uid)
                log.info(
                    "ComputeDomain %s timed out in fabric domain %s; placed again without %s%s",
                    key,
                    fabric,
                    sorted(failing),
                    f" once the {left} claims made for it there are gone" if left else "",
                )
            if not left:
                d.ownership.unpin(uid)
            if left:
                note = (
                    f"the gang stays placed in fabric domain {fabric}: {left} claim(s) of its "
                    "pods were made for it there and can be allocated nowhere else, so the "
                    "scheduler retries them there; once those pods are gone (deleted, or "
                    "requeued by Kueue) it is placed again without the nodes that failed it"
                )
            else:
                note = (
                    f"the gang is placed again without the nodes of fabric domain {fabric} "
                    "that failed it; pods made from now on follow its claim template"
                )
            self._timed_out[uid] = note
        assert key is not None
        d.enqueue_domain(key)  # placed again, or its status says it timed out
        return note

    def timed_out(self, uid: str) -> str:
        """What gang `uid`'s last gang timeout did ("" if none since it last ran)."""
        with self._lock:
            return self._timed_out.get(uid, "")

    def follow(self, uid: str, fabric: str) -> bool:
        """A claim of gang `uid` was allocated on a node of `fabric` although the gang is
        placed elsewhere (the claim was made before the placement): move the placement there
        if the gang holds no node yet and `fabric` has room for all of it. True if moved."""
        d = self.d
        key = d.ownership.key_of(uid)
        obj = d.domains.get(key) if key else None
        if obj is None or not fabric:
            return False
        spec = obj.get("spec") or {}
        want = gang_size(obj) or 1
        if want <= 1 or spec.get("allowMultipleCliques") is True or placed_by_kueue(obj):
            return False
        with self._lock:
            current = self._current(uid, (obj.get("status") or {}).get("fabricDomain", ""))
            if current == fabric or d.ownership.nodes_of(uid):
                return False
            fabrics, owners, gangs = self._view(uid)
            if free_nodes(fabrics, owners, gangs, uid).get(fabric, 0) < want:
                return False
            # Recorded before the claim is admitted under it (records.py); raises if not.
            records.record_fabric(d.rest, d.ownership, uid, fabric, replace=True)
            self._again.discard(uid)  # placed: by its claim, not by best fit
            d.ownership.pin(uid, fabric)
        log.info("ComputeDomain %s follows its first claim to fabric domain %s", key, fabric)
        assert key is not None
        d.enqueue_domain(key)  # re-pin the template, record the placement
        return True

    def room_may_have_freed(self) -> None:
        """A domain went away, a node was freed or added: waiting gangs may fit now."""
        with self._lock:
            waiting = sorted(self._waiting)
        for key in waiting:
            self.d.enqueue_domain(key)

    def ran(self, uid: str) -> None:
        """The gang held all its nodes (or was Ready): it ran where it is, and is not placed
        again for a timeout before (one that kept it in place for its pods' claims)."""
        with self._lock:
            self._ran.add(uid)
            self._again.discard(uid)
            self._timed_out.pop(uid, None)

    def has_run(self, uid: str) -> bool:
        with self._lock:
            return uid in self._ran

    def forget(self, key: str, uid: str = "") -> None:
        with self._lock:
            self._ran.discard(uid)
            self._plans.pop(uid, None)
            self._waiting.discard(key)
            self._excluded.pop(uid, None)
            self._again.discard(uid)
            self._timed_out.pop(uid, None)
