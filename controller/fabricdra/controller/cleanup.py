"""`fabricdra cleanup`: remove what fabricdra's running components made, before `helm uninstall`
removes the components themselves (the chart runs it as its pre-delete hook Job).

Helm deletes only the objects of its chart. The components made more: ResourceSlices of both
drivers, a NodeDevices per node, node labels, and per ComputeDomain claim templates and IMEX
DaemonSets. The order below is what makes their removal clean:

1. Every ComputeDomain is deleted while the controller still runs, so the controller finalizes
   each one as it always does (claim templates, IMEX DaemonSet), and the IMEX daemon pods'
   claims are unprepared by a node plugin that is still there. A domain the controller has not
   finalized within `domain_timeout` (no controller, a stuck one) is finalized here: its
   objects deleted by the domain label, then its finalizer dropped.
2. The release's components (its DaemonSets and Deployments) are deleted and their pods awaited:
   after that nothing publishes again what step 3 removes.
3. What they published is deleted: slices, NodeDevices, labels by prefix, leftover domain
   objects, the report and leader Leases, and the DeviceClasses the controller created.

Every step is idempotent (a second run after a failure finishes the job) and an object already
gone is not an error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.api import labels
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
    ApiError,
    Kind,
    Rest,
)

log = logging.getLogger("fabricdra.cleanup")

DEVICES_DRIVER = "devices.fabricdra.io"
DRIVERS = (DEVICES_DRIVER, cd.DRIVER)
LABEL_PREFIXES = (labels.PREFIX, "compute-domain.fabricdra.io/")
DEPLOYMENTS = Kind("apps", "v1", "deployments", True)
# The controller's leader Lease (ControllerConfig.lease_name); the reports carry the domain label.
CONTROLLER_LEASE = "fabricdra-compute-domain-controller"
COMPONENTS = "(node,controller)"  # app.kubernetes.io/component of the chart's workloads


@dataclass
class CleanupConfig:
    namespace: str  # the release's namespace: components, IMEX DaemonSets, Leases
    release: str  # the Helm release whose DaemonSets and Deployments are stopped
    domain_timeout: float = 60.0  # how long the controller gets to finalize the domains
    stop_timeout: float = 120.0  # how long the components' pods get to terminate
    poll: float = 1.0


@dataclass
class Report:
    """What was removed, by kind (printed as the command's output)."""

    removed: dict[str, list[str]] = field(default_factory=dict)
    forced_domains: list[str] = field(default_factory=list)

    def add(self, kind: str, name: str) -> None:
        self.removed.setdefault(kind, []).append(name)
        log.info("removed %s %s", kind, name)

    def as_json(self) -> dict[str, Any]:
        return {"removed": self.removed, "forcedDomains": self.forced_domains}


class CleanupError(Exception):
    """Cleanup could not finish; the message says what is left and why."""


def _items(rest: Rest, kind: Kind, namespace: str | None = None, **selectors: str) -> list[Any]:
    """The objects of `kind`, or [] when the kind is not served (its CRD already gone)."""
    try:
        listing = rest.list(
            kind,
            namespace,
            label_selector=selectors.get("label_selector"),
            field_selector=selectors.get("field_selector"),
        )
        items: list[Any] = listing.get("items", [])
    except ApiError as e:
        if e.not_found:
            return []
        raise
    return items


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
        self.remove_domains()
        self.stop_components()
        self.remove_published()
        return self.report

    # -- helpers -------------------------------------------------------------------------
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

    # -- 1. ComputeDomains ---------------------------------------------------------------
    def remove_domains(self) -> None:
        ns = self.config.namespace
        domains = _items(self.rest, COMPUTE_DOMAINS)
        for d in domains:
            if not d["metadata"].get("deletionTimestamp"):
                self._delete(COMPUTE_DOMAINS, d)
            else:
                log.info("ComputeDomain %s is already being deleted", _key(d))
        if domains:
            left = self._wait(
                "the controller to finalize the ComputeDomains",
                self.config.domain_timeout,
                lambda: [_key(d) for d in _items(self.rest, COMPUTE_DOMAINS)],
            )
            for d in _items(self.rest, COMPUTE_DOMAINS):
                log.warning("ComputeDomain %s not finalized by the controller: finalizing", _key(d))
                self._force_finalize(d)
            if left:
                self.report.forced_domains.extend(left)
        # The IMEX daemon pods' claims are unprepared by the node plugin: let them go first.
        leftover = self._wait(
            "the IMEX daemon pods to terminate",
            self.config.stop_timeout,
            lambda: [_key(p) for p in _items(self.rest, PODS, ns, label_selector=cd.DOMAIN_LABEL)],
        )
        if leftover:
            log.warning("IMEX daemon pods still terminating: %s", ", ".join(leftover))

    def _force_finalize(self, domain: dict[str, Any]) -> None:
        """The controller's finalization, for a domain it did not finalize: delete the objects
        carrying the domain's label, then drop the finalizer."""
        uid = domain["metadata"]["uid"]
        selector = f"{cd.DOMAIN_LABEL}={uid}"
        for kind, ns in (
            (CLAIM_TEMPLATES, domain["metadata"]["namespace"]),
            (CLAIM_TEMPLATES, self.config.namespace),
            (DAEMON_SETS, self.config.namespace),
        ):
            for obj in _items(self.rest, kind, ns, label_selector=selector):
                self._delete(kind, obj)
        finalizers = domain["metadata"].get("finalizers") or []
        if cd.FINALIZER not in finalizers:
            return
        idx = finalizers.index(cd.FINALIZER)
        patch = [
            {"op": "test", "path": f"/metadata/finalizers/{idx}", "value": cd.FINALIZER},
            {"op": "remove", "path": f"/metadata/finalizers/{idx}"},
        ]
        try:
            self.rest.patch(
                COMPUTE_DOMAINS,
                domain["metadata"]["name"],
                patch,
                domain["metadata"]["namespace"],
                content_type=JSON_PATCH,
            )
        except ApiError as e:
            if not (
                e.not_found or e.status in (409, 422)
            ):  # gone, or the controller got there first
                raise
        self.report.add("computedomains/finalizer", _key(domain))

    # -- 2. the components -----------------------------------------------------------------
    def stop_components(self) -> None:
        ns, release = self.config.namespace, self.config.release
        # The chart's node DaemonSet and controller Deployment (not the cleanup Job's own pod).
        selector = (
            f"app.kubernetes.io/instance={release},app.kubernetes.io/component in {COMPONENTS}"
        )
        for kind in (DAEMON_SETS, DEPLOYMENTS):
            for obj in _items(self.rest, kind, ns, label_selector=selector):
                self._delete(kind, obj)
        left = self._wait(
            "the components' pods to terminate",
            self.config.stop_timeout,
            lambda: [_key(p) for p in _items(self.rest, PODS, ns, label_selector=selector)],
        )
        if left:
            # A pod still running may publish again what step 3 removes: do not pretend.
            raise CleanupError(
                f"pods of release {release} in {ns} did not terminate within "
                f"{self.config.stop_timeout:.0f}s: {', '.join(left)}; nothing they published "
                "was removed (run the cleanup again once they are gone)"
            )

    # -- 3. what they published ------------------------------------------------------------
    def remove_published(self) -> None:
        ns = self.config.namespace
        for driver in DRIVERS:
            for s in _items(self.rest, SLICES, field_selector=f"spec.driver={driver}"):
                self._delete(SLICES, s)
        for record in _items(self.rest, NODE_DEVICES):
            self._delete(NODE_DEVICES, record)
        for node in _items(self.rest, NODES):
            keys = [k for k in node["metadata"].get("labels", {}) if k.startswith(LABEL_PREFIXES)]
            if keys:
                patch = {"metadata": {"labels": dict.fromkeys(keys)}}
                self.rest.patch(NODES, node["metadata"]["name"], patch)
                for k in keys:
                    self.report.add("nodes/labels", f"{node['metadata']['name']}:{k}")
        # Objects of domains the controller finalized no more (it was gone before the domain).
        for kind, where in ((CLAIM_TEMPLATES, None), (DAEMON_SETS, ns)):
            for obj in _items(self.rest, kind, where, label_selector=cd.DOMAIN_LABEL):
                self._delete(kind, obj)
        for lease in _items(self.rest, LEASES, ns, label_selector=cd.DOMAIN_LABEL):
            self._delete(LEASES, lease)
        leader = self.rest.get_or_none(LEASES, CONTROLLER_LEASE, ns)
        if leader is not None:
            self._delete(LEASES, leader)
        for name in (cd.CHANNEL_CLASS, cd.DAEMON_CLASS):
            cls = self.rest.get_or_none(DEVICE_CLASSES, name)
            if cls is not None:
                self._delete(DEVICE_CLASSES, cls)
