"""Spanning ComputeDomains (issue 28 points 1-3): the spec fields (topology, segmentSize,
parallelism) and their refusals, the CRD rules that make the API server refuse the same, the
template pinned to a spanning gang's fabric domains, its shares counted against the room of
other gangs, and each segment its own IMEX domain."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.crdgen import CRD_DIR
from fabricdra.controller import objects, placement, status
from fabricdra.controller.placement import Gang, free_nodes
from fabricdra.kubeletplugin.computedomain.daemon import peers_of


def _spec(**kw: Any) -> dict[str, Any]:
    return {"channel": {"resourceClaimTemplate": {"name": "job-imex"}}, **kw}


def _domain(**kw: Any) -> ComputeDomain:
    return ComputeDomain.model_validate(
        {
            "metadata": {"name": "job", "namespace": "team", "uid": "uid-a", "generation": 1},
            "spec": _spec(**kw),
        }
    )


SPANS = {"allowMultipleCliques": True}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            _spec(numNodes=12, segmentSize=5, **SPANS),
            "numNodes 12 is not a multiple of segmentSize 5",
        ),
        (_spec(numNodes=12, segmentSize=4), "need numNodes and allowMultipleCliques: true"),
        (_spec(topology={"required": "tier-2"}, **SPANS), "need numNodes"),
        (_spec(numNodes=8, topology={"required": "tier-4"}, **SPANS), "tier-1"),
        (
            _spec(numNodes=8, topology={"required": "tier-1", "preferred": "tier-2"}, **SPANS),
            "preferred is above topology.required",
        ),
        (
            _spec(numNodes=8, parallelism={"groupGPUs": 6, "gpusPerNode": 4}, **SPANS),
            "multiple of gpusPerNode or divide it",
        ),
        (
            _spec(numNodes=12, parallelism={"groupGPUs": 32, "gpusPerNode": 4}, **SPANS),
            "numNodes 12 is not a multiple of the 8 nodes one TPxEP group spans",
        ),
        (
            _spec(
                numNodes=16, segmentSize=4, parallelism={"groupGPUs": 32, "gpusPerNode": 4}, **SPANS
            ),
            "segmentSize 4 does not hold whole TPxEP groups of 8 nodes",
        ),
    ],
)
def test_bad_shapes_are_refused_saying_what_is_wrong(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        cd.ComputeDomainSpec.model_validate(spec)


def test_a_spanning_spec_and_its_atom() -> None:
    seg = cd.ComputeDomainSpec.model_validate(_spec(numNodes=12, segmentSize=4, **SPANS))
    assert seg.spans
    assert seg.atom == 4
    # GB200 NVL72: a TPxEP group of 32 GPUs on 4-GPU trays is 8 trays.
    grp = cd.ComputeDomainSpec.model_validate(
        _spec(numNodes=16, parallelism={"groupGPUs": 32, "gpusPerNode": 4}, **SPANS)
    )
    assert grp.atom == 8
    # Several groups per node: each node is whole groups, any node count works.
    small = cd.ComputeDomainSpec.model_validate(
        _spec(numNodes=3, parallelism={"groupGPUs": 2, "gpusPerNode": 4}, **SPANS)
    )
    assert small.atom == 1
    # allowMultipleCliques alone stays what it was: never placed, never pinned.
    assert not cd.ComputeDomainSpec.model_validate(_spec(numNodes=4, **SPANS)).spans


def test_the_crd_refuses_the_same_shapes() -> None:
    crd = yaml.safe_load((CRD_DIR / cd.CRD.filename).read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = spec["x-kubernetes-validations"]
    assert cd.SPANS_RULE in rules
    assert cd.SEGMENT_WHOLE_RULE in rules
    assert cd.GROUP_WHOLE_RULE in rules
    assert spec["properties"]["topology"]["x-kubernetes-validations"] == [cd.TOPOLOGY_ORDER_RULE]
    # A nullable Literal is a pattern of its values (crdgen: the API server checks an enum
    # even on a null), so exactly the tiers and nothing else pass.
    required = spec["properties"]["topology"]["properties"]["required"]
    assert required["nullable"] is True
    assert [t for t in [*cd.TIERS, "tier-4", "tier"] if re.match(required["pattern"], t)] == list(
        cd.TIERS
    )
    assert spec["properties"]["parallelism"]["x-kubernetes-validations"] == [cd.GROUP_SHAPE_RULE]


def test_the_template_of_a_spanning_gang_is_pinned_to_its_fabric_domains() -> None:
    domain = _domain(numNodes=12, segmentSize=4, **SPANS)
    rct = objects.workload_claim_template(domain, 5, ["rack-1", "rack-3"])
    selectors = rct["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    expression = selectors[0]["cel"]["expression"]
    assert f".{cd.ATTR_FABRIC} in ['rack-1', 'rack-3']" in expression


def test_a_spanning_gangs_shares_are_room_other_gangs_cannot_count() -> None:
    fabrics = {"r1": [f"a{i}" for i in range(18)], "r2": [f"b{i}" for i in range(18)]}
    owners = {"a0": "uid-s", "a1": "uid-s"}  # the spanning gang holds two of its 12 in r1
    gangs = [Gang("uid-s", 20, "", {"r1": 12, "r2": 8})]
    free = free_nodes(fabrics, owners, gangs, "uid-other")
    assert free == {"r1": 18 - 2 - 10, "r2": 18 - 8}


def test_placed_carries_the_recorded_plan() -> None:
    plan = {"tier": "tier-1", "switch": "l1", "shares": [{"fabricDomain": "r2", "nodes": 4}]}
    assert placement.Placed(None, plan=plan).fabrics == ["r2"]
    assert placement.Placed("r1").fabrics is None


def _held(*nodes: tuple[str, str]) -> list[status.HeldNode]:
    return [status.HeldNode(n, f"10.0.0.{i}", f) for i, (n, f) in enumerate(nodes, 1)]


def test_each_segment_is_its_own_imex_domain() -> None:
    # segmentSize 2: rack-1 holds two segments (4 nodes), rack-2 one.
    domain = _domain(numNodes=6, segmentSize=2, **SPANS)
    domain.status.channels = [7]
    held = _held(
        ("a1", "rack-1"), ("a2", "rack-1"), ("a3", "rack-1"), ("a4", "rack-1"),
        ("b1", "rack-2"), ("b2", "rack-2"),
    )  # fmt: skip
    st, _ = status.compute(domain, status.Observed(True, "", held, {}), "t0")
    assert {r.name: r.segment for r in st.nodes} == {
        "a1": 0, "a2": 0, "a3": 1, "a4": 1, "b1": 0, "b2": 0,
    }  # fmt: skip
    assert [(s.fabricDomain, s.segment, s.nodes) for s in st.segments] == [
        ("rack-1", 0, ["a1", "a2"]),
        ("rack-1", 1, ["a3", "a4"]),
        ("rack-2", 0, ["b1", "b2"]),
    ]
    obj = {"status": st.model_dump(mode="json")}
    assert peers_of(obj, "a1") == {0: "10.0.0.1", 1: "10.0.0.2"}
    assert peers_of(obj, "a3") == {2: "10.0.0.3", 3: "10.0.0.4"}
    assert peers_of(obj, "b2") == {0: "10.0.0.5", 1: "10.0.0.6"}


def test_without_segments_a_clique_is_one_imex_domain_as_before() -> None:
    domain = _domain(numNodes=3, topology={"preferred": "tier-1"}, **SPANS)
    held = _held(("a1", "rack-1"), ("a2", "rack-1"), ("b1", "rack-2"))
    st, _ = status.compute(domain, status.Observed(True, "", held, {}), "t0")
    assert st.segments == []
    assert peers_of({"status": st.model_dump(mode="json")}, "a2") == {0: "10.0.0.1", 1: "10.0.0.2"}
