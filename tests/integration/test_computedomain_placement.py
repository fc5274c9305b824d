"""Gang placement on a changing rack (issue 22 point 3), against a real kube-apiserver: only
nodes that can take a pod now count (controller/capacity.py), and a gang that timed out is
placed again without the nodes that failed it."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.api import labels
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.controller import objects
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    NODES,
    SLICES,
    STRATEGIC_PATCH,
    Rest,
)

from .computedomain_helpers import (
    allocate,
    allocate_claim,
    condition,
    create_plugin_node,
    domain_body,
    new_namespace,
    report_daemon,
    running_controller,
    unique,
)
from .dra_setup import installed  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]


def _placed(rest: Rest, ns: str, name: str) -> str:
    return str(rest.get(COMPUTE_DOMAINS, name, ns).get("status", {}).get("fabricDomain") or "")


def _not_ready(rest: Rest, node: str) -> None:
    cond = {
        "type": "Ready",
        "status": "False",
        "reason": "KubeletNotReady",
        "message": "test: the node went down",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    rest.patch(
        NODES,
        node,
        {"status": {"conditions": [cond]}},
        sub="status",
        content_type=STRATEGIC_PATCH,
    )


def test_gang_placement_counts_only_ready_schedulable_nodes(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Three fabric domains of two nodes, first fit in name order: in the first one a node
    is NotReady, in the second one a node is cordoned. Counting every compute-domain node,
    the gang went to the first, where it can never fill (it timed out and landed there
    again for ever); counting only nodes that can take its pods, it goes to the third."""
    ns, driver_ns = new_namespace(control_plane, "cd-cap"), unique("cd-system")
    racks = [unique("0000capa"), unique("0000capb"), unique("0000capc")]  # sort first
    nodes = {rack: [unique("cap"), unique("cap")] for rack in racks}
    for rack, names in nodes.items():
        for n in names:
            create_plugin_node(control_plane, n, rack)
    _not_ready(rest, nodes[racks[0]][1])
    rest.patch(NODES, nodes[racks[1]][1], {"spec": {"unschedulable": True}})
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, domain_body("gang", mode="host", num_nodes=2), ns)
        placed = wait_for(lambda: _placed(rest, ns, "gang"), what="gang placed")
        assert placed == racks[2]


