"""The ComputeDomain controller: wiring and lifecycle.

Two kinds of work, each keyed so a key is handled by one worker at a time:
- domain keys (`namespace/name`), domains.py: finalizer, channel id, claim templates,
  DaemonSet, status;
- node keys (node name), nodes.py: the node's ResourceSlice and who holds the node
  (admission of workload claims at binding time). Node keys go through one worker so
  ownership decisions are made one after the other, never concurrently.

The in-memory ownership state has one owner (ownership.py, one lock); every write goes through
one counting REST layer (writes.py). Informers start at once, leader or not, so a standby's
caches are warm when it takes over; workers start only while leading and only once every
cache has synced, and no reconcile decides from an unsynced cache (`require_synced`).

Every step is idempotent and reads what exists before writing, so a controller killed at any
point resumes from the API's state on restart: nothing is recorded only in memory.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.api import labels as node_labels
from fabricdra.api.jsontypes import JSON
from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.kube.informer import Informer, key_of, without_managed_fields
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    CONFIG_MAPS,
    DAEMON_SETS,
    LEASES,
    NODE_DEVICES,
    NODES,
    PODS,
    SLICES,
    ApiError,
)

from . import capacity, channels, metrics, objects, workloads
from .claims import (
    claim_nodes,
    claim_view,
    device_nodes,
    domain_uid,
    is_domain_claim,
    node_fabric,
    report_node,
)
from .deps import DomainDeps, FabricCheckDeps, NodeDeps, PlacementDeps
from .domains import DomainReconciler, NotOurs
from .fabriccheck import FabricCheck, Runner, node_devices_view
from .fabriccheckrun import KubeRunner, RunSettings
from .indexes import BY_DOMAIN, BY_FABRIC, BY_NODE, BY_UID
from .leader import LeaderElector
from .liveness import Heartbeats
from .nodes import NodeReconciler, admitted_domains
from .ownership import Ownership
from .placement import Placement, finished
from .records import NotRecorded
from .tierlabels import DUMP_LABEL, TREE, InputUnreadable, TierDeps, TierLabels
from .tierlabels import node_view as tier_node_view
from .workqueue import WorkQueue
from .writes import Writer, counting_rest

__all__ = ["Controller", "ControllerConfig", "NotOurs", "NotSynced"]

log = logging.getLogger("fabricdra.controller")
USER_AGENT = "fabricdra-controller/0.2.0"


def _domain_label(obj: JSON) -> list[str]:
    return [str(obj["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL, ""))]


def only_renewed(old: JSON | None, new: JSON | None) -> bool:
    """A Lease event that is a heartbeat and nothing else: only `spec.renewTime` (and the
    object's version) changed; its report (annotations), labels and promise are the same."""
    if old is None or new is None:
        return False

    def rest_of(lease: JSON) -> tuple[Any, Any, Any]:
        meta = {k: v for k, v in lease["metadata"].items() if k != "resourceVersion"}
        spec = {k: v for k, v in (lease.get("spec") or {}).items() if k != "renewTime"}
        return meta, spec, {k: v for k, v in lease.items() if k not in ("metadata", "spec")}

    return rest_of(old) == rest_of(new)


def placement_facts(node: JSON | None) -> tuple[str, ...] | None:
    """What gang placement reads of a Node (capacity.unusable, its fabric label, its
    verification and fabric-check labels, its NoSchedule/NoExecute taints (podfit.py) and
    switch-tier labels (hierarchy.py)): a Node event that changes none of it (our own
    holder label, a status heartbeat) cannot make room or take it away."""
    if node is None:
        return None
    labels_ = node["metadata"].get("labels", {})
    why = capacity.unusable(node) or "usable"
    taints = sorted(
        f"{t.get('key')}={t.get('value') or ''}:{t.get('effect')}"
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )
    return (
        why,
        node_fabric(node),
        str(labels_.get(node_labels.VERIFIED, "")),
        str(labels_.get(node_labels.FABRIC_VERIFIED, "")),
        ",".join(taints),
        *(str(labels_.get(tier, "")) for tier in TIER_LABELS),
    )


def fabric_facts(node: JSON | None) -> tuple[object, ...] | None:
    """What the fabric check reads of a Node: what placement reads, and its check record."""
    facts = placement_facts(node)
    if node is None or facts is None:
        return None
    annotations = node["metadata"].get("annotations") or {}
    return (*facts, annotations.get(node_labels.FABRIC_CHECK, ""))


def _nics(node_devices: JSON | None) -> object:
    return ((node_devices or {}).get("spec") or {}).get("interfaces")


def _verification(node_devices: JSON | None) -> object:
    return ((node_devices or {}).get("status") or {}).get("verification")


class NotSynced(Exception):
    """A cache has not finished its first LIST: deciding now could act on an empty view."""


@dataclass(frozen=True)
class ControllerConfig:
    namespace: str = "fabricdra-system"  # the driver's namespace (daemons, leases)
    daemon: objects.DaemonSettings = field(default_factory=objects.DaemonSettings)
    domain_workers: int = 4
    resync_seconds: float = 300.0
    leader_election: bool = True
    lease_name: str = "fabricdra-compute-domain-controller"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    install_device_classes: bool = True
    lease_seconds: float = 15.0  # leader Lease duration; renew deadline is 2/3 of it
    channel_count: int = cd.CHANNEL_COUNT  # the nvidia driver's NVreg_ImexChannelCount
    gang_timeout_seconds: float = 300.0  # numNodes domains: how long a partial gang is held
    # Gang placement counts only nodes the verification gate passed (capacity.py).
    require_verified_nodes: bool = False
    # The multi-node NVLink check per fabric domain (fabriccheck.py), and gang placement
    # counting a fabric domain's nodes only once it passed with them.
    fabric_check: bool = False
    fabric_run: RunSettings = field(default_factory=RunSettings)  # its namespace: `namespace`
    # How many fabric domains are checked at once (one worker each; a check runs for minutes
    # and a rack's key is never in two workers: workqueue.py).
    fabric_check_concurrency: int = 16
    # After a passed check, the measured loss (fabricloss.py): the all-reduce in one NVLink
    # domain and split across two, shown in spanning ComputeDomains' status.
    fabric_check_loss: bool = False
    # Read the Workload API's PodGroups and pods (workloads.py): only where the API server
    # serves them (the CLI's --workload-api decides).
    workload_api: bool = False
    # The scale-out tier labels and cabling check (tierlabels.py): off unless asked for.
    scale_out_tiers: bool = False
    topology_file: str = ""  # the operator's topology file (a mounted ConfigMap), "" for none


class Controller:
    def __init__(
        self,
        api_client: Any,
        config: ControllerConfig | None = None,
        *,
        fabric_runner: Runner | None = None,
    ) -> None:
        """`fabric_runner`: how the fabric check runs (default: in the cluster,
        fabriccheckrun.KubeRunner); only with `config.fabric_check`."""
        self.config = config or ControllerConfig()
        api_client.user_agent = USER_AGENT
        self.rest = counting_rest(api_client)
        self.writer = Writer(self.rest, self.config.identity)
        self._build_informers()
        self._build_optional_informers()
        # A resync's keys go after events' but none waits past a quarter of the period, so a
        # sweep still ends within it (workqueue.py).
        self.domain_queue = WorkQueue(resync_max_wait=self.config.resync_seconds / 4)
        self.node_queue = WorkQueue(resync_max_wait=self.config.resync_seconds / 4)
        # Fabric domains to check (fabriccheck.py): `fabric_check_concurrency` workers.
        self.fabric_queue = WorkQueue(resync_max_wait=self.config.resync_seconds / 4)
        self.tier_queue = WorkQueue(resync_max_wait=self.config.resync_seconds / 4)
        self.ownership = Ownership()
        self.heartbeats = Heartbeats()
        self._build_reconcilers()
        self.fabric_check: FabricCheck | None = None
        self.tier_labels: TierLabels | None = None
        self._build_tier_labels()
        self._build_fabric_check(fabric_runner)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.elector: LeaderElector | None = None
        self._wire()

    # -- composition: the caches, the reconcilers, the optional checks -------------------
    def _informer_opts(self) -> dict[str, Any]:
        # managedFields is nobody's business here: not kept (thousands of Nodes and slices).
        return {"resync": self.config.resync_seconds, "transform": without_managed_fields}

    def _build_informers(self) -> None:
        """The caches every controller keeps, each with the indexes its readers look up."""
        ns, opts = self.config.namespace, self._informer_opts()
        self.domains = Informer(self.rest, COMPUTE_DOMAINS, **opts)
        self.domains.add_index(BY_UID, lambda o: [str(o["metadata"].get("uid", ""))])
        # Every claim, not those with the domain label: the label is the claim owner's to
        # edit, and a claim allocated the domain's devices holds its node and its channel
        # whatever its labels say. Other claims are kept as their names only (claim_view).
        self.claims = Informer(self.rest, CLAIMS, **{**opts, "transform": claim_view})
        self.claims.add_index(BY_NODE, claim_nodes)
        self.claims.add_index(BY_DOMAIN, lambda o: [domain_uid(o)])
        self.nodes = Informer(
            self.rest,
            NODES,
            label_selector=f"{cd.PLUGIN_NODE_LABEL}=true",
            **{**opts, "transform": capacity.node_view},
        )
        self.nodes.add_index(BY_FABRIC, lambda o: [node_fabric(o)])
        self.slices = Informer(self.rest, SLICES, label_selector=f"{cd.TARGET_LABEL}=node", **opts)
        # What gang placement counts as room (capacity.gpu_room): the devices plugin's GPUs and
        # every claim's allocation of them (not only the domains' own claims); by node, so a
        # node's room is computed from its own slices and claims (placement.py).
        self.device_slices = Informer(
            self.rest,
            SLICES,
            field_selector=f"spec.driver={capacity.DRIVER}",
            **{**opts, "transform": capacity.device_slice_view},
        )
        self.device_slices.add_index(BY_NODE, lambda o: [str(o["spec"].get("nodeName") or "")])
        self.allocations = Informer(self.rest, CLAIMS, **opts)
        self.allocations.add_index(BY_NODE, device_nodes)
        self.leases = Informer(
            self.rest, LEASES, namespace=ns, label_selector=cd.DOMAIN_LABEL, **opts
        )
        self.leases.add_index(BY_DOMAIN, _domain_label)
        self.leases.add_index(BY_NODE, lambda o: [report_node(o)])
        self.templates = Informer(
            self.rest, CLAIM_TEMPLATES, label_selector=cd.DOMAIN_LABEL, **opts
        )
        self.daemonsets = Informer(
            self.rest, DAEMON_SETS, namespace=ns, label_selector=cd.DOMAIN_LABEL, **opts
        )
        self._informers = [
            self.domains,
            self.claims,
            self.nodes,
            self.slices,
            self.device_slices,
            self.allocations,
            self.leases,
            self.templates,
            self.daemonsets,
        ]

    def _build_optional_informers(self) -> None:
        """The caches only some configurations read (Workload API, fabric check, tiers)."""
        ns, opts = self.config.namespace, self._informer_opts()
        # The Workload API (workloads.py): pods (kept as their group and claim templates) and
        # PodGroups, where served.
        self.pods: Informer | None = None
        self.podgroups: Informer | None = None
        if self.config.workload_api:
            self.pods = Informer(self.rest, PODS, **{**opts, "transform": workloads.pod_view})
            self.pods.add_index(workloads.BY_TEMPLATE, workloads.pod_templates)
            self.pods.add_index(workloads.BY_GROUP, workloads.pod_group)
            self.podgroups = Informer(self.rest, workloads.PODGROUPS, **opts)
            self._informers += [self.pods, self.podgroups]
        self.domains.add_index(workloads.BY_TEMPLATE, workloads.domain_template)
        self.node_devices: Informer | None = None
        if self.config.fabric_check or self.config.scale_out_tiers:
            # The nodes' hardware fingerprints, for the fabric check's membership.
            self.node_devices = Informer(
                self.rest, NODE_DEVICES, **{**opts, "transform": node_devices_view}
            )
            self._informers.append(self.node_devices)
        self.tier_nodes: Informer | None = None
        self.dumps: Informer | None = None
        if self.config.scale_out_tiers:
            # Every Node, not only the compute-domain plugin's: any node with RDMA NICs has a
            # place in the scale-out tree. Cut down to the labels and annotation it reads.
            self.tier_nodes = Informer(self.rest, NODES, **{**opts, "transform": tier_node_view})
            self.dumps = Informer(
                self.rest, CONFIG_MAPS, namespace=ns, label_selector=DUMP_LABEL, **opts
            )
            self._informers += [self.tier_nodes, self.dumps]

    def _build_reconcilers(self) -> None:
        """Gang placement and the domain and node reconcilers over the caches and queues."""
        # Each gets what it uses, not the Controller (deps.py).
        self.placement = Placement(
            PlacementDeps(
                rest=self.rest,
                domains=self.domains,
                nodes=self.nodes,
                claims=self.claims,
                device_slices=self.device_slices,
                allocations=self.allocations,
                ownership=self.ownership,
                require_verified_nodes=self.config.require_verified_nodes,
                enqueue_domain=self.domain_queue.add,
                require_fabric_verified=self.config.fabric_check,
                fabric_check_state=lambda f: (
                    self.fabric_check.state(f) if self.fabric_check is not None else ""
                ),
            )
        )
        self.domain_reconciler = DomainReconciler(
            DomainDeps(
                rest=self.rest,
                writer=self.writer,
                domains=self.domains,
                claims=self.claims,
                nodes=self.nodes,
                leases=self.leases,
                templates=self.templates,
                daemonsets=self.daemonsets,
                ownership=self.ownership,
                placement=self.placement,
                heartbeats=self.heartbeats,
                namespace=self.config.namespace,
                daemon=self.config.daemon,
                channel_count=self.config.channel_count,
                requeue_after=self.domain_queue.add_after,
                pods=self.pods,
                podgroups=self.podgroups,
            )
        )
        self.node_reconciler = NodeReconciler(
            NodeDeps(
                rest=self.rest,
                writer=self.writer,
                domains=self.domains,
                claims=self.claims,
                nodes=self.nodes,
                slices=self.slices,
                ownership=self.ownership,
                placement=self.placement,
                gang_timeout_seconds=self.config.gang_timeout_seconds,
                require_synced=self.require_synced,
                enqueue_domain=self.domain_queue.add,
                enqueue_node=self.node_queue.add,
                enqueue_node_after=self.node_queue.add_after,
                fabric_check=self.config.fabric_check,
                namespace=self.config.namespace,
            )
        )

    def _build_tier_labels(self) -> None:
        """The scale-out tier labels (tierlabels.py), under `scale_out_tiers`."""
        if self.tier_nodes is None or self.dumps is None:
            return
        assert self.node_devices is not None
        self.tier_labels = TierLabels(
            TierDeps(
                nodes=self.tier_nodes,
                node_devices=self.node_devices,
                dumps=self.dumps,
                topology_file=self.config.topology_file,
                patch_node=lambda name, patch: self.rest.patch(NODES, name, patch),
                node_event=self.writer.node_event,
                require_synced=self.require_synced,
                requeue_after=self.tier_queue.add_after,
            )
        )

    def _build_fabric_check(self, fabric_runner: Runner | None) -> None:
        """The multi-node NVLink check per fabric domain (fabriccheck.py), under
        `fabric_check`."""
        if self.node_devices is None or not self.config.fabric_check:
            return
        own = self.ownership
        self.fabric_check = FabricCheck(
            FabricCheckDeps(
                patch_node=lambda name, patch: self.rest.patch(NODES, name, patch),
                node_event=self.writer.node_event,
                nodes=self.nodes,
                node_devices=self.node_devices,
                device_slices=self.device_slices,
                allocations=self.allocations,
                held=lambda n: own.owner(n) != cd.FREE_OWNER,
                runner=fabric_runner
                or KubeRunner(
                    self.rest,
                    replace(self.config.fabric_run, namespace=self.config.namespace),
                    stopped=lambda: self._stop.is_set(),
                ),
                require_verified_nodes=self.config.require_verified_nodes,
                require_synced=self.require_synced,
                requeue_after=self.fabric_queue.add_after,
                # Waiting gangs say what the check is doing (placement.py).
                state_changed=lambda f: self.placement.room_may_have_freed(),
                measure_loss=self.config.fabric_check_loss,
            )
        )

    # -- reconcile entry points ------------------------------------------------------------
    def require_synced(self) -> None:
        missing = [i.kind.plural for i in self._informers if not i.has_synced()]
        if missing:
            raise NotSynced(f"caches not synced yet: {', '.join(missing)}")

    def reconcile_domain(self, key: str) -> None:
        self.require_synced()
        self.domain_reconciler.reconcile(key)

    def reconcile_node(self, name: str) -> None:
        self.require_synced()
        self.node_reconciler.reconcile(name)

    def reconcile_tiers(self, key: str) -> None:
        assert self.tier_labels is not None
        self.tier_labels.reconcile(key)

    def reconcile_fabric(self, fabric: str) -> None:
        assert self.fabric_check is not None
        self.fabric_check.reconcile(fabric)

    # -- wiring: which queue each informer event goes to -----------------------------------
    def _wire(self) -> None:
        if self.pods is not None and self.podgroups is not None:
            self.pods.on_event(self._on_pod)
            self.podgroups.on_event(self._on_podgroup)
        if self.node_devices is not None:
            self.node_devices.on_event(self._on_node_devices)
        if self.tier_nodes is not None and self.dumps is not None:
            self.tier_nodes.on_event(self._on_tier_input)
            self.dumps.on_event(self._on_tier_input)
        self.device_slices.on_event(self._on_devices)
        self.allocations.on_event(self._on_allocation)
        self.domains.on_event(self._on_domain)
        self.claims.on_event(self._on_claim)
        self.nodes.on_event(self._on_node)
        self.slices.on_event(self._on_slice)
        self.leases.on_event(self._on_lease)
        self.templates.on_event(
            lambda e, o, n: self._by_domain_label(e, o, n) if e == "DELETED" else None
        )
        self.daemonsets.on_event(
            lambda e, o, n: self._by_domain_label(e, o, n) if e != "SYNC" else None
        )

    def _on_domain(self, event: str, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        assert obj is not None
        uid = obj["metadata"].get("uid", "")
        if new is None:
            self.ownership.forget_domain(uid)
            self._channel_may_be_free()
        else:
            self.ownership.set_key(uid, key_of(obj))
        self.domain_queue.add(key_of(obj), resync=event == "SYNC")
        if old is not None and new is not None and finished(new) and not finished(old):
            # A gang finished: the room its placement kept may go to waiting gangs.
            self.placement.room_may_have_freed()
        if new is None or obj["metadata"].get("deletionTimestamp"):
            # A gone domain may free nodes for waiting claims of other domains, and
            # its placement's room for waiting gangs.
            for node in self.ownership.nodes_of(uid):
                self.node_queue.add(node)
            self.placement.room_may_have_freed()

    def _by_domain_label(self, event: str, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        assert obj is not None
        uid = obj["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL, "")
        if uid == cd.HOST_REPORT:  # a node's host IMEX: whoever holds the node cares
            node = obj["metadata"].get("annotations", {}).get(cd.REPORT_NODE, "")
            uid = self.ownership.owner(node)
        key = self.ownership.key_of(uid)
        if key:
            self.domain_queue.add(key, resync=event == "SYNC")

    def _on_lease(self, event: str, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        assert obj is not None
        key = key_of(obj)
        silent = self.heartbeats.overdue(key) is not None
        self.heartbeats.observe(key, new)
        if event == "MODIFIED" and not silent and only_renewed(old, new):
            # A heartbeat: it moves only this Lease's deadline (liveness.py), which the
            # domain's next reconcile reads; its status cannot change (the row says what
            # it said). A row marked silent is the exception: the domain is reconciled.
            metrics.HEARTBEATS.inc()
            return
        self._by_domain_label(event, old, new)

    def _on_claim(self, event: str, old: JSON | None, new: JSON | None) -> None:
        if not any(o is not None and is_domain_claim(o) for o in (old, new)):
            return  # another driver's claim (kept as its name only)
        # A claim's allocation is an event: its node's admission goes before a resync's
        # sweep over every node (thousands of keys at fleet scale).
        resync = event == "SYNC"
        for obj in (old, new):
            if obj is not None:
                for node in claim_nodes(obj):
                    self.node_queue.add(node, resync=resync)
                # Its domain's status shows claims allocated outside its fabric.
                key = self.ownership.key_of(domain_uid(obj))
                if key:
                    self.domain_queue.add(key, resync=resync)
        if new is None or not claim_nodes(new):
            self._channel_may_be_free()

    def _on_node(self, event: str, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        assert obj is not None
        self.node_queue.add(obj["metadata"]["name"], resync=event == "SYNC")
        if self.fabric_check is not None and (
            event == "SYNC" or fabric_facts(old) != fabric_facts(new)
        ):
            for o in (old, new):
                if o is not None and node_fabric(o):
                    self.fabric_queue.add(node_fabric(o), resync=event == "SYNC")
        if event != "SYNC" and placement_facts(old) != placement_facts(new):
            self.placement.room_may_have_freed()
            # A node gone NotReady, cordoned or deleted may break a placed gang that has
            # not got all its nodes yet: it is placed again (placement.py).
            self.placement.room_may_have_gone()

    def _on_slice(self, event: str, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        assert obj is not None
        node = obj.get("spec", {}).get("nodeName")
        if node and event in ("DELETED", "SYNC"):
            self.node_queue.add(node, resync=event == "SYNC")

    def _on_devices(self, event: str, old: JSON | None, new: JSON | None) -> None:
        # GPUs freed, failed or recovered: waiting gangs may fit now (placement.py).
        if event != "SYNC" or old is not new:
            nodes = {str((o.get("spec") or {}).get("nodeName")) for o in (old, new) if o}
            self.placement.devices_changed(nodes)
        if event != "SYNC":
            self.placement.room_may_have_freed()

    def _on_allocation(self, event: str, old: JSON | None, new: JSON | None) -> None:
        before = ((old or {}).get("status") or {}).get("allocation")
        after = ((new or {}).get("status") or {}).get("allocation")
        if before != after:
            changed = device_nodes(old or {}) | device_nodes(new or {})
            self.placement.devices_changed(changed)
            if self.fabric_check is not None:
                # A GPU job started or ended there: the node went busy or idle again, a
                # member of its fabric domain's check or not (fabriccheck.py).
                for name in changed:
                    fabric = node_fabric(self.nodes.get(name) or {})
                    if fabric:
                        self.fabric_queue.add(fabric, resync=event == "SYNC")
        # Only an allocation that went (or changed) can free GPU room; a new one only
        # takes room, so no waiting gang can fit because of it. Re-placing every waiting
        # gang on every allocation anywhere cost 0.76 s of CPU per allocation with 50 gangs
        # waiting at 5,000 nodes (issue 28 point 4d).
        if event != "SYNC" and before and before != after:
            self.placement.room_may_have_freed()

    def _on_node_devices(self, event: str, old: JSON | None, new: JSON | None) -> None:
        # A node's hardware changed (a repair) or its agent first reported: its fabric
        # domain's membership changed.
        if event == "SYNC" or old == new:
            return
        if self.tier_labels is not None and _nics(old) != _nics(new):
            self.tier_queue.add(TREE)
        if self.fabric_check is None or _verification(old) == _verification(new):
            return
        name = (new or old or {}).get("metadata", {}).get("name", "")
        node = self.nodes.get(name)
        if node is not None and node_fabric(node):
            self.fabric_queue.add(node_fabric(node))

    def _by_template(self, namespace: str, templates: set[str]) -> None:
        for template in templates:
            for obj in self.domains.by_index(workloads.BY_TEMPLATE, f"{namespace}/{template}"):
                self.domain_queue.add(key_of(obj))

    def _on_pod(self, event: str, old: JSON | None, new: JSON | None) -> None:
        # A pod joined a group or named a domain's template: that domain may take its
        # gang size from the group now (workloads.py). Changes only: a resync's pods are
        # seen by the domains' own resync.
        if event == "SYNC" or workloads.pod_templates(old or {}) == workloads.pod_templates(
            new or {}
        ):
            return
        for obj in (old, new):
            if obj is not None:
                for value in workloads.pod_templates(obj):
                    namespace, template = value.split("/", 1)
                    self._by_template(namespace, {template})

    def _on_podgroup(self, event: str, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        if event == "SYNC" or obj is None or self.pods is None:
            return
        group = key_of(obj)
        namespace = group.split("/", 1)[0]
        templates = {
            value.split("/", 1)[1]
            for pod in self.pods.by_index(workloads.BY_GROUP, group)
            for value in workloads.pod_templates(pod)
        }
        self._by_template(namespace, templates)

    def _on_tier_input(self, event: str, old: JSON | None, new: JSON | None) -> None:
        # A Node came or went, its tier labels or cabling record were edited, a dump
        # changed: the tree is computed again (a no-op where nothing differs).
        if event == "SYNC" or old != new:
            self.tier_queue.add(TREE, resync=event == "SYNC")

    def _channel_may_be_free(self) -> None:
        """A domain or a claim went away: domains refused a channel may get one now."""
        for key in self.ownership.waiting_for_channel():
            self.domain_queue.add(key)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Start in the background. Caches start at once (a standby keeps them warm);
        with leader election, workers start once leading."""
        self.writer.ensure_namespace(self.config.namespace)  # the lease lives there
        self.start_caches()
        if self.config.leader_election:
            self.elector = LeaderElector(
                self.rest,
                self.config.namespace,
                self.config.lease_name,
                self.config.identity,
                lease_seconds=self.config.lease_seconds,
            )
            self._spawn("leader-election", self.elector.run, self._stop)
            self._spawn("wait-for-leadership", self._start_when_leading)
        else:
            self._spawn("start-workers", self._start_workers)

    def start_caches(self) -> None:
        """Start the informers only (what a standby runs, and what the fleet metrics read)."""
        for informer in self._informers:
            informer.start()

    def caches_synced(self) -> bool:
        return all(i.has_synced() for i in self._informers)

    def _start_when_leading(self) -> None:
        assert self.elector is not None
        while not self._stop.is_set():
            if self.elector.leading.wait(0.2):
                metrics.LEADER.set(1)
                self._spawn("watch-leadership", self._stop_when_lost)
                self._start_workers()
                return

    def _stop_when_lost(self) -> None:
        """Another replica may lead once our renewals stop: stop acting at once."""
        assert self.elector is not None
        while not self._stop.is_set():
            if self.elector.lost.wait(0.2):
                log.error("leadership lost; stopping the workers")
                self.stop()
                return

    def _start_workers(self) -> None:
        if self.config.install_device_classes:
            self.writer.ensure_device_classes()
        # Ownership and channels are rebuilt from the API before any decision is made, and
        # nothing is decided before every cache has its first full LIST.
        waited = 0.0
        while not all(i.wait_synced(1.0) for i in self._informers):
            if self._stop.is_set():
                return
            waited += 1.0
            if waited % 30 == 0:
                missing = [i.kind.plural for i in self._informers if not i.has_synced()]
                log.warning("still waiting for caches to sync: %s", ", ".join(missing))
        if self._stop.is_set():
            return
        self._rebuild_owners()
        for i in range(self.config.domain_workers):
            self._spawn(
                f"domain-worker-{i}",
                self._worker,
                self.domain_queue,
                self.reconcile_domain,
                "domain",
            )
        self._spawn("node-worker", self._worker, self.node_queue, self.reconcile_node, "node")
        if self.fabric_check is not None:
            self._spawn("fabric-start", self._fabric_workers)
        if self.tier_labels is not None:
            self.tier_queue.add(TREE)
            self._spawn("tier-worker", self._worker, self.tier_queue, self.reconcile_tiers, "tiers")

    def _fabric_workers(self) -> None:
        assert self.fabric_check is not None
        try:
            # What a controller that stopped mid-check left behind: a new leader deletes it
            # before its first check (fabriccheckrun.py).
            self.fabric_check.d.runner.cleanup()
        except Exception:
            log.exception("fabric check: cleaning up an earlier run's objects failed")
        for node in self.nodes.items():
            if node_fabric(node):
                self.fabric_queue.add(node_fabric(node))
        # Racks are checked side by side up to the bound: one at a time, the last of 277
        # racks waited a day at first install.
        for i in range(max(1, self.config.fabric_check_concurrency)):
            self._spawn(
                f"fabric-worker-{i}",
                self._worker,
                self.fabric_queue,
                self.reconcile_fabric,
                "fabric",
            )

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name=name)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self.domain_queue.close()
        self.node_queue.close()
        self.fabric_queue.close()
        self.tier_queue.close()
        for informer in self._informers:
            informer.stop()
        if self.elector is not None:
            self.elector.release()
        metrics.LEADER.set(0)

    def run_forever(self) -> int:
        self.start()
        while not self._stop.wait(1.0):
            pass
        if self.elector is not None and self.elector.lost.is_set():
            log.error("leadership lost; exiting so a restart starts clean")
            return 1
        return 0

    def _worker(self, queue: WorkQueue, reconcile: Callable[[str], None], target: str) -> None:
        while not self._stop.is_set():
            key = queue.get()
            if key is None:
                return
            started = time.perf_counter()
            try:
                reconcile(key)
            except Exception as e:
                metrics.RECONCILE_ERRORS.labels(target).inc()
                delay = queue.retry(key)
                if isinstance(e, ApiError | NotSynced | NotRecorded | InputUnreadable):
                    log.warning("reconcile %s %s: %s (retry in %.2fs)", target, key, e, delay)
                else:
                    log.exception("reconcile %s %s failed (retry in %.2fs)", target, key, delay)
            else:
                queue.forget(key)
            finally:
                metrics.RECONCILE_SECONDS.labels(target).observe(time.perf_counter() - started)
                queue.done(key)

    # -- restart ---------------------------------------------------------------------------
    def _rebuild_owners(self) -> None:
        """After a (re)start: who holds which node, from the published slices."""
        own = self.ownership
        for sl in self.slices.items():
            node = sl.get("spec", {}).get("nodeName")
            for dev in sl.get("spec", {}).get("devices", []):
                if dev.get("name") == cd.CHANNEL_DEVICE and node:
                    owner = dev.get("attributes", {}).get(cd.ATTR_OWNER, {}).get("string")
                    own.set_owner(node, owner or cd.FREE_OWNER)
        held: dict[str, list[int]] = {}
        for obj in self.domains.items():
            pinned = obj.get("status", {}).get("fabricDomain")
            if pinned:
                own.pin(obj["metadata"]["uid"], pinned)
            held[key_of(obj)] = obj.get("status", {}).get("channels", []) or []
        for channel, owners in channels.duplicates(held).items():
            # Only an outside edit of status can do this; say so, do not guess who is right.
            log.error("IMEX channel %d is recorded by several ComputeDomains: %s", channel, owners)
        # Nodes named by allocated claims too: a held node whose Node (or plugin label) is
        # gone has no slice any more, and its hold is rebuilt from its admitted claims, here
        # and not later by the node worker: a domain worker that ran first would write the
        # domain's status without the node's row, and its fabric domain (read from that row
        # while the Node is gone) would be lost with it.
        claimed = set(self.claims.index_values(BY_NODE))
        nodes = {n["metadata"]["name"] for n in self.nodes.items()}
        for node in sorted(claimed - nodes):
            if own.owner(node) != cd.FREE_OWNER:
                continue
            on_node = self.claims.by_index(BY_NODE, node)
            admitted = admitted_domains(self.domains, node, on_node)
            if admitted:
                own.set_owner(node, min(admitted))  # as the node worker decides (nodes.py)
        for node in own.known_nodes() | nodes | claimed:
            self.node_queue.add(node)
