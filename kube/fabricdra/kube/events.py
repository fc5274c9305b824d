"""The one builder of the core/v1 Events fabricdra records (the controller's on domains and
Nodes, the node agent's on its Node, NodeDevices record and claims): every Event body is made
here, so their shape (name, timestamps, count, source, message limit) cannot drift apart.

Callers send the body themselves (`Rest.create(EVENTS, body, namespace)`), each with its own
rule for a failed write: an Event is advice, and what a failure costs differs by caller.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from fabricdra.api.jsontypes import JSON

# The events.k8s.io/v1 API caps an Event's note (core/v1's message) at 1 kB ("Maximal length
# of the note is 1kB"): https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/
# Longer messages are cut here rather than refused by a server or client that enforces it.
MAX_MESSAGE = 1024

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (its `involvedObject`)."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any], *, api_version: str, kind: str) -> ObjectRef:
        """A reference to an object as read from the API (`api_version`/`kind`: the defaults
        for an object whose body does not say, as a typed client's objects do not)."""
        meta = obj.get("metadata") or {}
        return cls(
            api_version=str(obj.get("apiVersion") or api_version),
            kind=str(obj.get("kind") or kind),
            name=str(meta.get("name")),
            namespace=meta.get("namespace"),
            uid=meta.get("uid"),
        )


@dataclass(frozen=True, slots=True)
class Reporter:
    """Who records the Event: `source` (the legacy fields kubectl shows) and, where set, the
    `reportingComponent`/`reportingInstance` pair newer clients read."""

    component: str
    host: str | None = None
    reporting_component: str | None = None
    reporting_instance: str | None = None


def event(
    about: ObjectRef,
    reporter: Reporter,
    *,
    type: EventType,
    reason: str,
    message: str,
    namespace: str | None,
    now: datetime | None = None,
) -> JSON:
    """A new Event's body, to be created in `namespace` (cluster-scoped objects' Events go to
    `default`, where kubelet records a Node's)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved: JSON = {"apiVersion": about.api_version, "kind": about.kind, "name": about.name}
    if about.namespace is not None:
        involved["namespace"] = about.namespace
    if about.uid is not None:
        involved["uid"] = about.uid
    source: JSON = {"component": reporter.component}
    if reporter.host is not None:
        source["host"] = reporter.host
    metadata: JSON = {"name": f"{about.name}.{uuid.uuid4().hex[:12]}"}
    if namespace is not None:
        metadata["namespace"] = namespace
    body: JSON = {
        "metadata": metadata,
        "involvedObject": involved,
        "type": type,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": source,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    if reporter.reporting_component is not None:
        body["reportingComponent"] = reporter.reporting_component
    if reporter.reporting_instance is not None:
        body["reportingInstance"] = reporter.reporting_instance
    return body
