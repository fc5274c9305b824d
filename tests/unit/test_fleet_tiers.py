"""The fleet view per switch tier and the defragmentation plan (issue 28 point 4): every number
against a hand count on a small fleet of three 4-node NVLink domains under two leaves' worth
of tier labels."""

from __future__ import annotations

from typing import Any

import pytest

from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.controller import capacity
from fabricdra.controller.fleet import DEFRAG_NOTE, defrag, fleet
from tests.fleetdata import GB200, UNHEALTHY, _claim, _gpu, _slice, node_object

# node -> (NVLink domain, tier-1, tier-2, tier-3). Domain B straddles two tier-1 leaves (an
# 18-tray NVL72 rack does not line up with 32-node rail blocks either).
LAYOUT = {
    **{f"a{i}": ("nvl-a", "leaf-1", "spine-1", "core-1") for i in range(4)},
    "b0": ("nvl-b", "leaf-1", "spine-1", "core-1"),
    "b1": ("nvl-b", "leaf-1", "spine-1", "core-1"),
    "b2": ("nvl-b", "leaf-2", "spine-1", "core-1"),
    "b3": ("nvl-b", "leaf-2", "spine-1", "core-1"),
    **{f"c{i}": ("nvl-c", "leaf-3", "spine-2", "core-1") for i in range(4)},
}


def _reserved(claim: dict[str, Any], *pods: str) -> dict[str, Any]:
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": p, "uid": p} for p in pods]
    return claim


def objects(*, broken: str = "") -> dict[str, Any]:
    """2 GPUs per node. a0: one GPU taken by pod p1; b0, b1: both GPUs taken by cd1's pods
    (cd1 holds them); c0 and c1: one GPU each taken by pod p2 (two claims, one pod); c2: one
    GPU taken by a claim no pod reserves. `broken`: that node's second GPU is unhealthy."""
    slices = []
    nodes = []
    for name, (dom, t1, t2, t3) in LAYOUT.items():
        gpus = [
            _gpu(i, GB200, dom, [UNHEALTHY] if name == broken and i == 1 else []) for i in (0, 1)
        ]
        slices.append(_slice(name, gpus))
        labels = dict(zip(TIER_LABELS, (t1, t2, t3), strict=True))
        labels["fabricdra.io/fabric.domain"] = dom
        nodes.append(node_object(name, labels=labels))
    claims = [
        _reserved(_claim("p1-gpu", "team", [("a0", "gpu-0")]), "p1"),
        _reserved(_claim("cd1-0", "team", [("b0", "gpu-0"), ("b0", "gpu-1")]), "w0"),
        _reserved(_claim("cd1-1", "team", [("b1", "gpu-0"), ("b1", "gpu-1")]), "w1"),
        _reserved(_claim("p2-x", "team", [("c0", "gpu-0")]), "p2"),
        _reserved(_claim("p2-y", "team", [("c1", "gpu-0")]), "p2"),
        _claim("orphan", "team", [("c2", "gpu-0")]),
    ]
    cds = [
        {
            "metadata": {"namespace": "team", "name": "cd1"},
            "spec": {"numNodes": 2},
            "status": {
                "fabricDomain": "nvl-b",
                "nodes": [{"name": n, "fabricDomain": "nvl-b"} for n in ("b0", "b1")],
            },
        }
    ]
    return {"slices": slices, "claims": claims, "cds": cds, "nodes": nodes}


def view(**kw: Any) -> Any:
    o = objects(**kw)
    return fleet(o["slices"], o["claims"], [], o["cds"], o["nodes"])


def test_free_gpus_largest_gang_and_segment_per_tier_and_nvlink_domain() -> None:
    rows = {(r["tier"], r["name"]): r for r in view().to_json()["tiers"]}
    got = {
        k: (r["nodes"], r["freeGpus"], r["largestGang"], r["largestSegment"])
        for k, r in rows.items()
    }
    assert got == {
        # tier, value: nodes, free GPUs, largest gang (whole free nodes under it, any domain),
        # largest segment (whole free nodes inside one NVLink domain under it)
        ("tier-1", "leaf-1"): (6, 7, 3, 3),
        ("tier-1", "leaf-2"): (2, 4, 2, 2),
        ("tier-1", "leaf-3"): (4, 5, 1, 1),
        ("tier-2", "spine-1"): (8, 11, 5, 3),
        ("tier-2", "spine-2"): (4, 5, 1, 1),
        ("tier-3", "core-1"): (12, 16, 6, 3),
        ("nvlink", "nvl-a"): (4, 7, 3, 3),
        ("nvlink", "nvl-b"): (4, 4, 2, 2),
        ("nvlink", "nvl-c"): (4, 5, 1, 1),
    }
    assert rows[("tier-2", "spine-1")]["label"] == TIER_LABELS[1]
    assert rows[("tier-2", "spine-1")]["fabricDomains"] == ["nvl-a", "nvl-b"]


