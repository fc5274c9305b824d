"""The domain reconciler (`namespace/name` keys): finalizer, IMEX channel, claim templates,
DaemonSet, status. Every write is idempotent and checked against what exists, and the status
write is conditional on the resourceVersion it was computed from, so a view from a stale
cache is refused (409) instead of written back."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections import Counter
from importlib.metadata import version

from pydantic import ValidationError

from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.fabriccheck import MeasuredLoss
from fabricdra.api.jsontypes import JSON
from fabricdra.kube.informer import key_of
from fabricdra.kube.patches import condition, conditional
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    COMPUTE_DOMAINS,
    DAEMON_SETS,
    JSON_PATCH,
    Conflict,
    Kind,
    NotFound,
)

from . import capacity, channels, fabricloss, metrics, objects, records, status, workloads
from .claims import (
    channel_of,
    claim_nodes,
    dev_key,
    domain_uid,
    node_addresses,
    node_fabric,
    node_ip,
    results,
)
from .deps import Cache, DomainDeps
from .indexes import BY_DOMAIN, BY_FABRIC, BY_NODE
from .placement import FINISHED, Placed, is_gang
from .writes import now

log = logging.getLogger("fabricdra.controller")
# Ready's reason (and the Warning Event's) for a ComputeDomain this controller cannot read.
UNREADABLE = "Unreadable"
# Ready's reason while a domain's claim template waits for a pod to show its PodGroup.
WAITING_FOR_PODS = "WaitingForPods"


class NotOurs(Exception):
    """An object the controller would create exists and carries another owner's label."""


