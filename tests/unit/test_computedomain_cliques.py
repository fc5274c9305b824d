"""Multi-clique ComputeDomains (issue 11 point 13): a domain spans several NVLink fabric
domains (cliques) only when its spec says `allowMultipleCliques: true`; then each clique is
its own IMEX ensemble (indices per clique, peers = the clique's nodes), the domain is never
pinned to one fabric domain, and its size is judged against all cliques together."""

from __future__ import annotations

from collections import Counter

import pytest
import yaml
from pydantic import ValidationError

from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.crdgen import CRD_DIR
from fabricdra.controller import admission, status
from fabricdra.controller.admission import ClaimOnNode
from fabricdra.kubeletplugin.computedomain.daemon import peers_of

A, B = "uid-a", "uid-b"


def _domain(multi: bool, **status_: object) -> ComputeDomain:
    spec: dict[str, object] = {"channel": {"resourceClaimTemplate": {"name": "job-imex"}}}
    if multi:
        spec["allowMultipleCliques"] = True
    return ComputeDomain.model_validate(
        {
            "metadata": {"name": "job", "namespace": "team", "uid": A, "generation": 1},
            "spec": spec,
            "status": status_,
        }
    )


# -- the opt-in ------------------------------------------------------------------------------
def test_the_opt_in_is_an_explicit_boolean_off_by_default() -> None:
    spec = cd.ComputeDomainSpec.model_validate(
        {"channel": {"resourceClaimTemplate": {"name": "x"}}}
    )
    assert spec.allowMultipleCliques is False
    with pytest.raises(ValidationError, match="allowMultipleCliques"):
        cd.ComputeDomainSpec.model_validate(
            {"channel": {"resourceClaimTemplate": {"name": "x"}}, "allowMultipleCliques": "many"}
        )
    crd = yaml.safe_load((CRD_DIR / cd.CRD.filename).read_text())
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    field = props["properties"]["allowMultipleCliques"]
    assert field["type"] == "boolean"
    assert "clique" in field["description"]


# -- admission -------------------------------------------------------------------------------
def _claim(key: str, domain: str, state: str = "pending") -> ClaimOnNode:
    return ClaimOnNode(key=key, domain=domain, state=state, since="t1")


def test_an_opted_in_domain_takes_nodes_of_another_clique_and_is_never_pinned() -> None:
    d = admission.decide("n2", "rack-2", [_claim("ns/a", A)], {A: None}, multi_clique={A})
    assert (d.owner, d.admit, d.conflicts) == (A, ["ns/a"], [])
    assert d.fabric_pins == {}  # pinning would refuse the next clique


def test_without_the_opt_in_a_domain_still_refuses_a_second_clique() -> None:
    d = admission.decide("n2", "rack-2", [_claim("ns/a", A)], {A: "rack-1"}, multi_clique={B})
    assert d.owner == cd.FREE_OWNER
    assert "never spans two" in d.conflicts[0][1]
    assert "allowMultipleCliques" in d.conflicts[0][1]  # the message says how to opt in


def test_one_domain_per_node_still_holds_across_cliques() -> None:
    claims = [_claim("ns/a", A, "admitted"), _claim("ns/b", B)]
    d = admission.decide("n1", "rack-1", claims, {A: None, B: None}, A, multi_clique={A, B})
    assert d.owner == A
    assert [k for k, _ in d.conflicts] == ["ns/b"]


# -- status ----------------------------------------------------------------------------------
def _held(*nodes: tuple[str, str]) -> list[status.HeldNode]:
    return [status.HeldNode(n, f"10.0.0.{i}", f) for i, (n, f) in enumerate(nodes, 1)]


