"""Gangs larger than one NVLink domain (issue 28 points 1-2), against a real kube-apiserver and
a running controller: placed whole into the fewest fabric domains under one switch of the
required tier (recorded in status.placement, the claim template pinned to those fabric
domains), waiting whole with its reason in Ready when no switch has room, and split into
segments that each form their own IMEX domain. The API server refuses a numNodes that is not
whole segments (the CRD's CEL rule)."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.kube.rest import CLAIM_TEMPLATES, CLAIMS, COMPUTE_DOMAINS, NODES, ApiError, Rest

from .computedomain_helpers import (
    allocate_claim,
    condition,
    create_plugin_node,
    domain_body,
    new_namespace,
    running_controller,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]


def _spanning(name: str, num_nodes: int, **spec: Any) -> dict[str, Any]:
    body = domain_body(name, mode="host", num_nodes=num_nodes)
    body["spec"].update(allowMultipleCliques=True, **spec)
    return body


def _racks(
    cp: ControlPlane, rest: Rest, layout: dict[str, tuple[int, str]]
) -> dict[str, list[str]]:
    """rack -> (node count, its tier-1 switch): nodes labelled as the scale-out controller
    labels them."""
    out: dict[str, list[str]] = {}
    for rack, (count, leaf) in layout.items():
        out[rack] = []
        for _ in range(count):
            name = unique("span")
            create_plugin_node(cp, name, rack)
            rest.patch(NODES, name, {"metadata": {"labels": {TIER_LABELS[0]: leaf}}})
            out[rack].append(name)
    return out


def _placement(rest: Rest, ns: str, name: str) -> dict[str, Any] | None:
    return (rest.get(COMPUTE_DOMAINS, name, ns).get("status") or {}).get("placement")


def _shares(rest: Rest, ns: str, name: str) -> dict[str, int]:
    placed = _placement(rest, ns, name) or {}
    return {s["fabricDomain"]: s["nodes"] for s in placed.get("shares") or []}


def _held(rest: Rest, ns: str, name: str) -> list[str]:
    """Nodes the domain's claims hold (its node label, which the controller writes)."""
    uid = rest.get(COMPUTE_DOMAINS, name, ns)["metadata"]["uid"]
    return [
        n["metadata"]["name"]
        for n in rest.list(NODES).get("items") or []
        if (n["metadata"].get("labels") or {}).get(cd.DOMAIN_LABEL) == uid
    ]


def _conflict(rest: Rest, ns: str, claim: str) -> dict[str, str] | None:
    devices = rest.get(CLAIMS, claim, ns)["status"].get("devices", []) or []
    found = [
        c
        for d in devices
        for c in d.get("conditions", []) or []
        if c["type"] == cd.CONFLICT_CONDITION
    ]
    return found[0] if found else None


def _selector(rest: Rest, ns: str, template: str) -> str:
    rct = rest.get_or_none(CLAIM_TEMPLATES, template, ns) or {}
    return str(rct.get("spec") or "")