def test_with_the_verification_gate_required_only_verified_nodes_count(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """`--require-verified-nodes`: a fabric domain whose nodes the verification gate has not
    passed yet (no `fabricdra.io/verified=true`; their devices are tainted) gets no gang."""
    ns, driver_ns = new_namespace(control_plane, "cd-ver"), unique("cd-system")
    racks = [unique("0000vera"), unique("0000verb")]  # sort first
    for rack in racks:
        for _ in range(2):
            name = unique("ver")
            create_plugin_node(control_plane, name, rack)
            if rack == racks[1]:
                rest.patch(NODES, name, {"metadata": {"labels": {labels.VERIFIED: "true"}}})
    with running_controller(
        control_plane, driver_ns, leader_election=False, require_verified_nodes=True
    ):
        rest.create(COMPUTE_DOMAINS, domain_body("gang", mode="host", num_nodes=2), ns)
        placed = wait_for(lambda: _placed(rest, ns, "gang"), what="gang placed")
        assert placed == racks[1]


# The NodeDevices CRD: under --fabric-check the controller watches NodeDevices.
@pytest.mark.usefixtures("installed")
def test_under_the_fabric_check_a_verified_node_of_an_unchecked_fabric_domain_is_not_placed(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """`--fabric-check` (issue 18 point 4): both fabric domains' nodes passed the per-node
    gate, but only the second domain's multi-node NVLink check passed
    (`fabricdra.io/fabric-verified=true`). First fit used to take the first, whose trunk
    between the trays nobody measured; the gang goes to the checked one."""
    ns, driver_ns = new_namespace(control_plane, "cd-fab"), unique("cd-system")
    racks = [unique("0000faba"), unique("0000fabb")]  # sort first
    for rack in racks:
        for _ in range(2):
            name = unique("fab")
            create_plugin_node(control_plane, name, rack)
            node_labels = {labels.VERIFIED: "true"}
            if rack == racks[1]:
                node_labels[labels.FABRIC_VERIFIED] = "true"
            rest.patch(NODES, name, {"metadata": {"labels": node_labels}})
    with running_controller(
        control_plane,
        driver_ns,
        leader_election=False,
        require_verified_nodes=True,
        fabric_check=True,
    ):
        rest.create(COMPUTE_DOMAINS, domain_body("gang", mode="host", num_nodes=2), ns)
        placed = wait_for(lambda: _placed(rest, ns, "gang"), what="gang placed")
        assert placed == racks[1]


def _answer(rest: Rest, ns: str, claim: str) -> dict[str, str]:
    devices = rest.get(CLAIMS, claim, ns)["status"].get("devices", []) or []
    return {c["type"]: c["reason"] for d in devices for c in d.get("conditions", []) or []}


def _message(rest: Rest, ns: str, claim: str, condition: str) -> str:
    devices = rest.get(CLAIMS, claim, ns)["status"].get("devices", []) or []
    conds = [c for d in devices for c in d.get("conditions", []) or [] if c["type"] == condition]
    return str(conds[0]["message"]) if conds else ""


def test_a_timed_out_gang_is_placed_again_without_the_nodes_that_failed_it(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """A gang of 2 is placed in the first of two empty fabric domains; its pods reach only
    one of the two nodes there (the other fails them, for a reason the controller cannot
    see) and the gang timeout releases it. Never revisited, the placement stayed there, and
    the job was placed in the same trap each time while the other fabric domain stood
    empty. Placed again without the node that failed it, it moves to the other one, and
    the template (so every claim made from it from now on) follows; but only once the pod
    whose claim was made for the first fabric domain is gone (its claim can go nowhere
    else: the next test), as Kueue's requeue or the job's owner makes the pods again."""
    ns, driver_ns = new_namespace(control_plane, "cd-again"), unique("cd-system")
    racks = [unique("0000agna"), unique("0000agnb")]  # sort first: first fit
    nodes = {rack: [unique("agn"), unique("agn")] for rack in racks}
    for rack, names in nodes.items():
        for n in names:
            create_plugin_node(control_plane, n, rack)
    with running_controller(
        control_plane, driver_ns, leader_election=False, gang_timeout_seconds=2.0
    ):
        rest.create(COMPUTE_DOMAINS, domain_body("job", mode="host", num_nodes=2), ns)
        wait_for(lambda: _placed(rest, ns, "job") == racks[0], what="placed in the first")
        domain = ComputeDomain.model_validate(rest.get(COMPUTE_DOMAINS, "job", ns))
        template = objects.workload_claim_template(domain, domain.status.channels[0], racks[0])
        allocate_claim(rest, ns, template, nodes[racks[0]][0], "j0", binding_conditions=True)
        released = wait_for(
            lambda: _answer(rest, ns, "j0").get(cd.CONFLICT_CONDITION), what="gang released"
        )
        assert released == "GangTimeout"
        message = _message(rest, ns, "j0", cd.CONFLICT_CONDITION)
        assert f"stays placed in fabric domain {racks[0]}" in message, message
        rest.delete(CLAIMS, "j0", ns)  # its pod is gone (requeued), and its claim with it
        wait_for(lambda: _placed(rest, ns, "job") == racks[1], what="placed again elsewhere")
        wait_for(
            lambda: (
                f"fabricDomain == '{racks[1]}'"
                in str((rest.get_or_none(CLAIM_TEMPLATES, "job-channel", ns) or {}).get("spec"))
            ),
            what="the template follows the new placement",
        )


def test_gang_placement_counts_only_nodes_with_a_free_healthy_gpu(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Issue 18 point 8: two fabric domains of two Ready nodes, first fit in name order. In
    the first, one node's only GPU is unhealthy (tainted) and the other's is taken by another
    job's claim: no room there, although both nodes are Ready and schedulable. The gang goes
    to the second, whose GPUs are free (the fleet view counts the same way: capacity.py)."""
    from tests.fleetdata import GB200, UNHEALTHY, _claim, _gpu, _slice

    ns, driver_ns = new_namespace(control_plane, "cd-room"), unique("cd-system")
    racks = [unique("00000gpua"), unique("00000gpub")]  # sort first: first fit
    nodes = {rack: [unique("room"), unique("room")] for rack in racks}
    for rack, names in nodes.items():
        for n in names:
            create_plugin_node(control_plane, n, rack)
    sick, taken = nodes[racks[0]]
    rest.create(SLICES, _slice(sick, [_gpu(0, GB200, racks[0], [UNHEALTHY])]))
    rest.create(SLICES, _slice(taken, [_gpu(0, GB200, racks[0], [])]))
    for n in nodes[racks[1]]:
        rest.create(SLICES, _slice(n, [_gpu(0, GB200, racks[1], [])]))
    other = _claim("other-job", ns, [(taken, "gpu-0")])
    status = other.pop("status")
    rest.create(CLAIMS, other, ns)
    rest.patch(CLAIMS, "other-job", {"status": status}, ns, sub="status")
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, domain_body("job", mode="host", num_nodes=2), ns)
        wait_for(lambda: _placed(rest, ns, "job") == racks[1], what="placed where GPUs are free")


def test_a_placed_gang_whose_node_fails_before_its_pods_run_is_placed_again(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Issue 18 point 8: a gang of 2 placed in the first of two empty fabric domains, none of
    its claims allocated yet. A node there is cordoned: the placement can never fill, so the
    gang moves to the other fabric domain, and its template follows (no gang timeout needed:
    nothing was held)."""
    ns, driver_ns = new_namespace(control_plane, "cd-lost"), unique("cd-system")
    racks = [unique("00000fla"), unique("00000flb")]  # sort first: first fit
    nodes = {rack: [unique("lost"), unique("lost")] for rack in racks}
    for rack, names in nodes.items():
        for n in names:
            create_plugin_node(control_plane, n, rack)
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, domain_body("job", mode="host", num_nodes=2), ns)
        wait_for(lambda: _placed(rest, ns, "job") == racks[0], what="placed in the first")
        wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "job-channel", ns), what="template")
        rest.patch(NODES, nodes[racks[0]][1], {"spec": {"unschedulable": True}})
        wait_for(lambda: _placed(rest, ns, "job") == racks[1], what="placed again elsewhere")
        wait_for(
            lambda: (
                f"fabricDomain == '{racks[1]}'"
                in str((rest.get_or_none(CLAIM_TEMPLATES, "job-channel", ns) or {}).get("spec"))
            ),
            what="the template follows the new placement",
        )


def test_a_finished_gang_no_longer_keeps_its_fabric_domain(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Issue 18 point 8: a gang of 2 ran (both claims admitted, both hosts' IMEX reported:
    Ready) and its pods completed (kube-controller-manager deleted their claims). Its
    placement kept counting its two nodes against the fabric domain, so the next gang found
    no room there while the domain was left in place. Now it says Ready=False, Finished, and
    the next gang is placed where it ran."""
    ns, driver_ns = new_namespace(control_plane, "cd-fin"), unique("cd-system")
    rack = unique("000000fin")  # sorts first: first fit
    nodes = [unique("fin"), unique("fin")]
    for n in nodes:
        create_plugin_node(control_plane, n, rack)
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, domain_body("done", mode="host", num_nodes=2), ns)
        wait_for(lambda: _placed(rest, ns, "done") == rack, what="placed")
        domain = ComputeDomain.model_validate(rest.get(COMPUTE_DOMAINS, "done", ns))
        template = objects.workload_claim_template(domain, domain.status.channels[0], rack)
        for i, n in enumerate(nodes):
            allocate_claim(rest, ns, template, n, f"d{i}", binding_conditions=True)
            report_daemon(rest, driver_ns, cd.HOST_REPORT, n, ready=True)

        def ready() -> dict[str, Any]:
            conds = rest.get(COMPUTE_DOMAINS, "done", ns).get("status", {}).get("conditions")
            return next((c for c in conds or [] if c["type"] == cd.READY), {})

        wait_for(lambda: ready().get("status") == "True", what="the gang ran: Ready")
        for i in range(len(nodes)):  # its pods completed, one after the other: claims go
            rest.delete(CLAIMS, f"d{i}", ns)
            wait_for(lambda i=i: rest.get_or_none(CLAIMS, f"d{i}", ns) is None, what=f"d{i} gone")
        wait_for(lambda: ready().get("reason") == "Finished", what="Ready=False, Finished")
        rest.create(COMPUTE_DOMAINS, domain_body("next", mode="host", num_nodes=2), ns)
        wait_for(lambda: _placed(rest, ns, "next") == rack, what="the next gang placed there")


def _reallocate(rest: Rest, ns: str, claim: str, node: str) -> None:
    """What kube-scheduler does with a claim whose binding failed: it drops the allocation
    (and the driver's answer with it), and its pod, not made again, is scheduled anew: the
    same claim is allocated again, here on `node`."""
    rest.patch(CLAIMS, claim, {"status": {"allocation": None, "devices": None}}, ns, sub="status")
    allocate(rest, ns, claim, node, binding_conditions=True)


def test_a_timed_out_gang_whose_pods_stay_is_retried_where_their_claims_can_go(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """The 500-node bench with a 60 s gang timeout never finished: a gang of 18 placed in a
    full fabric domain did not get all its pods through the loaded scheduler in time, the
    timeout released it, and it was placed again in the empty fifth fabric domain. Its pods
    were not made again (bare pods; nothing requeues them), so their claims, made from the
    template pinned to the first fabric domain, could only be allocated there, and every
    allocation was refused `NodeHeld` ("... the ComputeDomain's nodes are in <the other>")
    for ever, while the gang's placement kept the room it never used. Here: a gang of 2 in
    the first of two empty fabric domains, one claim allocated there, the timeout releases
    it; the scheduler then allocates both pods' claims (the first again, and the second)
    on the two nodes of the first fabric domain. The gang is admitted there."""
    ns, driver_ns = new_namespace(control_plane, "cd-stay"), unique("cd-system")
    racks = [unique("0000stya"), unique("0000styb")]  # sort first: first fit
    nodes = {rack: [unique("sty"), unique("sty")] for rack in racks}
    for rack, names in nodes.items():
        for n in names:
            create_plugin_node(control_plane, n, rack)
    first = nodes[racks[0]]
    with running_controller(
        control_plane, driver_ns, leader_election=False, gang_timeout_seconds=2.0
    ):
        rest.create(COMPUTE_DOMAINS, domain_body("job", mode="host", num_nodes=2), ns)
        wait_for(lambda: _placed(rest, ns, "job") == racks[0], what="placed in the first")
        domain = ComputeDomain.model_validate(rest.get(COMPUTE_DOMAINS, "job", ns))
        template = objects.workload_claim_template(domain, domain.status.channels[0], racks[0])
        allocate_claim(rest, ns, template, first[0], "j0", binding_conditions=True)
        released = wait_for(
            lambda: _answer(rest, ns, "j0").get(cd.CONFLICT_CONDITION), what="gang released"
        )
        assert released == "GangTimeout"
        # The release says what happens next (decided before it is written).
        message = _message(rest, ns, "j0", cd.CONFLICT_CONDITION)
        assert f"stays placed in fabric domain {racks[0]}" in message, message
        # The domain says it too, where `kubectl describe` shows it.
        wait_for(
            lambda: (
                "the gang timeout released it: the gang stays placed"
                in str(condition(rest.get(COMPUTE_DOMAINS, "job", ns), cd.READY) or {})
            ),
            what="Ready says why the gang waits again",
        )
        # The second pod's claim exists too (made with its pod), not allocated yet.
        body = {"metadata": {"name": "j1", "labels": template["spec"]["metadata"]["labels"]}}
        rest.create(CLAIMS, {**body, "spec": template["spec"]["spec"]}, ns)
        _reallocate(rest, ns, "j0", first[0])
        _reallocate(rest, ns, "j1", first[1])
        for claim in ("j0", "j1"):
            answer = wait_for(
                lambda claim=claim: _answer(rest, ns, claim) or None, what=f"{claim} answered"
            )
            assert answer == {cd.ADMITTED_CONDITION: "Admitted"}, answer
        assert _placed(rest, ns, "job") == racks[0]


def test_gangs_of_12_17_and_18_all_place_on_racks_of_18_17_and_12(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Issue 28 point 4b, the review's sequence through the real controller: racks with 18, 17
    and 12 usable nodes (in name order), gangs of 12, 17 and 18 created one after another.
    First fit by name put the 12 in the 18-node rack and the 18 waited for ever; best fit
    puts each gang in the tightest hole that holds it, so every gang is placed."""
    ns, driver_ns = new_namespace(control_plane, "cd-fit"), unique("cd-system")
    sizes = {unique("0000fita"): 18, unique("0000fitb"): 17, unique("0000fitc"): 12}
    racks = sorted(sizes)
    assert [sizes[r] for r in racks] == [18, 17, 12]
    for rack, size in sizes.items():
        for _ in range(size):
            create_plugin_node(control_plane, unique("fit"), rack)
    with running_controller(control_plane, driver_ns, leader_election=False):
        for want in (12, 17, 18):
            name = f"gang{want}"
            rest.create(COMPUTE_DOMAINS, domain_body(name, mode="host", num_nodes=want), ns)
            wait_for(functools.partial(_placed, rest, ns, name), what=f"{name} placed")
        placed = {want: _placed(rest, ns, f"gang{want}") for want in (12, 17, 18)}
    assert placed == {12: racks[2], 17: racks[1], 18: racks[0]}
