"""One Event builder (kube/events.py): every Event body fabricdra writes is made there.

Four modules hand-built their own (controller writes, the agent's API facts, prepare's claim
warnings, device health); the last test reads the product source so a fifth cannot appear."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.api.jsontypes import JSON
from fabricdra.controller.status import Event
from fabricdra.controller.writes import Writer
from fabricdra.kube.events import MAX_MESSAGE, ObjectRef, Reporter, event
from fabricdra.kube.rest import EVENTS, Kind

from .sources import parsed

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "cli", "controller", "kube", "kubeletplugin")
BUILDER = ROOT / "kube" / "fabricdra" / "kube" / "events.py"
# Keys only an Event body has: a dict literal with one of them is a hand-built Event.
EVENT_KEYS = {"involvedObject", "firstTimestamp", "lastTimestamp", "reportingComponent"}

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_a_full_event() -> None:
    body = event(
        ObjectRef("v1", "Node", "n1", uid="u1"),
        Reporter("comp", "host-a", "fabricdra.io/x", "inst"),
        type="Warning",
        reason="Why",
        message="what",
        namespace="default",
        now=NOW,
    )
    name = body["metadata"].pop("name")
    assert name.startswith("n1.")
    assert len(name) == len("n1.") + 12
    assert body == {
        "metadata": {"namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"},
        "type": "Warning",
        "reason": "Why",
        "message": "what",
        "source": {"component": "comp", "host": "host-a"},
        "firstTimestamp": "2026-01-02T03:04:05Z",
        "lastTimestamp": "2026-01-02T03:04:05Z",
        "count": 1,
        "reportingComponent": "fabricdra.io/x",
        "reportingInstance": "inst",
    }


def test_unset_fields_are_left_out_and_long_messages_cut() -> None:
    body = event(
        ObjectRef("v1", "Node", "n1"),
        Reporter("comp"),
        type="Normal",
        reason="R",
        message="x" * (MAX_MESSAGE + 10),
        namespace=None,
        now=NOW,
    )
    assert set(body["metadata"]) == {"name"}
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}
    assert body["source"] == {"component": "comp"}
    assert "reportingComponent" not in body
    assert "reportingInstance" not in body
    assert body["message"] == "x" * MAX_MESSAGE
    assert body["type"] == "Normal"


def test_a_reference_from_an_object_as_read() -> None:
    claim = {"metadata": {"name": "c", "namespace": "ns", "uid": "u"}}
    assert ObjectRef.of(claim, api_version="resource.k8s.io/v1", kind="ResourceClaim") == (
        ObjectRef("resource.k8s.io/v1", "ResourceClaim", "c", "ns", "u")
    )
    record = {
        "apiVersion": "fabricdra.io/v1alpha1",
        "kind": "NodeDevices",
        "metadata": {"name": "n"},
    }
    ref = ObjectRef.of(record, api_version="v1", kind="Node")
    assert (ref.api_version, ref.kind, ref.namespace, ref.uid) == (
        "fabricdra.io/v1alpha1",
        "NodeDevices",
        None,
        None,
    )


class _Rest:
    def __init__(self) -> None:
        self.created: list[tuple[Kind, JSON, str | None]] = []

    def create(self, kind: Kind, body: JSON, namespace: str | None = None, **_: Any) -> JSON:
        self.created.append((kind, body, namespace))
        return body


def test_the_controller_records_through_the_builder() -> None:
    rest = _Rest()
    writer = Writer(rest, "ctrl-0")  # type: ignore[arg-type]
    meta = {"name": "d", "namespace": "ns", "uid": "u"}
    writer.domain_event(meta, Event("Warning", "Unreadable", "m"))
    writer.node_event("n1", Event("Normal", "NodeJoined", "m"))
    (k1, b1, ns1), (k2, b2, ns2) = rest.created
    assert (k1, ns1, k2, ns2) == (EVENTS, "ns", EVENTS, "default")
    assert b1["involvedObject"] == {
        "apiVersion": cd.API_VERSION,
        "kind": cd.KIND,
        "name": "d",
        "namespace": "ns",
        "uid": "u",
    }
    assert b2["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"}
    for b in (b1, b2):
        assert b["source"] == {"component": "fabricdra-controller"}
        assert b["reportingComponent"] == "fabricdra.io/compute-domain-controller"
        assert b["reportingInstance"] == "ctrl-0"


def test_no_module_but_the_builder_builds_an_event_body() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package / "fabricdra").rglob("*.py")):
            if path == BUILDER:
                continue
            for node in ast.walk(parsed(path)):
                if not isinstance(node, ast.Dict):
                    continue
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if keys & EVENT_KEYS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"Event bodies built outside kube/events.py: {found}"