class DomainReconciler:
    def __init__(self, deps: DomainDeps) -> None:
        self.d = deps
        # (domain uid, node, ip) of foreign report IPs already announced: one event each.
        self._foreign_ips: set[tuple[str, str, str]] = set()

    def reconcile(self, key: str) -> None:
        d = self.d
        obj = d.domains.get(key)
        if obj is None:
            return
        if obj["metadata"].get("deletionTimestamp"):
            # From the object as stored: deletion cleans up also after a domain this
            # controller cannot read.
            self._finalize(obj)
            return
        try:
            domain = ComputeDomain.model_validate(obj)
        except ValidationError as e:
            self._unreadable(obj, key, e)
            return
        if cd.FINALIZER not in domain.metadata.get("finalizers", []):
            # Go on from the version the patch returned: every later write is conditional.
            domain = self._add_finalizer(domain)
        try:
            channel: int | None = self._ensure_channel(domain, key)
        except channels.ChannelsExhausted as e:
            channel = None
            ready, reason, message = False, "ChannelsExhausted", str(e)
        else:
            assert channel is not None
            # A gang is placed before its workload template exists, so every claim made from
            # the template is pinned to the gang's fabric domain (placement.py).
            grouped, hold = self._record_group(domain, key)
            if grouped is None:
                return  # not recorded: placement may not count on it yet
            domain = grouped
            placed = d.placement.place(domain, key)
            recorded = self._record(domain, key, channel, placed.fabric, placed.plan)
            if recorded is None:
                return  # not recorded: nothing may be made from the decisions yet
            domain = recorded
            ready, reason, message = self._ensure_objects(domain, channel, placed, hold)
        self._update_status(domain, key, ready, reason, message, channel)
        self._count_domains()

    def _unreadable(self, obj: JSON, key: str, error: ValidationError) -> None:
        """A ComputeDomain this controller's model refuses: the API server's CRD admitted it,
        so it is newer than this controller (a field or value a newer release's CRD allows,
        left after a rollback), never the user's typo. Nothing is decided for it (whatever it
        holds stays held: its channel in its status, its nodes by their claims); Ready says
        why, with a Warning Event when that is first said. Deletion still cleans up
        (`_finalize` reads the stored object, not the model)."""
        fields = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(object)'}: {err['msg']}"
            for err in error.errors()[:5]
        )
        why = (
            f"fabricdra {version('fabricdra')} cannot read this ComputeDomain ({fields}): it was "
            "written for a newer fabricdra (a rollback?). Nothing is handed out or changed for "
            "it until a controller that reads it runs; deleting it still removes its objects"
        )
        log.error("ComputeDomain %s: %s", key, why)
        meta = obj["metadata"]
        conditions = list((obj.get("status") or {}).get("conditions") or [])
        ready = next((c for c in conditions if c.get("type") == cd.READY), None)
        if (
            ready is not None
            and ready.get("status") == "False"
            and ready.get("reason") == UNREADABLE
            and ready.get("message") == why
        ):
            return  # said already: nothing rewritten
        new = condition(cd.READY, "False", UNREADABLE, why, now=now())
        conditions = [c for c in conditions if c.get("type") != cd.READY] + [new]
        patch = conditional(meta["resourceVersion"], {"status": {"conditions": conditions}})
        try:
            self.d.rest.patch(COMPUTE_DOMAINS, meta["name"], patch, meta["namespace"], sub="status")
        except (Conflict, NotFound):  # changed meanwhile: its event queues it again
            self.d.requeue_after(key, 0.1)
            return
        self.d.writer.domain_event(meta, status.Event("Warning", UNREADABLE, why))

    def _count_domains(self) -> None:
        counts = {"True": 0, "False": 0, "Unknown": 0}
        for obj in self.d.domains.items():
            conds = obj.get("status", {}).get("conditions", []) or []
            ready = next((c.get("status") for c in conds if c.get("type") == cd.READY), None)
            counts[ready if ready in counts else "Unknown"] += 1
        for value, n in counts.items():
            metrics.DOMAINS.labels(value).set(n)

    def _add_finalizer(self, domain: ComputeDomain) -> ComputeDomain:
        finalizers = [*domain.metadata.get("finalizers", []), cd.FINALIZER]
        # Conditional: a merge patch replaces the list whole.
        patch = conditional(
            domain.metadata["resourceVersion"], {"metadata": {"finalizers": finalizers}}
        )
        out = self.d.rest.patch(COMPUTE_DOMAINS, domain.name, patch, domain.namespace)
        return ComputeDomain.model_validate(out)

    def held_channels(self) -> list[int]:
        """Channels no new domain may take: those recorded in live domains' statuses, and
        those still carried by an allocated claim (its domain may be gone, its pods not)."""
        held = [
            ch
            for o in self.d.domains.items()
            for ch in o.get("status", {}).get("channels", []) or []
        ]
        for claim in self.d.claims.items():
            ch = channel_of(claim)
            if ch is not None:
                held.append(ch)
        return held

    def _ensure_channel(self, domain: ComputeDomain, key: str) -> int:
        """The domain's channel: the recorded one, else the lowest free id, reserved in memory
        (so parallel workers never pick the same id) until the cache shows the status write
        that records it, which precedes any object carrying it (`_record`)."""
        own = self.d.ownership
        if domain.status.channels:
            own.recorded(domain.uid)
            own.no_longer_waiting(key)
            return domain.status.channels[0]
        return own.channel_for(domain.uid, key, self.held_channels, self.d.channel_count)

    def _ensure(self, kind: Kind, desired: JSON, cache: Cache) -> None:
        rest = self.d.rest
        meta = desired["metadata"]
        ns = meta.get("namespace")
        live = cache.get(f"{ns}/{meta['name']}" if ns else meta["name"])
        if live is None and self.d.writer.create(kind, desired, ns) is not None:
            return
        if live is None:
            live = rest.get(kind, meta["name"], ns)
        mine = desired["metadata"]["labels"][cd.DOMAIN_LABEL]
        if live["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL) != mine:
            raise NotOurs(f"{kind.plural}/{meta['name']} exists and belongs to something else")
        if objects.differs(desired, live):
            if kind is CLAIM_TEMPLATES:  # spec is immutable: replace it
                rest.delete(kind, meta["name"], ns)
                self.d.writer.create(kind, desired, ns)
            else:
                rest.patch(kind, meta["name"], desired, ns)

    def _finished(self, domain: ComputeDomain) -> bool:
        """A gang that ran (it held all its numNodes nodes, or was Ready: seen by this
        controller) and holds nothing now, no node and no allocated claim: its pods completed
        (kube-controller-manager deallocates, or deletes, a finished pod's claims) or were
        deleted. Recorded as Ready's
        reason `Finished` (so a restarted controller knows it too; one restarted between the
        run and the end does not, and the placement keeps counting, as before); claims
        allocated again (the job restarted) end it."""
        if not is_gang(domain):
            return False
        placement, held = self.d.placement, self.d.ownership.nodes_of(domain.uid)
        ready = next((c for c in domain.status.conditions if c.type == cd.READY), None)
        if len(held) >= (domain.num_nodes or 1) or (ready is not None and ready.status == "True"):
            # It ran. Remembered: its pods complete one by one, and Ready drops on the first.
            placement.ran(domain.uid)
        if held or self._has_allocated_claims(domain):
            return False
        return placement.has_run(domain.uid) or (ready is not None and ready.reason == FINISHED)

    def _has_allocated_claims(self, domain: ComputeDomain) -> bool:
        return any(
            domain_uid(cl) == domain.uid
            and cl["metadata"]["namespace"] == domain.namespace
            and claim_nodes(cl)
            for cl in self.d.claims.by_index(BY_DOMAIN, domain.uid)
        )

    def _pin(self, domain: ComputeDomain) -> str | list[str] | None:
        """The fabric domain the workload template is restricted to: a gang's placement
        (placement.py; it lasts as long as the domain), else the one fixed by the first
        admission, while the domain holds a node or an allocated claim. None: unpinned
        (never pinned, pinned to nodes without a fabric, or holding nothing any more)."""
        own = self.d.ownership
        if domain.spec.spans and domain.status.placement is not None:
            # A spanning gang: to the fabric domains of its recorded placement (hierarchy.py).
            return sorted(s.fabricDomain for s in domain.status.placement.shares)
        if domain.spec.allowMultipleCliques:  # takes nodes of any clique: never steered to one
            return None
        pinned = own.pin_of(domain.uid)
        if pinned is None:
            pinned = domain.status.fabricDomain
        if not pinned:
            return None
        if is_gang(domain):
            return pinned
        if not own.nodes_of(domain.uid) and not self._has_allocated_claims(domain):
            own.unpin(domain.uid)
            return None
        return pinned

    def _record(
        self,
        domain: ComputeDomain,
        key: str,
        channel: int,
        fabric: str | None,
        plan: JSON | None = None,
    ) -> ComputeDomain | None:
        """Write the domain's channel and a gang's placement into its status before any
        object is made from them (records.py): a controller killed after creating the claim
        template but before recording what it carries would, restarted, decide again from
        the status and hand the domain another channel or fabric domain than its running
        pods' claims hold. Returns the domain as recorded (the patch's answer, so the rest
        of the pass writes conditionally on it), or None when the write met a conflict (the
        key is retried)."""
        patch = records.decisions_patch(
            domain.status.model_dump(mode="json"),
            domain.metadata["resourceVersion"],
            channel,
            fabric,
            plan,
        )
        if patch is None:
            return domain
        try:
            out = self.d.rest.patch(
                COMPUTE_DOMAINS, domain.name, patch, domain.namespace, sub="status"
            )
        except Conflict:
            log.info("status of %s changed meanwhile; recording its decisions again", key)
            self.d.requeue_after(key, 0.1)
            return None
        return ComputeDomain.model_validate(out)

    def _record_group(self, domain: ComputeDomain, key: str) -> tuple[ComputeDomain | None, str]:
        """A domain without numNodes whose pods belong to a gang PodGroup (workloads.py): the
        group's size and topology constraint are written into `status.podGroup` before the
        gang is placed by them (every reader of the gang size, nodes.py's admission too, reads
        the domain's status). A recorded group is not replaced while the domain holds nodes
        (its running gang was admitted by it). Returns the domain as recorded (None when the
        write met a conflict: the key is retried), and why its workload claim template is
        held back ("" when it is not): until a pod naming the template shows whether the pods
        are in a gang, claims made from an unplaced template could not follow the gang's
        placement (a claim's spec never changes)."""
        d = self.d
        if d.pods is None or d.podgroups is None or domain.spec.numNodes is not None:
            return domain, ""
        template = domain.spec.channel.resourceClaimTemplate.name
        pods = d.pods.by_index(workloads.BY_TEMPLATE, f"{domain.namespace}/{template}")
        group, why = workloads.group_of(domain.namespace, template, pods, d.podgroups.get)
        hold = ""
        current = domain.status.podGroup
        if current is None and d.templates.get(f"{domain.namespace}/{template}") is None:
            if not pods:
                hold = (
                    f"no pod names claim template {template} yet; the Workload API is read, "
                    "so the template is created once the first pod shows whether the domain's "
                    "pods belong to a gang PodGroup (whose minCount is then the gang size)"
                )
            elif group is None and why.endswith(workloads.MISSING):
                hold = f"{why}; the claim template is created once it does"
        if why and not hold:
            log.info("ComputeDomain %s: no gang size from the Workload API: %s", key, why)
        if group is None or (current is not None and current.model_dump() == group.status()):
            return domain, hold
        if current is not None and d.ownership.nodes_of(domain.uid):
            return domain, ""
        patch = conditional(
            domain.metadata["resourceVersion"], {"status": {"podGroup": group.status()}}
        )
        try:
            out = d.rest.patch(COMPUTE_DOMAINS, domain.name, patch, domain.namespace, sub="status")
        except Conflict:
            d.requeue_after(key, 0.1)
            return None, ""
        log.info(
            "ComputeDomain %s takes its gang size %d from PodGroup %s%s",
            key,
            group.min_count,
            group.name,
            f" (topology constraint {group.topology_key})" if group.topology_key else "",
        )
        return ComputeDomain.model_validate(out), ""

    def _ensure_objects(
        self, domain: ComputeDomain, channel: int, placed: Placed, hold: str = ""
    ) -> tuple[bool, str, str]:
        """Returns (ready, Ready's reason while not, message). A gang that fits nowhere now
        gets no workload template yet (its pods wait for their claims), nor a domain whose
        template is held until its pods show their PodGroup (`hold`, _record_group)."""
        d = self.d
        try:
            if not placed.waiting and not hold:  # else no template yet; Ready says why
                rct = objects.workload_claim_template(domain, channel, self._pin(domain))
                self._ensure(CLAIM_TEMPLATES, rct, d.templates)
            if domain.spec.imexMode == "managed":
                settings = d.daemon
                self._ensure(
                    CLAIM_TEMPLATES, objects.daemon_claim_template(domain, settings), d.templates
                )
                self._ensure(DAEMON_SETS, objects.daemon_set(domain, settings), d.daemonsets)
        except NotOurs as e:
            # Never take over or delete an object we did not create: say so in the status.
            return (
                False,
                "CreatingObjects",
                f"{e}; choose another spec.channel.resourceClaimTemplate.name",
            )
        if hold:
            return False, WAITING_FOR_PODS, hold
        if placed.waiting:
            return False, "WaitingForFabric", placed.waiting
        return True, "CreatingObjects", "claim templates created"

    def _measured_loss(self, domain: ComputeDomain) -> MeasuredLoss | None:
        """A spanning gang's: the newest the fabric check recorded on the Nodes of the fabric
        domains it is placed in (fabricloss.py). Read at each reconcile of the domain: a new
        measurement shows at its next one (an event of the domain, or the resync)."""
        placed = domain.status.placement
        if placed is None:
            return None
        fabrics = [s.fabricDomain for s in placed.shares]
        nodes = [n for f in fabrics for n in self.d.nodes.by_index(BY_FABRIC, f)]
        return fabricloss.for_fabrics(fabrics, nodes)

    def _held_nodes(self, domain: ComputeDomain) -> list[status.HeldNode]:
        out = []
        for node in self.d.ownership.nodes_of(domain.uid):
            ip, fabric, moved_to = self._node_facts(domain, node)
            out.append(status.HeldNode(node, ip, fabric, moved_to))
        return out

    def _node_facts(self, domain: ComputeDomain, node: str) -> tuple[str, str, str | None]:
        """A held node's (IP, fabric domain, the clique its label names now if it moved).
        From its Node, else, while the Node (or its plugin label) is gone and a claim still
        holds it, from its row (the node did not leave its clique by disappearing from our
        view; its row and index stay). A node whose row names a clique and whose fabric
        label now names another (re-cabled, tray swapped) keeps its row too, while it is
        held: its workload's IMEX ensemble was formed there, and moving the row would shrink
        both cliques' peer lists under the running job (docs/compute-domains.md, "What
        survives what"); once its claims are released it leaves and may join anew."""
        obj = self.d.nodes.get(node)
        row = next((r for r in domain.status.nodes if r.name == node), None)
        if obj is None:
            return (row.ipAddress, row.fabricDomain, None) if row is not None else ("", "", None)
        fabric = node_fabric(obj)
        if row is not None and row.fabricDomain and row.fabricDomain != fabric:
            return node_ip(obj), row.fabricDomain, fabric
        return node_ip(obj), fabric, None

    def _reports(self, uid: str, host_mode: bool) -> tuple[dict[str, status.DaemonReport], float]:
        """Managed mode: the domain's daemons' reports. Host mode: the node plugins' reports
        on their host's IMEX service (label value cd.HOST_REPORT). Also: seconds until the
        next heartbeat is due (to look again then), or 0 if none is."""
        out = {}
        want = cd.HOST_REPORT if host_mode else uid
        due: list[float] = []
        if host_mode:  # the host reports of the nodes the domain holds, not of every node
            leases = [
                lease
                for node in self.d.ownership.nodes_of(uid)
                for lease in self.d.leases.by_index(BY_NODE, node)
            ]
        else:
            leases = self.d.leases.by_index(BY_DOMAIN, uid)
        for lease in leases:
            meta = lease["metadata"]
            if meta.get("labels", {}).get(cd.DOMAIN_LABEL) != want:
                continue
            ann = meta.get("annotations", {})
            node = ann.get(cd.REPORT_NODE) or lease.get("spec", {}).get("holderIdentity", "")
            lease_key = key_of(lease)
            late = self.d.heartbeats.overdue(lease_key)
            if late is not None:
                out[node] = status.DaemonReport(
                    False,
                    f"no heartbeat for {late + _duration(lease):.0f}s "
                    f"(Lease {meta['name']}); last report: {ann.get(cd.REPORT_MESSAGE, '')}",
                    ann.get(cd.REPORT_IP, ""),
                    silent=True,
                )
                continue
            left = self.d.heartbeats.due_in(lease_key)
            if left is not None:
                due.append(left)
            out[node] = status.DaemonReport(
                ann.get(cd.REPORT_READY) == "true",
                ann.get(cd.REPORT_MESSAGE, ""),
                ann.get(cd.REPORT_IP, ""),
            )
        return out, min(due, default=0.0)

    def _own_ips(
        self, domain: ComputeDomain, reports: dict[str, status.DaemonReport]
    ) -> dict[str, status.DaemonReport]:
        """A report's IP is taken only if it is one of its Node's addresses: a compromised
        node must not redirect another node's IMEX peer address (its own node's address is
        used instead; issue 19)."""
        out = {}
        for node, report in reports.items():
            obj = self.d.nodes.get(node)
            if report.ip and report.ip not in node_addresses(obj):
                seen = (domain.uid, node, report.ip)
                if seen not in self._foreign_ips:  # said once, not on every reconcile
                    self._foreign_ips.add(seen)
                    log.warning(
                        "ignoring the IP %s in node %s's report for domain %s: not one of the "
                        "Node's addresses",
                        report.ip,
                        node,
                        domain.uid,
                    )
                    message = (
                        f"node {node} reported the IMEX address {report.ip}, which is not one "
                        "of its Node's addresses (status.addresses); ignored"
                    )
                    self.d.writer.event(domain, status.Event("Warning", "ForeignReportIP", message))
                report = dataclasses.replace(report, ip="")
            out[node] = report
        return out

    def _fabric_conflicts(self, domain: ComputeDomain) -> list[str]:
        """Claims of the domain allocated on a node outside the domain's fabric domain (the
        scheduler placed them before the pin was visible; their binding was refused)."""
        if domain.spec.allowMultipleCliques:
            return []
        pinned = self.d.ownership.pin_of(domain.uid)
        if pinned is None:
            pinned = domain.status.fabricDomain or None
        if pinned is None:
            return []
        out = []
        for claim in self.d.claims.by_index(BY_DOMAIN, domain.uid):
            meta = claim["metadata"]
            if domain_uid(claim) != domain.uid or meta["namespace"] != domain.namespace:
                continue
            for node in sorted(claim_nodes(claim)):
                fabric = self._node_facts(domain, node)[1]
                if fabric != pinned:
                    out.append(
                        f"claim {meta['name']} was allocated on node {node} in fabric domain "
                        f"{fabric or '(none)'}, but the domain is in {pinned or '(none)'}"
                    )
        return sorted(out)

    def _fabric_check_refused(self, domain: ComputeDomain) -> list[str]:
        """Claims of the domain refused at binding on a node whose fabric domain failed its
        multi-node NVLink check (nodes.py), with why, while they are still allocated there."""
        out = []
        for claim in self.d.claims.by_index(BY_DOMAIN, domain.uid):
            meta = claim["metadata"]
            if domain_uid(claim) != domain.uid or meta["namespace"] != domain.namespace:
                continue
            allocated = {dev_key(r) for r in results(claim)}
            for dev in (claim.get("status") or {}).get("devices") or []:
                if dev_key(dev) not in allocated:
                    continue
                for c in dev.get("conditions") or []:
                    if (
                        c.get("type") == cd.CONFLICT_CONDITION
                        and c.get("reason") == capacity.FABRIC_CHECK_FAILED
                    ):
                        out.append(f"claim {meta['name']}: {c.get('message', '')}")
        return sorted(out)

    def _too_large(self, domain: ComputeDomain) -> str:
        """numNodes is limited by the fabric, not by a constant (status.too_large), counted
        from the nodes carrying a fabricdra.io/fabric.domain label."""
        sizes = Counter(self.d.nodes.index_values(BY_FABRIC))
        return status.too_large(
            domain.num_nodes,
            sizes,
            pinned=self.d.ownership.pin_of(domain.uid) or domain.status.fabricDomain,
            multi_clique=domain.spec.allowMultipleCliques,
        )

    def _update_status(
        self,
        domain: ComputeDomain,
        key: str,
        ready: bool,
        reason: str,
        message: str,
        channel: int | None,
    ) -> None:
        # The channel is recorded before this write (`_record`); None: none was free.
        domain = domain.model_copy(deep=True)
        recorded = list(domain.status.channels)
        domain.status.channels = recorded or ([channel] if channel is not None else [])
        reports, next_due = self._reports(domain.uid, domain.spec.imexMode == "host")
        reports = self._own_ips(domain, reports)
        observed = status.Observed(
            ready,
            message,
            self._held_nodes(domain),
            reports,
            fabric_conflicts=self._fabric_conflicts(domain),
            fabric_check_refused=self._fabric_check_refused(domain),
            objects_reason=reason,
            unpin=self.d.ownership.pin_of(domain.uid) is None
            and not self._has_allocated_claims(domain),
            placed=self.d.ownership.pin_of(domain.uid) if is_gang(domain) else None,
            too_large=self._too_large(domain),
            finished=self._finished(domain),
            gang_timeout=self.d.placement.timed_out(domain.uid) if is_gang(domain) else "",
            measured_loss=self._measured_loss(domain),
        )
        new, events = status.compute(domain, observed, now())
        if not recorded:
            domain.status.channels = []
        patch = status.status_patch(domain.status, new)
        if next_due > 0:  # look again when a heartbeat falls due
            self.d.requeue_after(key, next_due + 0.05)
        if patch is None:
            return
        # Conditional on the version this view was computed from: a stale cache gets a 409
        # (the watch then delivers the newer object, which queues this key again).
        patch = conditional(domain.metadata["resourceVersion"], patch)
        try:
            self.d.rest.patch(COMPUTE_DOMAINS, domain.name, patch, domain.namespace, sub="status")
        except Conflict:
            log.info("status of %s changed meanwhile; recomputing", key)
            self.d.requeue_after(key, 0.1)
            return
        for ev in events:
            self.d.writer.event(domain, ev)

    def _finalize(self, obj: JSON) -> None:
        """Delete in order: workload claim template, daemon objects; then drop the finalizer.
        Each step is checked against the API, so a crash between steps resumes here. From
        the stored object, not the model: a domain this controller cannot read (`_unreadable`)
        is cleaned up too."""
        d = self.d
        meta = obj["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], str(meta.get("uid", ""))
        if cd.FINALIZER not in meta.get("finalizers", []):
            return
        remaining = []
        for rct in self._workload_templates(obj):
            if rct["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL) == uid:
                d.rest.delete(CLAIM_TEMPLATES, rct["metadata"]["name"], namespace)
                remaining.append(f"ResourceClaimTemplate {rct['metadata']['name']}")
        ns = d.namespace
        for kind in (DAEMON_SETS, CLAIM_TEMPLATES):
            listing = d.rest.list(kind, ns, label_selector=f"{cd.DOMAIN_LABEL}={uid}")
            for item in listing.get("items", []):
                if not item["metadata"].get("deletionTimestamp"):
                    d.rest.delete(kind, item["metadata"]["name"], ns)
                remaining.append(f"{kind.plural}/{item['metadata']['name']}")
        if remaining:
            # Deletion was requested; come back to check it happened before letting go.
            d.requeue_after(f"{namespace}/{name}", 0.2)
            return
        finalizers = [f for f in meta.get("finalizers", []) if f != cd.FINALIZER]
        idx = meta["finalizers"].index(cd.FINALIZER)
        patch = [
            {"op": "test", "path": f"/metadata/finalizers/{idx}", "value": cd.FINALIZER},
            {"op": "replace", "path": "/metadata/finalizers", "value": finalizers},
        ]
        with contextlib.suppress(NotFound):  # already gone
            d.rest.patch(COMPUTE_DOMAINS, name, patch, namespace, content_type=JSON_PATCH)
        d.ownership.forget_domain(uid)
        d.placement.forget(f"{namespace}/{name}", uid)

    def _workload_templates(self, obj: JSON) -> list[JSON]:
        """The domain's workload claim template(s) in its namespace: the one its spec names,
        or, when the spec does not say in a way this controller reads, those carrying its
        UID label."""
        meta = obj["metadata"]
        spec, channel = obj.get("spec"), None
        if isinstance(spec, dict):
            channel = spec.get("channel")
        ref = channel.get("resourceClaimTemplate") if isinstance(channel, dict) else None
        rct = ref.get("name") if isinstance(ref, dict) else None
        if isinstance(rct, str) and rct:
            live = self.d.writer.get(CLAIM_TEMPLATES, rct, meta["namespace"])
            return [live] if live is not None else []
        selector = f"{cd.DOMAIN_LABEL}={meta.get('uid', '')}"
        listing = self.d.rest.list(CLAIM_TEMPLATES, meta["namespace"], label_selector=selector)
        return list(listing.get("items", []))


def _duration(lease: JSON) -> float:
    return float((lease.get("spec") or {}).get("leaseDurationSeconds") or 0)
