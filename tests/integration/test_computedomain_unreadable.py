"""Issue 29, point 9: a ComputeDomain the controller cannot read, against a real kube-apiserver.

The CRD is generated from the controller's model, so everything the model refuses the CRD
refuses too: such an object exists only when the cluster's CRD is newer than the controller
(a newer release installed its CRD and wrote a field of it; the controller was rolled back,
and the CRD stayed, as Helm leaves CRDs on a rollback). The tests install that newer CRD (the
same schema plus a `status.newerField` a newer controller writes), let this controller make a
domain's objects, then write the newer field as the newer controller would. Before: the
domain was only logged ("invalid"), said nothing to its user, and its deletion never
finished (the finalizer, DaemonSet and claim templates stayed)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import CLAIM_TEMPLATES, COMPUTE_DOMAINS, DAEMON_SETS, EVENTS, Rest

from .computedomain_helpers import (
    CRD_FILE,
    CRDS,
    condition,
    domain_body,
    new_namespace,
    running_controller,
    unique,
    wait_gone,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]


def _replace_crd(rest: Rest, body: dict[str, Any]) -> None:
    live = rest.get(CRDS, body["metadata"]["name"])
    new = copy.deepcopy(body)
    new["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
    rest.replace(CRDS, body["metadata"]["name"], new)
    # A schema change re-creates the resource's storage (429 "storage is (re)initializing"
    # meanwhile): wait until a write is served under this schema, which keeps the newer
    # field or prunes it.
    keeps = "newerField" in json.dumps(body)
    wait_for(lambda: _keeps_newer_field(rest) == keeps, what="the CRD's schema served")


def _keeps_newer_field(rest: Rest) -> bool:
    """Whether the API server now stores `status.newerField` (no controller runs: the probe
    domain gets no finalizer and goes at once)."""
    name = unique("crd-probe")
    rest.create(COMPUTE_DOMAINS, domain_body(name), "default")
    try:
        rest.patch(COMPUTE_DOMAINS, name, {"status": {"newerField": "v2"}}, "default", sub="status")
        return "newerField" in rest.get(COMPUTE_DOMAINS, name, "default").get("status", {})
    finally:
        rest.delete(COMPUTE_DOMAINS, name, "default")


@contextmanager
def newer_crd(rest: Rest) -> Iterator[None]:
    """The CRD as a newer release would ship it: a status field this controller's model does
    not know. The release's own CRD is put back afterwards (the control plane is shared)."""
    ours = yaml.safe_load(CRD_FILE.read_text())
    newer = copy.deepcopy(ours)
    status = newer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    status["properties"]["newerField"] = {"type": "string"}
    _replace_crd(rest, newer)
    try:
        yield
    finally:
        _replace_crd(rest, ours)


def _write_newer_field(rest: Rest, ns: str, name: str) -> None:
    """What the newer controller writes (the newer schema is served: newer_crd waited)."""
    rest.patch(COMPUTE_DOMAINS, name, {"status": {"newerField": "v2"}}, ns, sub="status")
    assert rest.get(COMPUTE_DOMAINS, name, ns)["status"]["newerField"] == "v2"


def _objects_made(rest: Rest, ns: str, driver_ns: str, name: str) -> str:
    """Wait for the domain's finalizer, workload template, daemon template and DaemonSet;
    returns its UID."""
    obj = wait_for(
        lambda: (
            (o := rest.get(COMPUTE_DOMAINS, name, ns))
            and cd.FINALIZER in o["metadata"].get("finalizers", [])
            and o
        ),
        what="finalizer",
    )
    uid = str(obj["metadata"]["uid"])
    wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, f"{name}-channel", ns), what="template")
    for kind in (DAEMON_SETS, CLAIM_TEMPLATES):
        wait_for(
            lambda kind=kind: _by_uid(rest, kind, driver_ns, uid), what=f"daemon {kind.plural}"
        )
    return uid


def _by_uid(rest: Rest, kind: Any, ns: str, uid: str) -> list[str]:
    items = rest.list(kind, ns, label_selector=f"{cd.DOMAIN_LABEL}={uid}")["items"]
    return [i["metadata"]["name"] for i in items]


@contextmanager
def unreadable_domain(cp: ControlPlane, rest: Rest, name: str) -> Iterator[tuple[str, str, str]]:
    """Under the newer CRD and a running controller: domain `name` with the objects this
    controller made for it, then the newer controller's field. Yields (namespace, the
    controller's namespace, the domain's UID)."""
    ns, driver_ns = new_namespace(cp, f"cd-{name}"), unique("cd-system")
    with newer_crd(rest), running_controller(cp, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body(name), ns)
        uid = _objects_made(rest, ns, driver_ns, name)
        _write_newer_field(rest, ns, name)
        yield ns, driver_ns, uid


def test_a_domain_this_controller_cannot_read_says_why(
    control_plane: ControlPlane, rest: Rest
) -> None:
    with unreadable_domain(control_plane, rest, "newer") as (ns, driver_ns, uid):
        ready = wait_for(
            lambda: (
                (c := condition(rest.get(COMPUTE_DOMAINS, "newer", ns), cd.READY))
                and c["reason"] == "Unreadable"
                and c
            ),
            what="Ready=False, Unreadable",
        )
        assert ready["status"] == "False"
        assert "status.newerField" in ready["message"]
        assert "newer fabricdra" in ready["message"]
        events = wait_for(
            lambda: [
                e
                for e in rest.list(EVENTS, ns)["items"]
                if e["involvedObject"]["uid"] == uid and e["reason"] == "Unreadable"
            ],
            what="a Warning Event saying why",
        )
        assert events[0]["type"] == "Warning"
        assert "status.newerField" in events[0]["message"]
        # What it holds stays held: its objects are neither changed nor removed.
        assert _by_uid(rest, DAEMON_SETS, driver_ns, uid)
        assert rest.get_or_none(CLAIM_TEMPLATES, "newer-channel", ns) is not None
        rest.delete(COMPUTE_DOMAINS, "newer", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "newer", ns), "newer")


def test_a_domain_this_controller_cannot_read_is_still_cleaned_up_on_deletion(
    control_plane: ControlPlane, rest: Rest
) -> None:
    with unreadable_domain(control_plane, rest, "gone") as (ns, driver_ns, uid):
        rest.delete(COMPUTE_DOMAINS, "gone", ns)
        # Not left Terminating: the objects made for it go, then its finalizer.
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "gone", ns), "the domain", 60)
        assert rest.get_or_none(CLAIM_TEMPLATES, "gone-channel", ns) is None
        assert _by_uid(rest, DAEMON_SETS, driver_ns, uid) == []
        assert _by_uid(rest, CLAIM_TEMPLATES, driver_ns, uid) == []
