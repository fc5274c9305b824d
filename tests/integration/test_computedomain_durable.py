"""ComputeDomains that survive a crash and a failover (issue 22), against a real kube-apiserver.

The controller is stopped between two of its writes by a ValidatingAdmissionPolicy that
refuses the second (`refused_status_writes`): nothing of the code under test is patched, and
what a crash there would leave is exactly what the API holds when the refusal is seen. A
stopped controller's memory is gone; the next one (a restart or a standby taking over) has
only the API to go on."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.labels import FABRIC_DOMAIN
from fabricdra.controller import objects
from fabricdra.controller.claims import channel_of
from fabricdra.controller.manager import Controller, ControllerConfig
from fabricdra.controller.objects import DaemonSettings
from fabricdra.kube.rest import CLAIM_TEMPLATES, CLAIMS, COMPUTE_DOMAINS, NODES, SLICES, Rest
from fabricdra.kubeletplugin.computedomain.report import write_host_report

from .computedomain_helpers import (
    allocate_claim,
    condition,
    create_plugin_node,
    domain_body,
    new_namespace,
    refused_status_writes,
    running_controller,
    unique,
    wait_gone,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]


def _refused(caplog: pytest.LogCaptureFixture, marker: str, about: str) -> bool:
    """The controller logged a write refused by the test policy while working on `about`."""
    return any(marker in r.getMessage() and about in r.getMessage() for r in caplog.records)


def _template_decisions(rct: dict[str, Any]) -> tuple[int | None, str | None]:
    """(channel, fabric domain) a workload claim template hands every claim made from it."""
    claim = {"spec": rct["spec"]["spec"], "status": {"allocation": {"devices": {"results": [{}]}}}}
    cel = str(rct["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0])
    fabric = (
        cel.split("fabricDomain == '", 1)[1].split("'", 1)[0] if "fabricDomain" in cel else None
    )
    return channel_of(claim), fabric


def test_a_claim_template_never_exists_before_the_decisions_it_carries_are_recorded(
    control_plane: ControlPlane, rest: Rest, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22 point 1. The workload claim template carries the domain's channel and (a
    gang's) fabric domain; a restarted controller reads them from status. So the status
    records them before the template exists: with the status write refused, there is no
    template. Today's order (template, then status) left one carrying channel 1 in fabric
    domain A while status said nothing; restarted after another domain freed channel 0 and
    another gang took A, the controller gave the domain channel 0 in B, and every claim of
    its running pods (channel 1, fabric A) conflicted. After the restart here, the domain
    keeps what the first controller decided whenever anything carries it."""
    ns, other_ns, driver_ns = (
        new_namespace(control_plane, "cd-dur1"),
        new_namespace(control_plane, "cd-dur1o"),
        (unique("cd-system")),
    )
    racks = [unique("0dur1a"), unique("0dur1b")]  # sort first: placement is first fit
    for rack in racks:
        for _ in range(2):
            create_plugin_node(control_plane, unique("dur1"), rack)
    recorded = (
        "has(object.status) && ((has(object.status.channels) && size(object.status.channels)"
        " > 0) || (has(object.status.fabricDomain) && object.status.fabricDomain != ''))"
    )
    with (
        refused_status_writes(rest, ns, recorded) as marker,
        running_controller(control_plane, driver_ns, leader_election=False),
    ):
        rest.create(COMPUTE_DOMAINS, domain_body("early", mode="host"), other_ns)
        wait_for(
            lambda: rest.get(COMPUTE_DOMAINS, "early", other_ns)["status"].get("channels"),
            what="the other domain's channel",
        )
        rest.create(COMPUTE_DOMAINS, domain_body("job", mode="host", num_nodes=2), ns)
        wait_for(
            lambda: _refused(caplog, marker, f"{ns}/job"),
            what="the controller's status write for the job refused",
        )
        # What a crash at this step leaves behind.
        at_crash = rest.get_or_none(CLAIM_TEMPLATES, "job-channel", ns)
        assert at_crash is None, (
            f"the claim template exists (carrying {_template_decisions(at_crash)}) "
            "while the domain's status records neither its channel nor its placement"
        )
        rest.delete(COMPUTE_DOMAINS, "early", other_ns)  # frees its channel
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "early", other_ns), "early gone")
    # The controller is gone (its memory with it), and the status writes go through again.
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, domain_body("late", mode="host", num_nodes=2), other_ns)
        rct = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, "job-channel", ns),
            what="the job's template",
        )
        status = rest.get(COMPUTE_DOMAINS, "job", ns)["status"]
        channel, fabric = _template_decisions(rct)
        assert status["channels"] == [channel]
        assert status["fabricDomain"] == fabric


