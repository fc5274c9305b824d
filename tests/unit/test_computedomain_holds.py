"""Issue 29 point 2, the controller's pure parts: which domain a claim belongs to, and so who
holds a node, follows the claim's configuration (its spec, immutable once made), never the
domain label its owner can edit; a deleted domain's admitted claims hold their node while
they stay allocated; the claim informer keeps every domain claim whatever its labels."""

from __future__ import annotations

import copy
from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.controller import admission
from fabricdra.controller.claims import channel_of, claim_view, claim_views, domain_uid

A, B = "uid-a", "uid-b"


def _claim(
    namespace: str = "team-a",
    *,
    domain: str = A,
    domain_ns: str = "team-a",
    label: bool = True,
    admitted: bool = True,
) -> dict[str, Any]:
    """A workload claim as made from domain `domain`'s template and allocated on n1."""
    params = {
        "kind": cd.OPAQUE_KIND,
        "namespace": domain_ns,
        "domainName": "job",
        "domainUID": domain,
        "channel": 3,
    }
    result: dict[str, Any] = {
        "driver": cd.DRIVER,
        "pool": "n1",
        "device": cd.CHANNEL_DEVICE,
        "request": "channel",
        "bindingConditions": [cd.ADMITTED_CONDITION],
    }
    devices = []
    if admitted:
        key = {k: result[k] for k in ("driver", "pool", "device")}
        devices = [{**key, "conditions": [{"type": cd.ADMITTED_CONDITION, "status": "True"}]}]
    return {
        "metadata": {
            "name": "c",
            "namespace": namespace,
            "uid": "claim-uid",
            "labels": {cd.DOMAIN_LABEL: domain} if label else {},
        },
        "spec": {
            "devices": {
                "requests": [{"name": "channel"}],
                "config": [{"opaque": {"driver": cd.DRIVER, "parameters": params}}],
            }
        },
        "status": {"allocation": {"devices": {"results": [result]}}, "devices": devices},
    }


def test_a_claim_whose_label_was_stripped_still_belongs_to_its_domain() -> None:
    stripped = _claim(label=False)
    assert domain_uid(stripped) == A
    (view,) = claim_views(stripped, "n1", {A: "team-a"})
    assert (view.domain, view.state) == (A, "admitted")
    # A label naming another domain changes nothing either.
    relabelled = _claim()
    relabelled["metadata"]["labels"][cd.DOMAIN_LABEL] = B
    assert domain_uid(relabelled) == A
    assert channel_of(stripped) == 3


def test_a_deleted_domains_admitted_claim_still_holds_its_node() -> None:
    """Tenant A deleted its domain and stripped the label while its pod runs: the node stays
    A's until the claim is no longer allocated, and tenant B's claim is refused with why."""
    (held,) = claim_views(_claim(label=False), "n1", {})  # the domain is gone
    assert held.domain == A
    b_claim = admission.ClaimOnNode(key="team-b/b", domain=B, state="pending", since="t2")
    d = admission.decide("n1", "", [held, b_claim], {B: None})
    assert d.owner == A
    assert d.admit == []
    ((key, why),) = d.conflicts
    assert key == "team-b/b"
    assert f"held by claims of ComputeDomain {A}, which is deleted" in why


def test_a_claim_speaks_only_for_a_domain_of_its_own_namespace() -> None:
    # A claim in team-b whose configuration names team-a's domain holds nothing for it,
    # whether the domain is live or gone.
    forged = _claim("team-b")
    for live in ({A: "team-a"}, {}):
        (view,) = claim_views(forged, "n1", live)
        assert view.domain == ""
    # Nor does one that says the domain is in team-b while it is in team-a.
    (view,) = claim_views(_claim("team-b", domain_ns="team-b"), "n1", {A: "team-a"})
    assert view.domain == ""


def test_the_claim_informer_keeps_every_domain_claim_and_only_names_of_others() -> None:
    stripped = _claim(label=False)
    stripped["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    kept = claim_view(copy.deepcopy(stripped))
    del stripped["metadata"]["managedFields"]
    assert kept == stripped
    gpu = {
        "metadata": {"name": "g", "namespace": "t", "uid": "u", "resourceVersion": "7"},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": {"results": [{"driver": "gpu.example.com"}]}}},
    }
    assert claim_view(gpu) == {"metadata": gpu["metadata"]}