def test_indices_are_per_clique_and_status_shows_each_nodes_clique() -> None:
    held = _held(("a1", "rack-1"), ("a2", "rack-1"), ("b1", "rack-2"), ("b2", "rack-2"))
    first, _ = status.compute(
        _domain(True, channels=[3]), status.Observed(True, "", held, {}), "t0"
    )
    rows = {r.name: (r.fabricDomain, r.index) for r in first.nodes}
    assert rows == {
        "a1": ("rack-1", 0),
        "a2": ("rack-1", 1),
        "b1": ("rack-2", 0),
        "b2": ("rack-2", 1),
    }
    assert first.fabricDomain == ""  # not one fabric domain: the rows say which clique
    # A newcomer takes the lowest free slot of its own clique; the others keep theirs.
    again = _domain(True, **first.model_dump(mode="json"))
    later_held = _held(("a2", "rack-1"), ("b1", "rack-2"), ("b2", "rack-2"), ("b3", "rack-2"))
    later, _ = status.compute(again, status.Observed(True, "", later_held, {}), "t1")
    rows = {r.name: (r.fabricDomain, r.index) for r in later.nodes}
    assert rows == {
        "a2": ("rack-1", 1),
        "b1": ("rack-2", 0),
        "b2": ("rack-2", 1),
        "b3": ("rack-2", 2),
    }


def test_each_clique_is_its_own_imex_ensemble() -> None:
    held = _held(("a1", "rack-1"), ("a2", "rack-1"), ("b1", "rack-2"))
    st, _ = status.compute(_domain(True, channels=[0]), status.Observed(True, "", held, {}), "t0")
    obj = {"status": st.model_dump(mode="json")}
    assert peers_of(obj, "a1") == {0: "10.0.0.1", 1: "10.0.0.2"}
    assert peers_of(obj, "b1") == {0: "10.0.0.3"}


def test_size_is_judged_against_all_cliques_when_opted_in() -> None:
    sizes = Counter({"rack-1": 18, "rack-2": 18})
    assert "cannot fit" in status.too_large(30, sizes, pinned=None, multi_clique=False)
    assert status.too_large(30, sizes, pinned=None, multi_clique=True) == ""
    many = status.too_large(40, sizes, pinned=None, multi_clique=True)
    assert "numNodes 40 cannot fit" in many
    assert "2 clique(s)" in many
    assert "36 node(s)" in many
    assert status.too_large(18, sizes, pinned="rack-1", multi_clique=False) == ""
    assert status.too_large(4, Counter(), pinned=None, multi_clique=True) == ""


def test_a_multi_clique_gang_is_not_placed_in_one_fabric_domain() -> None:
    """Gang placement pins a gang to one fabric domain before its pods schedule; a domain
    allowed to span cliques must never be pinned, so it is no gang for placement."""
    from fabricdra.controller import placement

    single = _domain(False)
    single.spec.numNodes = 4
    multi = _domain(True)
    multi.spec.numNodes = 4
    assert placement.is_gang(single)
    assert not placement.is_gang(multi)


def test_a_held_node_moved_to_another_clique_keeps_its_peers_and_the_domain_says_so() -> None:
    """Issue 22 point 5: the controller hands status a moved node with its old clique (the
    row it keeps while held); both cliques' peer lists stay as they were, and Ready/Degraded
    name the node, where it was and where it went. Without the move the domain is Ready."""
    held = _held(("a1", "rack-1"), ("a2", "rack-1"))
    first, _ = status.compute(
        _domain(False, channels=[0]), status.Observed(True, "", held, {}), "t0"
    )
    before = {"status": first.model_dump(mode="json")}
    moved = [held[0], status.HeldNode("a2", "10.0.0.2", "rack-1", moved_to="rack-9")]
    st, events = status.compute(
        _domain(False, **first.model_dump(mode="json")),
        status.Observed(True, "", moved, {}),
        "t1",
    )
    obj = {"status": st.model_dump(mode="json")}
    assert peers_of(obj, "a1") == peers_of(before, "a1") == {0: "10.0.0.1", 1: "10.0.0.2"}
    assert peers_of(obj, "a2") == peers_of(before, "a2")
    conds = {c.type: c for c in st.conditions}
    assert (conds[cd.READY].status, conds[cd.READY].reason) == ("False", "CliqueChanged")
    assert (conds[cd.DEGRADED].status, conds[cd.DEGRADED].reason) == ("True", "CliqueChanged")
    assert "a2" in conds[cd.DEGRADED].message
    assert "rack-1" in conds[cd.DEGRADED].message
    assert "rack-9" in conds[cd.DEGRADED].message
    assert any(e.reason == "DegradedTrue" and e.type == "Warning" for e in events)
