"""The controller's writes to the API server, in one place: every one goes through a
CountingRest (kube/rest.py), whose hook feeds the `fabricdra_controller_api_writes_total`
counter, so the metric, the bench and the tests count the same thing."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.jsontypes import JSON
from fabricdra.kube import events
from fabricdra.kube.events import ObjectRef, Reporter
from fabricdra.kube.rest import (
    DEVICE_CLASSES,
    EVENTS,
    NAMESPACES,
    ApiError,
    Conflict,
    CountingRest,
    Kind,
)

from . import metrics, objects
from .status import Event

log = logging.getLogger("fabricdra.controller")
FIELD_MANAGER = "fabricdra-compute-domain-controller"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _count(kind: Kind, verb: str) -> None:
    metrics.API_WRITES.labels(kind.plural, verb).inc()


def counting_rest(api_client: Any) -> CountingRest:
    return CountingRest(api_client, on_write=_count)


class Writer:
    def __init__(self, rest: CountingRest, identity: str) -> None:
        self.rest, self.identity = rest, identity

    def create(self, kind: Kind, body: JSON, namespace: str | None = None) -> JSON | None:
        """Create; None if it already existed (409)."""
        try:
            return self.rest.create(kind, body, namespace)
        except Conflict:
            return None

    def get(self, kind: Kind, name: str, namespace: str | None) -> JSON | None:
        return self.rest.get_or_none(kind, name, namespace)

    def event(self, domain: ComputeDomain, ev: Event) -> None:
        """A best-effort Event on a ComputeDomain."""
        self.domain_event(domain.metadata, ev)

    def domain_event(self, meta: JSON, ev: Event) -> None:
        """The same from the domain's metadata alone (a domain this controller cannot read)."""
        namespace = str(meta.get("namespace", ""))
        about = ObjectRef(
            cd.API_VERSION,
            cd.KIND,
            str(meta.get("name", "")),
            namespace,
            str(meta.get("uid", "")),
        )
        self._event(namespace, about, ev)

    def node_event(self, node: str, ev: Event) -> None:
        """A best-effort Event on a Node (in `default`, where the kubelet's node Events go)."""
        self._event("default", ObjectRef("v1", "Node", node, uid=node), ev)

    def _event(self, namespace: str, about: ObjectRef, ev: Event) -> None:
        reporter = Reporter(
            "fabricdra-controller",
            reporting_component="fabricdra.io/compute-domain-controller",
            reporting_instance=self.identity,
        )
        body = events.event(
            about, reporter, type=ev.type, reason=ev.reason, message=ev.message, namespace=namespace
        )
        try:
            self.create(EVENTS, body, namespace)
        except ApiError as e:  # events are best effort
            log.info("event %s for %s %s: %s", ev.reason, about.kind, about.name, e)

    def ensure_namespace(self, name: str) -> None:
        if self.rest.get_or_none(NAMESPACES, name) is None:
            self.create(NAMESPACES, {"metadata": {"name": name}})

    def ensure_device_classes(self) -> None:
        """Create the driver's DeviceClasses, or bring them to this version's shape: an upgrade
        that changes a selector must reach classes an older controller made."""
        for dc in objects.device_classes():
            if self.create(DEVICE_CLASSES, dc) is not None:
                continue
            live = self.rest.get_or_none(DEVICE_CLASSES, dc["metadata"]["name"])
            if live is None or not objects.differs(dc["spec"], live.get("spec")):
                continue
            body = {**dc, "metadata": {**live["metadata"], **dc["metadata"]}}
            log.info("updating DeviceClass %s to this version", dc["metadata"]["name"])
            self.rest.replace(DEVICE_CLASSES, dc["metadata"]["name"], body)