def _answer(rest: Rest, ns: str, claim: str) -> str | None:
    devices = rest.get(CLAIMS, claim, ns)["status"].get("devices", []) or []
    for cond in (c for d in devices for c in d.get("conditions", []) or []):
        if cond["type"] in (cd.ADMITTED_CONDITION, cd.CONFLICT_CONDITION):
            return str(cond["type"])
    return None


def test_an_elastic_domains_fabric_pin_is_recorded_before_its_first_admission(
    control_plane: ControlPlane, rest: Rest, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22 point 2. An elastic domain's first admission fixes its fabric domain. The
    leader dies after that decision but before the status write that records the pin (the
    write refused here); a standby takes over and the domain's next claim arrives on a node
    of another fabric domain. Only one of the two claims may be admitted: one domain never
    spans two NVLink fabrics. Today the pin lived in the dead leader's memory, so both were
    admitted (FabricConflict)."""
    ns, driver_ns = new_namespace(control_plane, "cd-dur2"), unique("cd-system")
    near, far = unique("dur2-a"), unique("dur2-b")
    create_plugin_node(control_plane, near, unique("dur2fa"))
    create_plugin_node(control_plane, far, unique("dur2fb"))
    pinned = (
        "has(object.status) && has(object.status.fabricDomain) && object.status.fabricDomain != ''"
    )
    lease = unique("cd-controller")

    def replica() -> Controller:
        cfg = ControllerConfig(
            namespace=driver_ns,
            daemon=DaemonSettings(namespace=driver_ns),
            resync_seconds=5.0,
            lease_name=lease,
            identity=unique("replica"),
        )
        return Controller(control_plane.api_client(), cfg)

    leader, standby = replica(), replica()
    try:
        with refused_status_writes(rest, ns, pinned) as marker:
            leader.start()
            assert leader.elector is not None
            assert leader.elector.leading.wait(30)
            standby.start()
            rest.create(COMPUTE_DOMAINS, domain_body("elastic", mode="host"), ns)
            obj = wait_for(
                lambda: (
                    (o := rest.get(COMPUTE_DOMAINS, "elastic", ns))["status"].get("channels") and o
                ),
                what="channel recorded",
            )
            domain = ComputeDomain.model_validate(obj)
            template = objects.workload_claim_template(domain, domain.status.channels[0])
            allocate_claim(rest, ns, template, near, "first", binding_conditions=True)
            wait_for(
                lambda: _refused(caplog, marker, near) or _refused(caplog, marker, f"{ns}/elastic"),
                what="the leader's write of the pin refused",
            )
            leader.stop()  # dies here; the standby takes over
        assert standby.elector is not None
        assert standby.elector.leading.wait(60)
        allocate_claim(rest, ns, template, far, "second", binding_conditions=True)
        answers = wait_for(
            lambda: (
                (a := {c: _answer(rest, ns, c) for c in ("first", "second")})
                and None not in a.values()
                and a
            ),
            what="both claims answered",
        )
        admitted = [c for c, a in answers.items() if a == cd.ADMITTED_CONDITION]
        assert len(admitted) == 1, f"admitted in two fabric domains: {answers}"
        where = {"first": near, "second": far}[admitted[0]]
        fabric = rest.get(NODES, where)["metadata"]["labels"][FABRIC_DOMAIN]
        assert rest.get(COMPUTE_DOMAINS, "elastic", ns)["status"]["fabricDomain"] == fabric
    finally:
        leader.stop()
        standby.stop()


def _row(rest: Rest, ns: str, name: str, node: str) -> dict[str, Any] | None:
    rows = rest.get(COMPUTE_DOMAINS, name, ns)["status"].get("nodes", []) or []
    return next((r for r in rows if r["name"] == node), None)


def test_a_held_node_that_disappears_keeps_its_row_and_hold_while_its_claim_exists(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Issue 22 point 6. A held node's Node object goes (its plugin label with it, for the
    controller) while its pod's claim is still allocated. Its row must not change (its
    fabric domain did not: today it turned "" and the domain said Degraded=FabricConflict
    about its own node), a restarted controller must still hold it for the domain (today
    the hold lived only in the node's slice, removed with the node), and once the claim is
    gone, row and hold go too."""
    ns, driver_ns = new_namespace(control_plane, "cd-dur6"), unique("cd-system")
    node, fabric = unique("dur6"), unique("dur6f")
    create_plugin_node(control_plane, node, fabric)
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, domain_body("keep", mode="host"), ns)
        obj = wait_for(
            lambda: (o := rest.get(COMPUTE_DOMAINS, "keep", ns))["status"].get("channels") and o,
            what="channel recorded",
        )
        domain = ComputeDomain.model_validate(obj)
        template = objects.workload_claim_template(domain, domain.status.channels[0])
        allocate_claim(rest, ns, template, node, "held", binding_conditions=True)
        wait_for(lambda: _answer(rest, ns, "held") == cd.ADMITTED_CONDITION, what="admitted")
        wait_for(lambda: _row(rest, ns, "keep", node), what="row")
        rest.delete(NODES, node)
        wait_gone(lambda: rest.get_or_none(SLICES, objects.slice_name(node)), "its slice")
        # A status write after the node went (the host IMEX report changes the row).
        write_host_report(rest, driver_ns, node, ready=True, message="gone", lease_seconds=600)
        row = wait_for(
            lambda: (r := _row(rest, ns, "keep", node)) and r["message"] == "gone" and r,
            what="the row after the node went",
        )
        assert row["fabricDomain"] == fabric
        degraded = condition(rest.get(COMPUTE_DOMAINS, "keep", ns), cd.DEGRADED) or {}
        assert degraded.get("reason") != "FabricConflict", degraded
    with running_controller(control_plane, driver_ns, leader_election=False):
        # Restarted: the node still held for the domain (its row still follows its report).
        write_host_report(rest, driver_ns, node, ready=True, message="still", lease_seconds=600)
        row = wait_for(
            lambda: (r := _row(rest, ns, "keep", node)) and r["message"] == "still" and r,
            what="the row followed by the restarted controller",
        )
        assert row["fabricDomain"] == fabric
        rest.delete(CLAIMS, "held", ns)
        wait_for(lambda: _row(rest, ns, "keep", node) is None, what="row gone with the claim")
        rest.delete(COMPUTE_DOMAINS, "keep", ns)
        wait_gone(lambda: rest.get_or_none(COMPUTE_DOMAINS, "keep", ns), "keep deleted")