def test_a_gang_placed_but_not_yet_holding_counts_against_its_domain_under_every_tier() -> None:
    o = objects()
    o["cds"].append(
        {
            "metadata": {"namespace": "team", "name": "waiting"},
            "spec": {"numNodes": 2},
            "status": {"fabricDomain": "nvl-a", "nodes": []},
        }
    )
    rows = {
        (r["tier"], r["name"]): r
        for r in fleet(o["slices"], o["claims"], [], o["cds"], o["nodes"]).to_json()["tiers"]
    }
    assert rows[("nvlink", "nvl-a")]["largestSegment"] == 1
    assert rows[("tier-2", "spine-1")]["largestGang"] == 3
    assert rows[("tier-3", "core-1")]["largestSegment"] == 2  # nvl-b's 2 now the largest


def test_nodes_without_tier_labels_have_no_tier_rows() -> None:
    o = objects()
    for n in o["nodes"]:
        n["metadata"]["labels"] = {"fabricdra.io/fabric.domain": LAYOUT[n["metadata"]["name"]][0]}
    tiers = {
        r["tier"]
        for r in fleet(o["slices"], o["claims"], [], o["cds"], o["nodes"]).to_json()["tiers"]
    }
    assert tiers == {"nvlink"}


def test_defrag_names_the_fewest_workloads_that_free_a_whole_nvlink_domain() -> None:
    o = objects()
    plan = defrag(fleet(o["slices"], o["claims"], [], o["cds"], o["nodes"]), o["claims"])
    out = plan.to_json()
    assert out["note"] == DEFRAG_NOTE
    assert "does not preempt" in DEFRAG_NOTE
    assert "DRA" in DEFRAG_NOTE
    first, second, third = out["candidates"]
    # nvl-a: one pod (1 GPU); nvl-b: one ComputeDomain (4 GPUs): both one workload, the one
    # evicting fewer GPUs first; nvl-c: one pod with two claims and an unreserved claim.
    assert first == {
        "fabricDomain": "nvl-a",
        "workloads": [{"kind": "Pod", "namespace": "team", "name": "p1", "gpus": 1}],
        "evictedGpus": 1,
        "nodes": 4,
        "nodesFreed": 4,
    }
    assert second["fabricDomain"] == "nvl-b"
    assert second["workloads"] == [
        {"kind": "ComputeDomain", "namespace": "team", "name": "cd1", "gpus": 4}
    ]
    assert third["fabricDomain"] == "nvl-c"
    assert third["workloads"] == [
        {"kind": "Pod", "namespace": "team", "name": "p2", "gpus": 2},
        {"kind": "ResourceClaim", "namespace": "team", "name": "orphan", "gpus": 1},
    ]
    assert out["fewestWorkloads"] == 1
    assert out["freeDomains"] == []


def test_defrag_puts_a_domain_with_a_broken_tray_after_those_it_can_free_whole() -> None:
    o = objects(broken="a2")
    out = defrag(fleet(o["slices"], o["claims"], [], o["cds"], o["nodes"]), o["claims"]).to_json()
    assert [c["fabricDomain"] for c in out["candidates"]] == ["nvl-b", "nvl-c", "nvl-a"]
    assert out["candidates"][2]["nodesFreed"] == 3  # a2 stays unusable whatever is evicted


def test_a_domain_already_free_needs_no_eviction() -> None:
    o = objects()
    o["claims"] = [c for c in o["claims"] if c["metadata"]["name"] != "p1-gpu"]
    out = defrag(fleet(o["slices"], o["claims"], [], o["cds"], o["nodes"]), o["claims"]).to_json()
    assert out["freeDomains"] == ["nvl-a"]
    assert out["fewestWorkloads"] == 0
    assert "nvl-a" not in [c["fabricDomain"] for c in out["candidates"]]