def test_a_gang_larger_than_a_rack_is_placed_whole_under_one_switch_or_waits_whole(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Racks a, b (2 nodes each) under leaf l1; racks c (2) and d (1) under leaf l2. A gang of
    3 that must stay under one tier-1 switch goes to l2 (the tighter switch: l1 stays whole
    for a gang of 4, which follows); a third gang of 2 then fits under no leaf and waits,
    holding nothing, its Ready saying what for; when the first gang goes it is placed."""
    ns, driver_ns = new_namespace(control_plane, "cd-span"), unique("cd-system")
    l1, l2 = unique("leaf"), unique("leaf")
    a, b, c, d = (unique(f"0000span{x}") for x in "abcd")
    _racks(control_plane, rest, {a: (2, l1), b: (2, l1), c: (2, l2), d: (1, l2)})
    required = {"topology": {"required": "tier-1"}}
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, _spanning("three", 3, **required), ns)
        wait_for(lambda: _shares(rest, ns, "three") == {c: 2, d: 1}, what="placed under l2")
        placed = _placement(rest, ns, "three")
        assert placed is not None
        assert (placed["tier"], placed["switch"]) == ("tier-1", l2)
        wait_for(
            lambda: f"in ['{c}', '{d}']" in _selector(rest, ns, "three-channel"),
            what="the template pinned to the placement's fabric domains",
        )
        rest.create(COMPUTE_DOMAINS, _spanning("four", 4, **required), ns)
        wait_for(lambda: _shares(rest, ns, "four") == {a: 2, b: 2}, what="placed under l1")
        rest.create(COMPUTE_DOMAINS, _spanning("two", 2, **required), ns)

        def waiting() -> str:
            ready = condition(rest.get(COMPUTE_DOMAINS, "two", ns), cd.READY) or {}
            return str(ready.get("message")) if ready.get("reason") == "WaitingForFabric" else ""

        message = wait_for(waiting, what="the third gang waits")
        assert "under one tier-1 switch" in message, message
        assert "most room under one tier-1 switch is 0 node(s)" in message, message
        assert _placement(rest, ns, "two") is None
        assert rest.get_or_none(CLAIM_TEMPLATES, "two-channel", ns) is None  # holds nothing
        rest.delete(COMPUTE_DOMAINS, "three", ns)
        wait_for(lambda: sum(_shares(rest, ns, "two").values()) == 2, what="placed once room")
        assert set(_shares(rest, ns, "two")) <= {c, d}


def test_segments_are_whole_and_each_its_own_imex_domain(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """segmentSize 2, numNodes 4 over racks of 3 and 2 free nodes (no rack has 4): one segment
    in each, never 3 + 1; the claims allocated there are admitted as one gang and status lists
    each segment with its nodes. numNodes 5 is refused by the API server itself."""
    ns, driver_ns = new_namespace(control_plane, "cd-seg"), unique("cd-system")
    leaf = unique("leaf")
    x, y = unique("0000segx"), unique("0000segy")
    nodes = _racks(control_plane, rest, {x: (3, leaf), y: (2, leaf)})
    with pytest.raises(ApiError) as refused:
        rest.create(COMPUTE_DOMAINS, _spanning("odd", 5, segmentSize=2), ns)
    assert "numNodes is not a multiple of segmentSize" in str(refused.value)
    refusals = {
        "topology.preferred is above topology.required": {
            "topology": {"required": "tier-1", "preferred": "tier-3"}
        },
        "numNodes and segmentSize must hold whole TP": {
            "parallelism": {"groupGPUs": 32, "gpusPerNode": 4}  # 8 nodes a group, 5 asked
        },
        "groupGPUs must be a multiple of gpusPerNode or divide it": {
            "parallelism": {"groupGPUs": 6, "gpusPerNode": 4}
        },
    }
    for message, spec in refusals.items():
        with pytest.raises(ApiError) as refused:
            rest.create(COMPUTE_DOMAINS, _spanning("bad", 5, **spec), ns)
        assert message in str(refused.value), str(refused.value)
    plain = domain_body("plain", mode="host", num_nodes=4)
    plain["spec"]["segmentSize"] = 2  # without allowMultipleCliques
    with pytest.raises(ApiError) as refused:
        rest.create(COMPUTE_DOMAINS, plain, ns)
    assert "need numNodes and allowMultipleCliques: true" in str(refused.value)
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, _spanning("seg", 4, segmentSize=2), ns)
        wait_for(lambda: _shares(rest, ns, "seg") == {x: 2, y: 2}, what="two segments placed")
        template = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, "seg-channel", ns), what="template"
        )
        for i, node in enumerate(nodes[x][:2]):
            allocate_claim(rest, ns, template, node, f"seg-{i}", binding_conditions=True)
        wait_for(lambda: len(_held(rest, ns, "seg")) == 2, what="two held in x")
        # A third pod scheduled into x would split a segment across x and y: refused there.
        allocate_claim(rest, ns, template, nodes[x][2], "seg-extra", binding_conditions=True)
        refused = wait_for(lambda: _conflict(rest, ns, "seg-extra"), what="refused")
        assert refused["reason"] == "OutsidePlacement"
        assert f"takes 2 node(s) in fabric domain {x}" in refused["message"]
        for i, node in enumerate(nodes[y], start=2):
            allocate_claim(rest, ns, template, node, f"seg-{i}", binding_conditions=True)

        def segments() -> list[tuple[str, int, list[str]]]:
            st = rest.get(COMPUTE_DOMAINS, "seg", ns).get("status") or {}
            rows = st.get("segments") or []
            return [(s["fabricDomain"], s["segment"], sorted(s["nodes"])) for s in rows]

        wait_for(lambda: sum(len(s[2]) for s in segments()) == 4, what="all four admitted")
        assert segments() == [(x, 0, sorted(nodes[x][:2])), (y, 0, sorted(nodes[y]))]
