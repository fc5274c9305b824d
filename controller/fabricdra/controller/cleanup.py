"""`fabricdra cleanup`: remove what fabricdra's running components made, before `helm uninstall`
removes the components themselves (the chart runs it as its pre-delete hook Job).

Helm deletes only the objects of its chart. The components made more: ResourceSlices of both
drivers, a NodeDevices per node, node labels, and per ComputeDomain claim templates and IMEX
DaemonSets. What the release made goes; what users made stays: a user's ComputeDomain is kept,
released (the objects the controller made for it deleted, its finalizer dropped), so neither a
CRD deletion nor a reinstall waits on a controller that is gone. The order below is what makes
the removal clean:

1. The controller is stopped (the release's Deployment deleted, its pods awaited): it would
   otherwise make again, for the kept domains, what step 2 deletes.
2. Every ComputeDomain is released: the objects carrying its domain label (claim templates,
   IMEX DaemonSet) deleted, then its finalizer dropped; the IMEX daemon pods' claims are
   unprepared by the node plugin, which still runs. Domains the release made itself (the
   controller's fabric check, labelled with its run) are deleted.
3. The node DaemonSet is stopped and its pods awaited: after that nothing publishes again what
   step 4 removes.
4. What they published is deleted: slices, NodeDevices, labels by prefix, leftover domain
   objects, the report and leader Leases, and the DeviceClasses the controller created.

Lists are read a page at a time (`page_size`), as the informer reads them: the Job's memory
stays one page, not the fleet's slices, NodeDevices and Nodes at once. Every step is idempotent
(a second run after a failure finishes the job) and an object already gone is not an error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.api import labels
from fabricdra.controller.fabriccheckrun import RUN_LABEL
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    COMPUTE_DOMAINS,
    DAEMON_SETS,
    DEVICE_CLASSES,
    JSON_PATCH,
    LEASES,
    NODE_DEVICES,
    NODES,
    PODS,
    SLICES,
    Conflict,
    Gone,
    Invalid,
    Kind,
    NotFound,
    Rest,
)

log = logging.getLogger("fabricdra.cleanup")

DEVICES_DRIVER = "devices.fabricdra.io"
DRIVERS = (DEVICES_DRIVER, cd.DRIVER)
LABEL_PREFIXES = (labels.PREFIX, "compute-domain.fabricdra.io/")
# The node labels the controller writes: who holds the node, and the fabric check's verdict.
CONTROLLER_NODE_LABELS = frozenset({cd.DOMAIN_LABEL, labels.FABRIC_VERIFIED})
DEPLOYMENTS = Kind("apps", "v1", "deployments", True)
# The controller's leader Lease (ControllerConfig.lease_name); the reports carry the domain label.
CONTROLLER_LEASE = "fabricdra-compute-domain-controller"
COMPONENTS = "(node,controller)"  # app.kubernetes.io/component of the chart's workloads
PAGE_SIZE = 500  # objects per LIST page (the informer's default)
# A continue token the server no longer honours (410 Expired, after etcd compaction) restarts
# the list this many times: every step is idempotent, so objects seen twice are harmless.
RELIST_TRIES = 3


@dataclass
class CleanupConfig:
    namespace: str  # the release's namespace: components, IMEX DaemonSets, Leases
    release: str  # the Helm release whose DaemonSets and Deployments are stopped
    domain_timeout: float = 60.0  # how long the released domains' IMEX daemon pods get to go
    stop_timeout: float = 120.0  # how long the components' pods get to terminate
    poll: float = 1.0
    page_size: int = PAGE_SIZE  # objects per LIST page


@dataclass
class Report:
    """What was removed, by kind (printed as the command's output)."""

    removed: dict[str, list[str]] = field(default_factory=dict)
    released_domains: list[str] = field(default_factory=list)

    def add(self, kind: str, name: str) -> None:
        self.removed.setdefault(kind, []).append(name)
        log.info("removed %s %s", kind, name)

    def as_json(self) -> dict[str, Any]:
        return {"removed": self.removed, "releasedDomains": self.released_domains}


class CleanupError(Exception):
    """Cleanup could not finish; the message says what is left and why."""


def _items(
    rest: Rest,
    kind: Kind,
    namespace: str | None = None,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
    page_size: int = PAGE_SIZE,
) -> Iterator[Any]:
    """The objects of `kind`, a page at a time; none when the kind is not served (its CRD
    already gone)."""
    for attempt in range(RELIST_TRIES):
        try:
            for page in rest.pages(
                kind,
                namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                limit=page_size,
            ):
                yield from page.get("items") or []
            return
        except NotFound:
            return
        except Gone:
            if attempt == RELIST_TRIES - 1:
                raise
            log.info("the list of %s expired part way: listing again", kind.plural)


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


class Cleanup:
    def __init__(
        self,
        rest: Rest,
        config: CleanupConfig,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rest = rest
        self.config = config
        self.clock = clock
        self.sleep = sleep
        self.report = Report()

    def run(self) -> Report:
        self.stop_components("controller")
        self.release_domains()
        self.stop_components("node")
        self.remove_published()
        return self.report

    # -- helpers -------------------------------------------------------------------------
    def _each(self, kind: Kind, namespace: str | None = None, **selectors: str) -> Iterator[Any]:
        return _items(self.rest, kind, namespace, page_size=self.config.page_size, **selectors)

    def _delete(self, kind: Kind, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if self.rest.delete(kind, meta["name"], meta.get("namespace")):
            self.report.add(kind.plural, _key(obj))

    def _wait(self, what: str, timeout: float, left: Callable[[], list[str]]) -> list[str]:
        """Poll `left` until it is empty or `timeout` passed; returns what is still there."""
        deadline = self.clock() + timeout
        remaining = left()
        while remaining and self.clock() < deadline:
            log.info("waiting for %s: %s", what, ", ".join(remaining[:10]))
            self.sleep(self.config.poll)
            remaining = left()
        return remaining

    # -- 1. and 3. the components ----------------------------------------------------------
    def stop_components(self, component: str) -> None:
        """Delete the release's workloads of `component` (node or controller; never the
        cleanup Job's own pod) and wait for their pods."""
        ns, release = self.config.namespace, self.config.release
        selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component={component}"
        for kind in (DAEMON_SETS, DEPLOYMENTS):
            for obj in self._each(kind, ns, label_selector=selector):
                self._delete(kind, obj)
        left = self._wait(
            f"the {component} pods to terminate",
            self.config.stop_timeout,
            lambda: [_key(p) for p in self._each(PODS, ns, label_selector=selector)],
        )
        if left:
            # A pod still running may make again what the next steps remove: do not pretend.
            raise CleanupError(
                f"{component} pods of release {release} in {ns} did not terminate within "
                f"{self.config.stop_timeout:.0f}s: {', '.join(left)}; nothing they made was "
                "removed (run the cleanup again once they are gone)"
            )

    # -- 2. ComputeDomains -----------------------------------------------------------------
    def release_domains(self) -> None:
        """Every ComputeDomain loses what the release made for it and its finalizer; users'
        domains are kept, the release's own (the fabric check's) deleted."""
        ns = self.config.namespace
        for d in self._each(COMPUTE_DOMAINS):
            self._release(d)
            if RUN_LABEL in (d["metadata"].get("labels") or {}):
                self._delete(COMPUTE_DOMAINS, d)
        # The IMEX daemon pods' claims are unprepared by the node plugin: let them go first.
        leftover = self._wait(
            "the IMEX daemon pods to terminate",
            self.config.domain_timeout,
            lambda: [_key(p) for p in self._each(PODS, ns, label_selector=cd.DOMAIN_LABEL)],
        )
        if leftover:
            log.warning("IMEX daemon pods still terminating: %s", ", ".join(leftover))

    def _release(self, domain: dict[str, Any]) -> None:
        """The controller's finalization, without the deletion: delete the objects carrying
        the domain's label, then drop the finalizer."""
        uid = domain["metadata"]["uid"]
        selector = f"{cd.DOMAIN_LABEL}={uid}"
        for kind, ns in (
            (CLAIM_TEMPLATES, domain["metadata"]["namespace"]),
            (CLAIM_TEMPLATES, self.config.namespace),
            (DAEMON_SETS, self.config.namespace),
        ):
            for obj in self._each(kind, ns, label_selector=selector):
                self._delete(kind, obj)
        name, namespace = domain["metadata"]["name"], domain["metadata"]["namespace"]
        for _ in range(RELIST_TRIES):
            finalizers = domain["metadata"].get("finalizers") or []
            if cd.FINALIZER not in finalizers:
                return
            idx = finalizers.index(cd.FINALIZER)
            patch = [
                {"op": "test", "path": f"/metadata/finalizers/{idx}", "value": cd.FINALIZER},
                {"op": "remove", "path": f"/metadata/finalizers/{idx}"},
            ]
            try:
                self.rest.patch(COMPUTE_DOMAINS, name, patch, namespace, content_type=JSON_PATCH)
            except NotFound:
                return
            except (Conflict, Invalid):
                # Its finalizers changed meanwhile: read it again and retry.
                fresh = self.rest.get_or_none(COMPUTE_DOMAINS, name, namespace)
                if fresh is None:
                    return
                domain = fresh
                continue
            self.report.add("computedomains/finalizer", _key(domain))
            self.report.released_domains.append(_key(domain))
            return
        raise CleanupError(f"ComputeDomain {_key(domain)}: its finalizer kept changing; run again")

    # -- 4. what they published ------------------------------------------------------------
    def remove_published(self) -> None:
        for driver in DRIVERS:
            self._remove_slices(driver)
        for record in self._each(NODE_DEVICES):
            self._delete(NODE_DEVICES, record)
        self._remove_node_labels(lambda key: key.startswith(LABEL_PREFIXES))
        self.remove_controller_objects()

    def _remove_slices(self, driver: str) -> None:
        for s in self._each(SLICES, field_selector=f"spec.driver={driver}"):
            self._delete(SLICES, s)

    def _remove_node_labels(self, ours: Callable[[str], bool]) -> None:
        for node in self._each(NODES):
            keys = [k for k in node["metadata"].get("labels", {}) if ours(k)]
            if keys:
                patch = {"metadata": {"labels": dict.fromkeys(keys)}}
                self.rest.patch(NODES, node["metadata"]["name"], patch)
                for k in keys:
                    self.report.add("nodes/labels", f"{node['metadata']['name']}:{k}")

    def remove_controller_objects(self) -> None:
        """What the controller made that no domain holds: objects of domains released no more
        (a domain deleted while no controller ran), report and leader Leases, its
        DeviceClasses."""
        ns = self.config.namespace
        for kind, where in ((CLAIM_TEMPLATES, None), (DAEMON_SETS, ns)):
            for obj in self._each(kind, where, label_selector=cd.DOMAIN_LABEL):
                self._delete(kind, obj)
        for lease in self._each(LEASES, ns, label_selector=cd.DOMAIN_LABEL):
            self._delete(LEASES, lease)
        leader = self.rest.get_or_none(LEASES, CONTROLLER_LEASE, ns)
        if leader is not None:
            self._delete(LEASES, leader)
        for name in (cd.CHANNEL_CLASS, cd.DAEMON_CLASS):
            cls = self.rest.get_or_none(DEVICE_CLASSES, name)
            if cls is not None:
                self._delete(DEVICE_CLASSES, cls)

    # -- computeDomains.enabled turned off ---------------------------------------------------
    def run_compute_domains(self) -> Report:
        """An upgrade that turns `computeDomains.enabled` off (the chart's pre-upgrade hook):
        the controller stopped, every domain released as on uninstall, then what the
        controller made removed: the compute-domain slices (it publishes them), its node
        labels (the node hold and `fabricdra.io/fabric-verified`), leftover domain objects,
        Leases and DeviceClasses. The node pods keep running (their devices plugin is still
        wanted); the compute-domain plugin's own `compute-domain.fabricdra.io/plugin` label
        stays, as that plugin sets it while it runs, until each node pod is replaced."""
        self.stop_components("controller")
        self.release_domains()
        self._remove_slices(cd.DRIVER)
        self._remove_node_labels(CONTROLLER_NODE_LABELS.__contains__)
        self.remove_controller_objects()
        return self.report
