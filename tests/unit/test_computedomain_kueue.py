"""A ComputeDomain whose nodes Kueue assigns (annotation fabricdra.io/placed-by: kueue) is
never placed by the controller (issue 28 point 5): Kueue's topology-aware scheduling chooses
the pods' nodes, and a gang placed here (numNodes) pins its claim template to a fabric domain
that may not be Kueue's, so its pods' claims could be allocated nowhere Kueue lets them run.
It follows its claims instead, as an elastic domain does. Built on the in-memory placement
of test_gang_left_behind."""

from __future__ import annotations

from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.jsontypes import JSON
from fabricdra.controller import objects
from fabricdra.controller.claims import domain_uid, node_fabric
from fabricdra.controller.deps import PlacementDeps
from fabricdra.controller.indexes import BY_DOMAIN, BY_FABRIC, BY_UID
from fabricdra.controller.ownership import Ownership
from fabricdra.controller.placement import Placement, is_gang
from fabricdra.kube.rest import COMPUTE_DOMAINS
from tests.unit.test_gang_left_behind import _node
from tests.unit.test_reconciler_deps import MemApi, MemCache

UID, NS, NAME = "uid-kueue", "team", "job"


def _domain(*, kueue: bool, spans: bool = False) -> JSON:
    meta: JSON = {"name": NAME, "namespace": NS, "uid": UID, "generation": 1}
    if kueue:
        meta["annotations"] = {cd.PLACED_BY: cd.PLACED_BY_KUEUE}
    spec: JSON = {"channel": {"resourceClaimTemplate": {"name": "job-imex"}}, "numNodes": 2}
    if spans:
        spec |= {"allowMultipleCliques": True, "segmentSize": 1}
    return {"metadata": meta, "spec": spec, "status": {"channels": [1]}}


class World:
    """Two fabric domains: rack-a with two nodes free, rack-b with three (best fit: rack-a)."""

    def __init__(self, domain: JSON) -> None:
        nodes = (("a1", "rack-a"), ("a2", "rack-a"), ("b1", "rack-b"), ("b2", "rack-b"))
        self.nodes = MemCache(
            [_node(n, f) for n, f in (*nodes, ("b3", "rack-b"))],
            {BY_FABRIC: lambda o: [node_fabric(o)]},
        )
        self.domains = MemCache([domain], {BY_UID: lambda o: [o["metadata"]["uid"]]})
        self.rest = MemApi()
        self.rest.put(COMPUTE_DOMAINS, domain)
        self.own = Ownership()
        self.own.set_key(UID, f"{NS}/{NAME}")
        self.enqueued: list[str] = []
        self.placement = Placement(
            PlacementDeps(
                rest=self.rest,
                domains=self.domains,
                nodes=self.nodes,
                claims=MemCache([], {BY_DOMAIN: lambda o: [domain_uid(o)]}),
                device_slices=MemCache(),
                allocations=MemCache(),
                ownership=self.own,
                require_verified_nodes=False,
                enqueue_domain=self.enqueued.append,
            )
        )

    def domain(self) -> ComputeDomain:
        obj: Any = self.domains.get(f"{NS}/{NAME}")
        return ComputeDomain.model_validate(obj)


def test_a_gang_is_placed_by_the_controller_without_the_annotation() -> None:
    """The contrast: without Kueue the same numNodes 2 is pinned to best fit's rack-a, so a
    Kueue assignment in rack-b would leave its claims nowhere to go."""
    world = World(_domain(kueue=False))
    assert is_gang(world.domain())
    assert world.placement.place(world.domain(), f"{NS}/{NAME}").fabric == "rack-a"
    assert world.own.pin_of(UID) == "rack-a"


def test_a_kueue_placed_gang_is_never_placed_nor_pinned() -> None:
    world = World(_domain(kueue=True))
    domain = world.domain()
    assert not is_gang(domain)  # follows its claims (domains.py _pin), never steered
    placed = world.placement.place(domain, f"{NS}/{NAME}")
    assert (placed.fabric, placed.plan, placed.waiting) == (None, None, "")
    assert world.own.pin_of(UID) is None
    # Its claim template is made unpinned: claims go wherever Kueue's nodes are.
    template = objects.workload_claim_template(domain, 1, placed.fabric)
    assert (
        objects.pinned_fabric({"metadata": {"labels": template["spec"]["metadata"]["labels"]}})
        is None
    )


def test_a_kueue_placed_gang_is_not_moved_by_its_first_claim() -> None:
    """follow() moves a gang's placement to where its first claim landed and records it as
    the gang's fabric domain: a Kueue-placed domain has no placement to move or record."""
    world = World(_domain(kueue=True))
    assert world.placement.follow(UID, "rack-b") is False
    assert world.own.pin_of(UID) is None
    stored = world.rest.get(COMPUTE_DOMAINS, NAME, NS)
    assert not stored["status"].get("fabricDomain"), stored["status"]
    assert world.enqueued == []


def test_a_kueue_placed_spanning_gang_gets_no_placement() -> None:
    world = World(_domain(kueue=True, spans=True))
    domain = world.domain()
    assert domain.spec.spans
    placed = world.placement.place(domain, f"{NS}/{NAME}")
    assert (placed.fabric, placed.plan, placed.waiting) == (None, None, "")


def test_a_kueue_placed_gang_that_times_out_is_not_placed_again() -> None:
    """The gang timeout places a gang again without the nodes that failed it: not one whose
    nodes Kueue chose (its pin, from its first admission, stays; nothing is excluded)."""
    world = World(_domain(kueue=True))
    world.own.pin(UID, "rack-a")  # the elastic pin of its first admission (domains.py _pin)
    note = world.placement.failed(UID, "rack-a", ["a1"])
    assert note.startswith("Kueue assigned the gang's nodes"), note
    assert world.own.pin_of(UID) == "rack-a"
    assert world.placement.timed_out(UID) == ""
    assert world.placement.place(world.domain(), f"{NS}/{NAME}").fabric is None