@pytest.mark.parametrize("limit", [1, 2])
def test_defrag_table_lists_the_best_candidates(limit: int) -> None:
    from fabricdra.cli.fleet import render_defrag

    o = objects()
    text = render_defrag(
        defrag(fleet(o["slices"], o["claims"], [], o["cds"], o["nodes"]), o["claims"]), limit
    )
    assert "does not preempt" in text
    assert "nvl-a" in text
    assert "Pod team/p1" in text
    assert ("nvl-b" in text) == (limit >= 2)


def _spanning(name: str, shares: dict[str, int], holds: dict[str, str]) -> dict[str, Any]:
    """A spanning gang (allowMultipleCliques with a topology) placed with `shares` per NVLink
    domain (status.placement), holding `holds` (node -> its domain) so far."""
    return {
        "metadata": {"namespace": "team", "name": name},
        "spec": {
            "numNodes": sum(shares.values()),
            "allowMultipleCliques": True,
            "topology": {"required": "tier-3"},
        },
        "status": {
            "placement": {
                "tier": "tier-3",
                "switch": "core-1",
                "shares": [{"fabricDomain": f, "nodes": n} for f, n in shares.items()],
            },
            "nodes": [{"name": n, "fabricDomain": f} for n, f in holds.items()],
        },
    }


def test_a_spanning_gangs_shares_count_against_each_of_its_domains() -> None:
    """Issue 28 (lossfleet point 2): a gang placed across nvl-a (2) and nvl-c (2), holding
    nothing yet, expects 2 nodes of each; before, expected_by_fabric skipped every
    allowMultipleCliques domain, so the fleet offered those nodes to the next gang too."""
    gang = _spanning("wide", {"nvl-a": 2, "nvl-c": 2}, {})
    assert capacity.expected_by_fabric([gang]) == {"nvl-a": 2, "nvl-c": 2}
    # A node it holds is its own (the fleet already counts it taken), not expected any more.
    held = _spanning("wide", {"nvl-a": 2, "nvl-c": 2}, {"a1": "nvl-a"})
    assert capacity.expected_by_fabric([held]) == {"nvl-a": 1, "nvl-c": 2}
    # Not placed yet (no status.placement), or finished: nothing expected.
    unplaced = _spanning("wide", {"nvl-a": 2}, {})
    unplaced["status"].pop("placement")
    assert capacity.expected_by_fabric([unplaced]) == {}

    o = objects()
    o["cds"].append(gang)
    rows = {
        (r["tier"], r["name"]): r
        for r in fleet(o["slices"], o["claims"], [], o["cds"], o["nodes"]).to_json()["tiers"]
    }
    assert rows[("nvlink", "nvl-a")]["largestSegment"] == 1  # 3 whole, 2 expected
    assert rows[("nvlink", "nvl-c")]["largestSegment"] == 0  # 1 whole, 2 expected
    assert rows[("tier-3", "core-1")]["largestGang"] == 3  # 1 (a) + 2 (b) + 0 (c)


def test_the_controller_serves_free_gpus_and_largest_gang_per_tier() -> None:
    """Issue 28 (lossfleet point 3): the per-tier rows as gauges labelled by tier and switch
    (the hand-counted figures above); before, only per-fabric-domain gauges were served."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from fabricdra.controller import fleetmetrics

    v = view()
    registry = CollectorRegistry()
    registry.register(fleetmetrics.FleetCollector(lambda: v))
    samples = {
        (s.name, s.labels.get("tier"), s.labels.get("name")): s.value
        for fam in text_string_to_metric_families(generate_latest(registry).decode())
        for s in fam.samples
        if s.name.startswith("fabricdra_tier_")
    }
    assert samples[("fabricdra_tier_free_gpus", "tier-2", "spine-1")] == 11
    assert samples[("fabricdra_tier_largest_gang_nodes", "tier-2", "spine-1")] == 5
    assert samples[("fabricdra_tier_largest_segment_nodes", "tier-2", "spine-1")] == 3
    assert samples[("fabricdra_tier_nodes", "tier-3", "core-1")] == 12
    assert samples[("fabricdra_tier_largest_gang_nodes", "tier-1", "leaf-3")] == 1
    assert samples[("fabricdra_tier_free_gpus", "nvlink", "nvl-a")] == 7
    # one series per tier row and gauge: label cardinality is the switches and domains
    assert len(samples) == 4 * len(v.tiers())