def test_a_restarted_controller_holds_a_gone_node_before_its_workers_decide(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """A held node whose Node (and so its slice) went while its claim is still allocated:
    a restarted controller must know the hold when its rebuild ends, before any worker runs.
    Learnt later (by the node worker, from the claims), a domain worker that ran first wrote
    the domain's status without the node's row, and the row came back with fabric domain ""
    (nothing left to read it from): test_a_held_node_that_disappears_... failed now and
    then. Checked on a standby (caches synced, no worker: it does not lead), whose rebuild
    is run as a new leader runs it."""
    ns, driver_ns = new_namespace(control_plane, "cd-dur7"), unique("cd-system")
    node = unique("dur7")
    create_plugin_node(control_plane, node, unique("dur7f"))
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, domain_body("keep", mode="host"), ns)
        obj = wait_for(
            lambda: (o := rest.get(COMPUTE_DOMAINS, "keep", ns))["status"].get("channels") and o,
            what="channel recorded",
        )
        domain = ComputeDomain.model_validate(obj)
        template = objects.workload_claim_template(domain, domain.status.channels[0])
        allocate_claim(rest, ns, template, node, "held", binding_conditions=True)
        wait_for(lambda: _answer(rest, ns, "held") == cd.ADMITTED_CONDITION, what="admitted")
        rest.delete(NODES, node)
        wait_gone(lambda: rest.get_or_none(SLICES, objects.slice_name(node)), "its slice")
    lease = unique("cd-controller")

    def replica() -> Controller:
        cfg = ControllerConfig(
            namespace=driver_ns,
            daemon=DaemonSettings(namespace=driver_ns),
            lease_name=lease,
            identity=unique("replica"),
        )
        return Controller(control_plane.api_client(), cfg)

    leader, standby = replica(), replica()
    try:
        leader.start()
        assert leader.elector is not None
        assert leader.elector.leading.wait(30)
        standby.start()
        wait_for(
            lambda: all(i.has_synced() for i in standby._informers), what="standby caches synced"
        )
        assert standby.elector is not None
        assert not standby.elector.leading.is_set()
        standby._rebuild_owners()
        assert standby.ownership.owner(node) == domain.uid
    finally:
        leader.stop()
        standby.stop()
        rest.delete(CLAIMS, "held", ns)
