"""The ComputeDomain controller: informers, two work queues, reconcilers, leader election.

Two kinds of work, each keyed so a key is handled by one worker at a time:
- domain keys (`namespace/name`): finalizer, channel id, claim templates, DaemonSet, status;
- node keys (node name): the node's ResourceSlice and who holds the node (admission of
  workload claims at binding time). Node keys go through one worker so ownership decisions
  are made one after the other, never concurrently.

Every step is idempotent and reads what exists before writing, so a controller killed at any
point resumes from the API's state on restart: nothing is recorded only in memory.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from fabricdra.api import computedomain as cd
from fabricdra.api import labels as node_labels
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.rest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    DAEMON_SETS,
    DEVICE_CLASSES,
    EVENTS,
    JSON_PATCH,
    LEASES,
    NAMESPACES,
    NODES,
    SLICES,
    STRATEGIC_PATCH,
    ApiError,
    Kind,
    Rest,
)

from . import admission, channels, metrics, objects, status
from .informer import Informer, key_of
from .leader import LeaderElector
from .workqueue import WorkQueue

log = logging.getLogger("fabricdra.controller")
JSON = dict[str, Any]
USER_AGENT = "fabricdra-controller/0.1.0"


class NotOurs(Exception):
    """An object the controller would create exists and carries another owner's label."""


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


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Controller:
    def __init__(self, api_client: Any, config: ControllerConfig | None = None) -> None:
        self.config = config or ControllerConfig()
        api_client.user_agent = USER_AGENT
        self.rest = Rest(api_client)
        ns, resync = self.config.namespace, self.config.resync_seconds
        self.domains = Informer(self.rest, COMPUTE_DOMAINS, resync=resync)
        self.claims = Informer(self.rest, CLAIMS, label_selector=cd.DOMAIN_LABEL, resync=resync)
        self.nodes = Informer(
            self.rest, NODES, label_selector=f"{cd.PLUGIN_NODE_LABEL}=true", resync=resync
        )
        self.slices = Informer(
            self.rest, SLICES, label_selector=f"{cd.TARGET_LABEL}=node", resync=resync
        )
        self.leases = Informer(
            self.rest, LEASES, namespace=ns, label_selector=cd.DOMAIN_LABEL, resync=resync
        )
        self.templates = Informer(
            self.rest, CLAIM_TEMPLATES, label_selector=cd.DOMAIN_LABEL, resync=resync
        )
        self.daemonsets = Informer(
            self.rest, DAEMON_SETS, namespace=ns, label_selector=cd.DOMAIN_LABEL, resync=resync
        )
        self._informers = [
            self.domains,
            self.claims,
            self.nodes,
            self.slices,
            self.leases,
            self.templates,
            self.daemonsets,
        ]
        self.domain_queue = WorkQueue()
        self.node_queue = WorkQueue()
        self._lock = threading.Lock()
        self._reserved: dict[str, int] = {}  # domain UID -> channel, until the cache shows it
        self._owners: dict[str, str] = {}  # node -> owning domain UID (FREE_OWNER if none)
        self._pins: dict[str, str] = {}  # domain UID -> fabric domain fixed by admission
        self._uid_to_key: dict[str, str] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.elector: LeaderElector | None = None
        self._wire()

    # -- wiring --------------------------------------------------------------------------
    def _wire(self) -> None:
        def on_domain(event: str, old: JSON | None, new: JSON | None) -> None:
            obj = new or old
            assert obj is not None
            uid = obj["metadata"].get("uid", "")
            if new is None:
                self._uid_to_key.pop(uid, None)
            else:
                self._uid_to_key[uid] = key_of(obj)
            self.domain_queue.add(key_of(obj))
            if new is None or obj["metadata"].get("deletionTimestamp"):
                # A gone domain may free nodes for waiting claims of other domains.
                for node, owner in list(self._owners.items()):
                    if owner == uid:
                        self.node_queue.add(node)

        def by_domain_label(event: str, old: JSON | None, new: JSON | None) -> None:
            obj = new or old
            assert obj is not None
            uid = obj["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL, "")
            if uid == cd.HOST_REPORT:  # a node's host IMEX: whoever holds the node cares
                node = obj["metadata"].get("annotations", {}).get(cd.REPORT_NODE, "")
                uid = self._owners.get(node, cd.FREE_OWNER)
            key = self._uid_to_key.get(uid)
            if key:
                self.domain_queue.add(key)

        def on_claim(event: str, old: JSON | None, new: JSON | None) -> None:
            for obj in (old, new):
                if obj is not None:
                    for node in _claim_nodes(obj):
                        self.node_queue.add(node)

        def on_node(event: str, old: JSON | None, new: JSON | None) -> None:
            obj = new or old
            assert obj is not None
            self.node_queue.add(obj["metadata"]["name"])

        def on_slice(event: str, old: JSON | None, new: JSON | None) -> None:
            obj = new or old
            assert obj is not None
            node = obj.get("spec", {}).get("nodeName")
            if node and event in ("DELETED", "SYNC"):
                self.node_queue.add(node)

        self.domains.on_event(on_domain)
        self.claims.on_event(on_claim)
        self.nodes.on_event(on_node)
        self.slices.on_event(on_slice)
        self.leases.on_event(by_domain_label)
        self.templates.on_event(
            lambda e, o, n: by_domain_label(e, o, n) if e == "DELETED" else None
        )
        self.daemonsets.on_event(lambda e, o, n: by_domain_label(e, o, n) if e != "SYNC" else None)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Start in the background; with leader election, workers start once leading."""
        self._ensure_namespace()  # the lease lives there
        if self.config.leader_election:
            self.elector = LeaderElector(
                self.rest, self.config.namespace, self.config.lease_name, self.config.identity
            )
            t = threading.Thread(
                target=self.elector.run, args=(self._stop,), daemon=True, name="leader-election"
            )
            t.start()
            self._threads.append(t)
            starter = threading.Thread(
                target=self._start_when_leading, daemon=True, name="wait-for-leadership"
            )
            starter.start()
            self._threads.append(starter)
        else:
            self._start_workers()

    def _start_when_leading(self) -> None:
        assert self.elector is not None
        while not self._stop.is_set():
            if self.elector.leading.wait(0.2):
                metrics.LEADER.set(1)
                self._start_workers()
                return

    def _start_workers(self) -> None:
        if self.config.install_device_classes:
            self._ensure_device_classes()
        # Ownership and channels are rebuilt from the API before any decision is made.
        for informer in self._informers:
            informer.start()
        for informer in self._informers:
            informer.wait_synced(60)
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

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name=name)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self.domain_queue.close()
        self.node_queue.close()
        for informer in self._informers:
            informer.stop()
        if self.elector is not None:
            self.elector.release()
        metrics.LEADER.set(0)

    def run_forever(self) -> int:
        self.start()
        while not self._stop.wait(1.0):
            if self.elector is not None and self.elector.lost.is_set():
                log.error("leadership lost; exiting so a restart starts clean")
                self.stop()
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
                if isinstance(e, ApiError):
                    log.warning("reconcile %s %s: %s (retry in %.2fs)", target, key, e, delay)
                else:
                    log.exception("reconcile %s %s failed (retry in %.2fs)", target, key, delay)
            else:
                queue.forget(key)
            finally:
                metrics.RECONCILE_SECONDS.labels(target).observe(time.perf_counter() - started)
                queue.done(key)

    # -- writes (all counted) ------------------------------------------------------------
    def _write(self, verb: str, kind: Kind, fn: Callable[[], JSON]) -> JSON:
        result = fn()
        metrics.API_WRITES.labels(kind.plural, verb).inc()
        return result

    def _create(self, kind: Kind, body: JSON, namespace: str | None = None) -> JSON | None:
        """Create; None if it already existed (409)."""
        try:
            return self._write("create", kind, lambda: self.rest.create(kind, body, namespace))
        except ApiError as e:
            if e.conflict:
                return None
            raise

    def _patch(
        self, kind: Kind, name: str, patch: Any, namespace: str | None = None, **kw: Any
    ) -> JSON:
        return self._write(
            "patch", kind, lambda: self.rest.patch(kind, name, patch, namespace, **kw)
        )

    def _delete(self, kind: Kind, name: str, namespace: str | None = None) -> bool:
        gone = self.rest.delete(kind, name, namespace)
        if gone:
            metrics.API_WRITES.labels(kind.plural, "delete").inc()
        return gone

    def _event(self, domain: ComputeDomain, ev: status.Event) -> None:
        body = {
            "metadata": {
                "name": f"{domain.name}.{uuid.uuid4().hex[:12]}",
                "namespace": domain.namespace,
            },
            "involvedObject": {
                "apiVersion": cd.API_VERSION,
                "kind": cd.KIND,
                "name": domain.name,
                "namespace": domain.namespace,
                "uid": domain.uid,
            },
            "type": ev.type,
            "reason": ev.reason,
            "message": ev.message[:1024],
            "source": {"component": "fabricdra-controller"},
            "firstTimestamp": _now(),
            "lastTimestamp": _now(),
            "count": 1,
            "reportingComponent": "fabricdra.io/compute-domain-controller",
            "reportingInstance": self.config.identity,
        }
        try:
            self._create(EVENTS, body, domain.namespace)
        except ApiError as e:  # events are best effort
            log.info("event %s for %s: %s", ev.reason, domain.name, e)

    def _ensure_namespace(self) -> None:
        try:
            self.rest.get(NAMESPACES, self.config.namespace)
        except ApiError as e:
            if not e.not_found:
                raise
            self._create(NAMESPACES, {"metadata": {"name": self.config.namespace}})

    def _ensure_device_classes(self) -> None:
        for dc in objects.device_classes():
            self._create(DEVICE_CLASSES, dc)

    # -- domains -------------------------------------------------------------------------
    def reconcile_domain(self, key: str) -> None:
        obj = self.domains.get(key)
        if obj is None:
            return
        try:
            domain = ComputeDomain.model_validate(obj)
        except ValidationError as e:  # the CRD's schema should have refused it
            log.error("ComputeDomain %s is invalid: %s", key, e)
            return
        if domain.deleting:
            self._finalize(domain)
            return
        if cd.FINALIZER not in domain.metadata.get("finalizers", []):
            self._add_finalizer(domain)
        channel = self._ensure_channel(domain)
        ready, message = self._ensure_objects(domain, channel)
        self._update_status(domain, ready, message, channel)
        self._count_domains()

    def _count_domains(self) -> None:
        counts = {"True": 0, "False": 0, "Unknown": 0}
        for obj in self.domains.items():
            conds = obj.get("status", {}).get("conditions", []) or []
            ready = next((c.get("status") for c in conds if c.get("type") == cd.READY), None)
            counts[ready if ready in counts else "Unknown"] += 1
        for value, n in counts.items():
            metrics.DOMAINS.labels(value).set(n)

    def _add_finalizer(self, domain: ComputeDomain) -> None:
        finalizers = [*domain.metadata.get("finalizers", []), cd.FINALIZER]
        # resourceVersion makes the merge patch conditional: a list is replaced whole.
        patch = {
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": domain.metadata["resourceVersion"],
            }
        }
        self._patch(COMPUTE_DOMAINS, domain.name, patch, domain.namespace)

    def _ensure_channel(self, domain: ComputeDomain) -> int:
        """The domain's channel: the recorded one, else the lowest free id, reserved in memory
        until the status write that records it (the same pass's status patch) is seen."""
        if domain.status.channels:
            with self._lock:
                self._reserved.pop(domain.uid, None)
            return domain.status.channels[0]
        with self._lock:
            channel = self._reserved.get(domain.uid)
            if channel is None:
                held = [
                    c
                    for o in self.domains.items()
                    for c in o.get("status", {}).get("channels", []) or []
                ]
                held += list(self._reserved.values())
                channel = channels.lowest_free(held)
                self._reserved[domain.uid] = channel
        return channel

    def _ensure(self, kind: Kind, desired: JSON, cache: Informer) -> None:
        meta = desired["metadata"]
        ns = meta.get("namespace")
        live = cache.get(f"{ns}/{meta['name']}" if ns else meta["name"])
        if live is None and self._create(kind, desired, ns) is not None:
            return
        if live is None:
            live = self.rest.get(kind, meta["name"], ns)
        mine = desired["metadata"]["labels"][cd.DOMAIN_LABEL]
        if live["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL) != mine:
            raise NotOurs(f"{kind.plural}/{meta['name']} exists and belongs to something else")
        if objects.differs(desired, live):
            if kind is CLAIM_TEMPLATES:  # spec is immutable: replace it
                self._delete(kind, meta["name"], ns)
                self._create(kind, desired, ns)
            else:
                self._patch(kind, meta["name"], desired, ns)

    def _ensure_objects(self, domain: ComputeDomain, channel: int) -> tuple[bool, str]:
        rct = objects.workload_claim_template(domain, channel)
        try:
            self._ensure(CLAIM_TEMPLATES, rct, self.templates)
            if domain.spec.imexMode == "managed":
                settings = self.config.daemon
                self._ensure(
                    CLAIM_TEMPLATES, objects.daemon_claim_template(domain, settings), self.templates
                )
                self._ensure(DAEMON_SETS, objects.daemon_set(domain, settings), self.daemonsets)
        except NotOurs as e:
            # Never take over or delete an object we did not create: say so in the status.
            return False, f"{e}; choose another spec.channel.resourceClaimTemplate.name"
        return True, "claim templates created"

    def _held_nodes(self, uid: str) -> list[status.HeldNode]:
        out = []
        for node, owner in list(self._owners.items()):
            if owner != uid:
                continue
            obj = self.nodes.get(node) or {}
            out.append(status.HeldNode(node, _node_ip(obj), _node_fabric(obj)))
        return out

    def _reports(self, uid: str, host_mode: bool) -> dict[str, status.DaemonReport]:
        """Managed mode: the domain's daemons' reports. Host mode: the node plugins' reports
        on their host's IMEX service (label value cd.HOST_REPORT)."""
        out = {}
        want = cd.HOST_REPORT if host_mode else uid
        for lease in self.leases.items():
            meta = lease["metadata"]
            if meta.get("labels", {}).get(cd.DOMAIN_LABEL) != want:
                continue
            ann = meta.get("annotations", {})
            node = ann.get(cd.REPORT_NODE) or lease.get("spec", {}).get("holderIdentity", "")
            out[node] = status.DaemonReport(
                ann.get(cd.REPORT_READY) == "true",
                ann.get(cd.REPORT_MESSAGE, ""),
                ann.get(cd.REPORT_IP, ""),
            )
        return out

    def _update_status(
        self, domain: ComputeDomain, ready: bool, message: str, channel: int
    ) -> None:
        # The channel is recorded by the same write as the conditions: one write per pass.
        domain = domain.model_copy(deep=True)
        recorded = list(domain.status.channels)
        domain.status.channels = recorded or [channel]
        reports = self._reports(domain.uid, domain.spec.imexMode == "host")
        observed = status.Observed(ready, message, self._held_nodes(domain.uid), reports)
        new, events = status.compute(domain, observed, _now())
        if not recorded:
            domain.status.channels = []
        patch = status.status_patch(domain.status, new)
        if patch is not None:
            self._patch(COMPUTE_DOMAINS, domain.name, patch, domain.namespace, sub="status")
        for ev in events:
            self._event(domain, ev)

    def _finalize(self, domain: ComputeDomain) -> None:
        """Delete in order: workload claim template, daemon objects; then drop the finalizer.
        Each step is checked against the API, so a crash between steps resumes here."""
        if cd.FINALIZER not in domain.metadata.get("finalizers", []):
            return
        remaining = []
        rct = domain.spec.channel.resourceClaimTemplate.name
        live = self._get(CLAIM_TEMPLATES, rct, domain.namespace)
        if (
            live is not None
            and live["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL) == domain.uid
        ):
            self._delete(CLAIM_TEMPLATES, rct, domain.namespace)
            remaining.append(f"ResourceClaimTemplate {rct}")
        ns = self.config.namespace
        for kind in (DAEMON_SETS, CLAIM_TEMPLATES):
            listing = self.rest.list(kind, ns, label_selector=f"{cd.DOMAIN_LABEL}={domain.uid}")
            for obj in listing.get("items", []):
                if not obj["metadata"].get("deletionTimestamp"):
                    self._delete(kind, obj["metadata"]["name"], ns)
                remaining.append(f"{kind.plural}/{obj['metadata']['name']}")
        if remaining:
            # Deletion was requested; come back to check it happened before letting go.
            self.domain_queue.add_after(f"{domain.namespace}/{domain.name}", 0.2)
            return
        finalizers = [f for f in domain.metadata.get("finalizers", []) if f != cd.FINALIZER]
        idx = domain.metadata["finalizers"].index(cd.FINALIZER)
        patch = [
            {"op": "test", "path": f"/metadata/finalizers/{idx}", "value": cd.FINALIZER},
            {"op": "replace", "path": "/metadata/finalizers", "value": finalizers},
        ]
        try:
            self._patch(
                COMPUTE_DOMAINS, domain.name, patch, domain.namespace, content_type=JSON_PATCH
            )
        except ApiError as e:
            if not e.not_found:
                raise
        with self._lock:
            self._reserved.pop(domain.uid, None)
            self._pins.pop(domain.uid, None)

    def _get(self, kind: Kind, name: str, namespace: str | None) -> JSON | None:
        try:
            return self.rest.get(kind, name, namespace)
        except ApiError as e:
            if e.not_found:
                return None
            raise

    # -- nodes ---------------------------------------------------------------------------
    def _rebuild_owners(self) -> None:
        """After a (re)start: who holds which node, from the published slices."""
        for sl in self.slices.items():
            node = sl.get("spec", {}).get("nodeName")
            for dev in sl.get("spec", {}).get("devices", []):
                if dev.get("name") == cd.CHANNEL_DEVICE and node:
                    owner = dev.get("attributes", {}).get(cd.ATTR_OWNER, {}).get("string")
                    self._owners[node] = owner or cd.FREE_OWNER
        held: dict[str, list[int]] = {}
        for obj in self.domains.items():
            pinned = obj.get("status", {}).get("fabricDomain")
            if pinned:
                self._pins[obj["metadata"]["uid"]] = pinned
            held[key_of(obj)] = obj.get("status", {}).get("channels", []) or []
        for channel, owners in channels.duplicates(held).items():
            # Only an outside edit of status can do this; say so, do not guess who is right.
            log.error("IMEX channel %d is recorded by several ComputeDomains: %s", channel, owners)
        for node in set(self._owners) | {n["metadata"]["name"] for n in self.nodes.items()}:
            self.node_queue.add(node)

    def _live_domains(self) -> dict[str, str | None]:
        live: dict[str, str | None] = {}
        for obj in self.domains.items():
            meta = obj["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            uid = meta["uid"]
            live[uid] = obj.get("status", {}).get("fabricDomain") or self._pins.get(uid)
        return live

    def reconcile_node(self, name: str) -> None:
        node = self.nodes.get(name)
        claims = [c for c in self.claims.items() if name in _claim_nodes(c)]
        previous = self._owners.get(name, cd.FREE_OWNER)
        if node is None:
            # No plugin here (or no node): no devices to offer. Held state lives on while
            # claims are still allocated on it.
            self._delete(SLICES, objects.slice_name(name))
            if not claims:
                self._owners.pop(name, None)
            return
        fabric = _node_fabric(node)
        namespaces = {
            o["metadata"]["uid"]: o["metadata"]["namespace"] for o in self.domains.items()
        }
        views = [v for c in claims for v in _claim_views(c, name, namespaces)]
        live = self._live_domains()
        decision = admission.decide(name, fabric, views, live, previous)
        self._owners[name] = decision.owner
        for uid, pinned in decision.fabric_pins.items():
            self._pins[uid] = pinned
        self._ensure_slice(node, decision.owner, fabric)
        self._ensure_node_label(node, decision.owner)
        by_key = {f"{c['metadata']['namespace']}/{c['metadata']['name']}": c for c in claims}
        for key in decision.admit:
            self._answer(
                by_key[key],
                name,
                cd.ADMITTED_CONDITION,
                "Admitted",
                f"node {name} is held by this claim's ComputeDomain",
            )
            metrics.ADMISSIONS.labels("admitted").inc()
        for key, why in decision.conflicts:
            self._answer(by_key[key], name, cd.CONFLICT_CONDITION, "NodeHeld", why)
            metrics.ADMISSIONS.labels("conflict").inc()
            self._conflict_event(by_key[key], why)
        metrics.HELD_NODES.set(sum(1 for o in self._owners.values() if o != cd.FREE_OWNER))
        for uid in {previous, decision.owner} - {cd.FREE_OWNER}:
            domain_key = self._uid_to_key.get(uid)
            if domain_key:
                self.domain_queue.add(domain_key)

    def _ensure_slice(self, node: JSON, owner: str, fabric: str) -> None:
        name = node["metadata"]["name"]
        live = self.slices.get(objects.slice_name(name))
        desired = objects.node_slice(name, node["metadata"]["uid"], owner, fabric, 1)
        if live is None:
            if self._create(SLICES, desired) is not None:
                return
            live = self.rest.get(SLICES, objects.slice_name(name))
        if not objects.differs(desired["spec"]["devices"], live["spec"].get("devices", [])):
            return
        # A new pool generation tells the scheduler the old devices are void.
        desired["spec"]["pool"]["generation"] = int(live["spec"]["pool"]["generation"]) + 1
        desired["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        self._write(
            "update", SLICES, lambda: self.rest.replace(SLICES, objects.slice_name(name), desired)
        )

    def _ensure_node_label(self, node: JSON, owner: str) -> None:
        """The node label drives the domain's DaemonSet and shows the holder in kubectl."""
        current = node["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL)
        want = None if owner == cd.FREE_OWNER else owner
        if current != want:
            self._patch(
                NODES, node["metadata"]["name"], {"metadata": {"labels": {cd.DOMAIN_LABEL: want}}}
            )

    def _answer(self, claim: JSON, node: str, condition: str, reason: str, message: str) -> None:
        """Set the binding (or binding-failure) condition on the claim's channel result."""
        results = claim["status"]["allocation"]["devices"]["results"]
        entries = []
        existing = {(_dev_key(d)): d for d in claim["status"].get("devices", []) or []}
        for r in results:
            if r.get("driver") != cd.DRIVER:
                continue
            entry = dict(existing.get(_dev_key(r), {}))
            entry.update({k: r[k] for k in ("driver", "pool", "device") if k in r})
            if r.get("shareID"):
                entry["shareID"] = r["shareID"]
            conds = [c for c in entry.get("conditions", []) if c.get("type") != condition]
            if r.get("device") == cd.CHANNEL_DEVICE and r.get("pool") == node:
                conds.append(
                    {
                        "type": condition,
                        "status": "True",
                        "reason": reason,
                        "message": message[:1024],
                        "lastTransitionTime": _now(),
                    }
                )
            entry["conditions"] = conds
            entries.append(entry)
        patch = {
            "metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]},
            "status": {"devices": entries},
        }
        try:
            # Strategic merge: status.devices is a list-map, so only our entries change.
            self._patch(
                CLAIMS,
                claim["metadata"]["name"],
                patch,
                claim["metadata"]["namespace"],
                sub="status",
                content_type=STRATEGIC_PATCH,
            )
        except ApiError as e:
            if e.conflict or e.not_found:  # the claim changed meanwhile; its event requeues
                self.node_queue.add_after(node, 0.1)
                return
            raise

    def _conflict_event(self, claim: JSON, why: str) -> None:
        uid = claim["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL, "")
        key = self._uid_to_key.get(uid)
        obj = self.domains.get(key) if key else None
        if obj is not None:
            domain = ComputeDomain.model_validate(obj)
            self._event(
                domain,
                status.Event(
                    "Warning", "NodeConflict", f"claim {claim['metadata']['name']}: {why}"
                ),
            )


def _dev_key(d: JSON) -> tuple[str, str, str, str]:
    return (d.get("driver", ""), d.get("pool", ""), d.get("device", ""), d.get("shareID", ""))


def _claim_nodes(claim: JSON) -> set[str]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return {r["pool"] for r in results if r.get("driver") == cd.DRIVER and r.get("pool")}


def _claim_views(
    claim: JSON, node: str, domain_namespaces: dict[str, str]
) -> list[admission.ClaimOnNode]:
    """`domain_namespaces`: domain UID -> its namespace. A claim speaks only for a domain of its
    own namespace: the domain label is the user's to set, so a claim elsewhere that names a
    domain's UID counts as naming no domain, and can neither hold a node for it nor block one."""
    meta = claim["metadata"]
    domain = meta.get("labels", {}).get(cd.DOMAIN_LABEL, "")
    if domain_namespaces.get(domain) != meta["namespace"]:
        domain = ""
    status_ = claim.get("status") or {}
    allocation = status_.get("allocation") or {}
    devices = {_dev_key(d): d for d in status_.get("devices", []) or []}
    views = []
    for r in (allocation.get("devices") or {}).get("results") or []:
        if r.get("driver") != cd.DRIVER or r.get("pool") != node:
            continue
        if r.get("device") != cd.CHANNEL_DEVICE:
            continue
        conds = {
            c.get("type"): c.get("status")
            for c in devices.get(_dev_key(r), {}).get("conditions", []) or []
        }
        if conds.get(cd.ADMITTED_CONDITION) == "True" or not r.get("bindingConditions"):
            state = "admitted"
        elif conds.get(cd.CONFLICT_CONDITION) == "True":
            state = "conflict"
        else:
            state = "pending"
        views.append(
            admission.ClaimOnNode(
                key=f"{meta['namespace']}/{meta['name']}",
                domain=domain,
                state=state,
                since=str(
                    allocation.get("allocationTimestamp") or meta.get("creationTimestamp", "")
                ),
            )
        )
    return views


def _node_fabric(node: JSON) -> str:
    return str(node.get("metadata", {}).get("labels", {}).get(node_labels.FABRIC_DOMAIN, ""))


def _node_ip(node: JSON) -> str:
    addresses = node.get("status", {}).get("addresses", []) or []
    for kind in ("InternalIP", "ExternalIP"):
        for a in addresses:
            if a.get("type") == kind:
                return str(a.get("address", ""))
    return ""
