"""The node reconciler (node-name keys, one worker: ownership decisions are made one after the
other): the node's compute-domain ResourceSlice, who holds the node, and the answers to
workload claims waiting at binding time (admission.py decides; this module writes)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import gang_size
from fabricdra.api.jsontypes import JSON
from fabricdra.kube import patches
from fabricdra.kube.rest import CLAIMS, NODES, SLICES, Conflict, NotFound

from . import admission, capacity, metrics, objects, records
from .claims import allocated_at, claim_views, dev_key, domain_uid, node_fabric
from .deps import Cache, NodeDeps
from .fabriccheckrun import RUN_LABEL
from .indexes import BY_NODE, BY_UID
from .placement import recorded_shares
from .status import Event
from .writes import FIELD_MANAGER, now

log = logging.getLogger("fabricdra.controller")
# The gang key of a multi-clique domain (one timer for all its cliques); never a label value.
ALL_CLIQUES = "*"


def domain_namespaces(domains: Cache, claims: Iterable[JSON]) -> dict[str, str]:
    """Domain UID -> namespace, for the domains `claims` name (claim_views): looked up by UID,
    not by scanning every domain (a node reconcile reads its own claims' domains only)."""
    out = {}
    for uid in {domain_uid(cl) for cl in claims} - {""}:
        for obj in domains.by_index(BY_UID, uid):
            out[uid] = obj["metadata"]["namespace"]
    return out


def admitted_domains(domains: Cache, node: str, claims: Iterable[JSON]) -> set[str]:
    """The UIDs of the domains whose claims on `node` (of `claims`) were admitted: who holds
    a node that has no slice to say so (its Node, or its plugin label, is gone)."""
    claims = list(claims)
    namespaces = domain_namespaces(domains, claims)
    return {
        v.domain
        for cl in claims
        for v in claim_views(cl, node, namespaces)
        if v.state == "admitted" and v.domain
    }


# A claim's refusal reason where another domain holds its node.
NODE_HELD = "NodeHeld"
# ... where its node is the last free room of a placed gang.
RESERVED_FOR_GANG = "ReservedForGang"
# ... where a spanning gang holds its whole share of the node's fabric domain already.
OUTSIDE_PLACEMENT = "OutsidePlacement"


class NodeReconciler:
    def __init__(self, deps: NodeDeps) -> None:
        self.d = deps

    def live_domains(self, uids: Iterable[str]) -> tuple[dict[str, str | None], set[str]]:
        """Of the domains `uids` (those a node's decision involves: admission.decide reads no
        other), the live ones' fabric pins (None: not pinned yet), and the UIDs of those
        allowed to span several cliques (never pinned)."""
        live: dict[str, str | None] = {}
        multi: set[str] = set()
        wanted = sorted(set(uids) - {"", cd.FREE_OWNER})
        for obj in (o for uid in wanted for o in self.d.domains.by_index(BY_UID, uid)):
            meta = obj["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            uid = meta["uid"]
            if (obj.get("spec") or {}).get("allowMultipleCliques") is True:
                live[uid] = None
                multi.add(uid)
                continue
            # The in-memory pin first: a gang's placement may have just moved (placement.py).
            pinned = self.d.ownership.pin_of(uid)
            live[uid] = (
                pinned if pinned is not None else obj.get("status", {}).get("fabricDomain") or None
            )
        return live, multi

    def reconcile(self, name: str) -> None:
        d = self.d
        d.require_synced()
        node = d.nodes.get(name)
        claims = d.claims.by_index(BY_NODE, name)
        previous = d.ownership.owner(name)
        if node is None:
            self._without_node(name, claims, previous)
            return
        fabric = node_fabric(node)
        views, refused, reserved, outside = self._turn_away(node, name, fabric, claims, previous)
        live, multi = self.live_domains([*(v.domain for v in views), previous])
        names = {uid: key for uid in live if (key := d.ownership.key_of(uid))}
        decision = admission.decide(
            name, fabric, views, live, previous, multi_clique=multi, names=names
        )
        for uid, pinned in decision.fabric_pins.items():
            # The pin is written before the admission it comes with (records.py): a leader
            # that died after admitting but before recording would let its successor admit
            # the domain's next claim in another fabric domain. Not written: nothing is
            # decided now (raises; the node is retried).
            records.record_fabric(d.rest, d.ownership, uid, pinned)
            d.ownership.pin(uid, pinned)
        d.ownership.set_owner(name, decision.owner)
        self._ensure_slice(node, decision.owner, fabric)
        self._ensure_node_label(node, decision.owner)
        by_key = {f"{cl['metadata']['namespace']}/{cl['metadata']['name']}": cl for cl in claims}
        admit, timed_out = self._gang(name, fabric, decision.admit, by_key, multi)
        self._answer_timed_out(name, fabric, timed_out, by_key, multi)
        for key in admit:
            self._answer(
                by_key[key],
                name,
                cd.ADMITTED_CONDITION,
                "Admitted",
                f"node {name} is held by this claim's ComputeDomain",
            )
            metrics.ADMISSIONS.labels("admitted").inc()
        refusals = [
            *((NODE_HELD, key, why) for key, why in decision.conflicts),
            *((capacity.FABRIC_CHECK_FAILED, k, why) for k, why in sorted(refused.items())),
            *((RESERVED_FOR_GANG, k, why) for k, why in sorted(reserved.items())),
            *((OUTSIDE_PLACEMENT, k, why) for k, why in sorted(outside.items())),
        ]
        for reason, key, why in refusals:
            self._refuse(by_key[key], name, reason, why)
        metrics.HELD_NODES.set(d.ownership.held_count())
        if previous != cd.FREE_OWNER and decision.owner == cd.FREE_OWNER:
            d.placement.room_may_have_freed()
        for uid in {previous, decision.owner} - {cd.FREE_OWNER}:
            domain_key = d.ownership.key_of(uid)
            if domain_key:
                d.enqueue_domain(domain_key)

    def _without_node(self, name: str, claims: list[JSON], previous: str) -> None:
        """No plugin here (or no node): no devices to offer. The hold lives on while a claim
        is still allocated on it (its pod may still run), never handed on: from its admitted
        claims, so a restarted controller (whose slice view lost the node with its slice)
        still knows who holds it."""
        d = self.d
        d.rest.delete(SLICES, objects.slice_name(name))
        if not claims:
            d.ownership.forget_node(name)
            return
        admitted = admitted_domains(d.domains, name, claims)
        if admitted and previous not in admitted:
            d.ownership.set_owner(name, min(admitted))
            key = d.ownership.key_of(min(admitted))
            if key:
                d.enqueue_domain(key)

    def _turn_away(
        self, node: JSON, name: str, fabric: str, claims: list[JSON], previous: str
    ) -> tuple[list[admission.ClaimOnNode], dict[str, str], dict[str, str], dict[str, str]]:
        """The node's claims admission decides on, and those turned away before it: refused
        by the fabric check, reserved for a placed gang, outside their gang's placement."""
        d = self.d
        namespaces = domain_namespaces(d.domains, claims)
        views = [v for cl in claims for v in claim_views(cl, name, namespaces)]
        for view in views:  # claims made before their gang was placed may move it here
            if view.state == "pending" and view.domain:
                d.placement.follow(view.domain, fabric)
        refused = self._fabric_check_refusals(node, views)
        reserved = self._gang_reservations(name, fabric, views, previous)
        outside = self._share_refusals(name, fabric, views)
        turned_away = {*refused, *reserved, *outside}
        views = [v for v in views if v.key not in turned_away]
        return views, refused, reserved, outside

    def _answer_timed_out(
        self,
        name: str,
        fabric: str,
        timed_out: Mapping[str, str],
        by_key: Mapping[str, JSON],
        multi: AbstractSet[str],
    ) -> None:
        """Claims of gangs not all allocated in time: released, saying where the gang goes."""
        for key, next_ in timed_out.items():
            where = (
                "its cliques"
                if domain_uid(by_key[key]) in multi
                else f"fabric domain {fabric or '(none)'}"
            )
            why = (
                f"the ComputeDomain's {self._want(by_key[key])} nodes were not all allocated in "
                f"{where} within "
                f"{self.d.gang_timeout_seconds:g}s; released so other jobs can use node {name}"
                + (f"; {next_}" if next_ else "")
            )
            self._refuse(by_key[key], name, "GangTimeout", why)

    def _refuse(self, claim: JSON, node: str, reason: str, why: str) -> None:
        """The conflict condition on a claim at binding time, counted and told in an Event."""
        self._answer(claim, node, cd.CONFLICT_CONDITION, reason, why)
        metrics.ADMISSIONS.labels("conflict").inc()
        self._conflict_event(claim, why)

    def _gang_reservations(
        self, name: str, fabric: str, views: Iterable[admission.ClaimOnNode], previous: str
    ) -> dict[str, str]:
        """Pending claims refused on the free node `name` because the gangs placed in its
        fabric domain still expect every free node there (placement.reserved)."""
        if previous != cd.FREE_OWNER:
            return {}  # held already: decided by who holds it
        out: dict[str, str] = {}
        for view in views:
            if view.state == "pending" and view.domain:
                why = self.d.placement.reserved(name, fabric, view.domain)
                if why:
                    out[view.key] = why
        return out

    def _share_refusals(
        self, name: str, fabric: str, views: Iterable[admission.ClaimOnNode]
    ) -> dict[str, str]:
        """Pending claims of a spanning gang refused on `name` because the gang holds its
        whole share of `fabric` already (status.placement): more there would split a segment
        or a TP x EP group across NVLink domains (hierarchy.py)."""
        d, out = self.d, {}
        for view in views:
            if view.state != "pending" or not view.domain:
                continue
            key = d.ownership.key_of(view.domain)
            obj = d.domains.get(key) if key else None
            shares = recorded_shares(obj) if obj is not None else None
            if not shares:
                continue
            held = [
                n
                for n in d.ownership.nodes_of(view.domain)
                if n != name and node_fabric(d.nodes.get(n) or {}) == fabric
            ]
            share = shares.get(fabric, 0)
            if len(held) >= share:
                out[view.key] = (
                    f"node {name}: the ComputeDomain's placement takes {share} "
                    f"node(s) in fabric domain {fabric or '(none)'} (status.placement) and "
                    f"holds them already ({', '.join(sorted(held)) or 'none'})"
                )
        return out

    def _fabric_check_refusals(
        self, node: JSON, views: Iterable[admission.ClaimOnNode]
    ) -> dict[str, str]:
        """Claim key -> why it is refused: under --fabric-check, a pending claim of an
        elastic (no numNodes) or multi-clique domain on a node whose fabric domain's check
        failed. Gang placement keeps gangs off such a rack; these domains are never placed,
        so the scheduler may put them there, across a trunk that failed its measurement.
        The check's own domain (labelled, in the driver's namespace) measures exactly such
        racks again, and is not refused. Admitted claims stay: a running job is not evicted."""
        d = self.d
        failed = capacity.fabric_check_failed(node) if d.fabric_check else ""
        if not failed:
            return {}
        out = {}
        for view in views:
            if view.state != "pending" or not view.domain:
                continue
            for obj in d.domains.by_index(BY_UID, view.domain):
                meta, spec = obj["metadata"], obj.get("spec") or {}
                spans = spec.get("allowMultipleCliques") is True
                if not spans and gang_size(obj) is not None:
                    continue  # a gang (placed) or a domain of one node (no trunk crossed)
                if meta.get("namespace") == d.namespace and RUN_LABEL in (meta.get("labels") or {}):
                    continue
                out[view.key] = (
                    f"node {node['metadata']['name']}: {failed}; "
                    f"{'a multi-clique' if spans else 'an elastic'} ComputeDomain is not "
                    "admitted there until a check of that fabric domain passes"
                )
        return out

    def _want(self, claim: JSON) -> int:
        """The claim's domain's numNodes (1 when unset or unknown)."""
        key = self.d.ownership.key_of(domain_uid(claim))
        obj = self.d.domains.get(key) if key else None
        return gang_size(obj or {}) or 1

    def _gang(
        self,
        node: str,
        fabric: str,
        keys: list[str],
        by_key: dict[str, JSON],
        multi_clique: set[str],
    ) -> tuple[list[str], dict[str, str]]:
        """Gang admission for domains with numNodes: a claim is admitted only once claims of
        its domain are allocated on numNodes nodes of this fabric domain (of any of its
        cliques for a domain in `multi_clique`), so two jobs never
        hold each other's nodes half-admitted; when a gang has waited longer than the gang
        timeout, all its held claims are released (conflict) together, so the nodes go back to
        the pool and the job is placed again as a whole. Returns (admit, timed out: claim
        key -> what happens to its gang next, placement.failed)."""
        d = self.d
        admit: list[str] = []
        timed_out: dict[str, str] = {}
        for key in keys:
            claim = by_key[key]
            want = self._want(claim)
            if want <= 1:
                admit.append(key)
                continue
            # The nodes held for the domain in this fabric domain (held = a claim of the
            # domain is allocated there and fits; this node was just decided).
            uid = domain_uid(claim)
            spans = uid in multi_clique
            members = {
                n
                for n in d.ownership.nodes_of(uid)
                if spans or node_fabric(d.nodes.get(n) or {}) == fabric
            }
            gang = (uid, ALL_CLIQUES if spans else fabric)
            if len(members) >= want:
                d.ownership.gang_done(key, gang)
                admit.append(key)
                for n in members - {node}:  # their held claims can go too
                    d.enqueue_node(n)
                continue
            left = d.ownership.gang_hold(
                key, gang, d.gang_timeout_seconds, allocated_at=allocated_at(claim)
            )
            if left is None:
                # Placed again without the nodes that failed it (or kept where its pods'
                # claims can only go); a multi-clique gang is never placed.
                timed_out[key] = "" if spans else d.placement.failed(uid, fabric, members)
                for n in members - {node}:  # the whole gang is released, not just this one
                    d.enqueue_node(n)
            else:
                d.enqueue_node_after(node, left + 0.05)
        return admit, timed_out

    def _ensure_slice(self, node: JSON, owner: str, fabric: str) -> None:
        d = self.d
        name = node["metadata"]["name"]
        live = d.slices.get(objects.slice_name(name))
        desired = objects.node_slice(name, node["metadata"]["uid"], owner, fabric, 1)
        if live is None:
            if d.writer.create(SLICES, desired) is not None:
                return
            live = d.rest.get(SLICES, objects.slice_name(name))
        if not objects.differs(desired["spec"]["devices"], live["spec"].get("devices", [])):
            return
        # A new pool generation tells the scheduler the old devices are void.
        desired["spec"]["pool"]["generation"] = int(live["spec"]["pool"]["generation"]) + 1
        desired["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        d.rest.replace(SLICES, objects.slice_name(name), desired)

    def _ensure_node_label(self, node: JSON, owner: str) -> None:
        """The node label drives the domain's DaemonSet and shows the holder in kubectl."""
        current = node["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL)
        want = None if owner == cd.FREE_OWNER else owner
        if current != want:
            self.d.rest.patch(
                NODES, node["metadata"]["name"], {"metadata": {"labels": {cd.DOMAIN_LABEL: want}}}
            )

    def _answer(self, claim: JSON, node: str, condition: str, reason: str, message: str) -> None:
        """Set the binding (or binding-failure) condition on the claim's channel result.

        Server-side apply with our own field manager: `status.devices` has no patch strategy
        (a strategic-merge or merge patch replaces the whole list), while an apply states
        only the entries this manager owns, so other drivers' entries stay. The
        resourceVersion makes it conditional: an allocation changed meanwhile is not
        answered from an old view."""
        results = claim["status"]["allocation"]["devices"]["results"]
        entries = []
        existing = {dev_key(d): d for d in claim["status"].get("devices", []) or []}
        for r in results:
            if r.get("driver") != cd.DRIVER:
                continue
            entry: JSON = {k: r[k] for k in ("driver", "pool", "device") if k in r}
            if r.get("shareID"):
                entry["shareID"] = r["shareID"]
            before = existing.get(dev_key(r), {}).get("conditions", []) or []
            conds = [dict(cond) for cond in before if cond.get("type") != condition]
            if r.get("device") == cd.CHANNEL_DEVICE and r.get("pool") == node:
                conds.append(
                    patches.condition(condition, "True", reason, message[:1024], now=now())
                )
            entry["conditions"] = conds
            entries.append(entry)
        meta = claim["metadata"]
        body = patches.conditional(
            meta["resourceVersion"],
            {
                "apiVersion": CLAIMS.api_version,
                "kind": "ResourceClaim",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "status": {"devices": entries},
            },
        )
        try:
            self.d.rest.apply(
                CLAIMS,
                meta["name"],
                body,
                meta["namespace"],
                field_manager=FIELD_MANAGER,
                sub="status",
            )
        except (Conflict, NotFound):  # the claim changed meanwhile; its event requeues
            self.d.enqueue_node_after(node, 0.1)

    def _conflict_event(self, claim: JSON, why: str) -> None:
        key = self.d.ownership.key_of(domain_uid(claim))
        obj = self.d.domains.get(key) if key else None
        if obj is not None:  # from its metadata: also a domain this controller cannot read
            self.d.writer.domain_event(
                obj["metadata"],
                Event("Warning", "NodeConflict", f"claim {claim['metadata']['name']}: {why}"),
            )
