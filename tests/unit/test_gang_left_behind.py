"""A gang is never moved away from the claims its pods already have (placement.py): a claim
made from the template pinned to fabric domain F can be allocated in F only (its spec never
changes), so a gang placed elsewhere refused every allocation of it at binding (`NodeHeld`)
for as long as the pod existed. The 500-node bench with a 60 s gang timeout never finished
that way. Placement here is built from in-memory caches (as in test_reconciler_deps); the
same behaviour against a real API server: tests/integration/test_computedomain_placement.py."""

from __future__ import annotations

from typing import Any

from fabricdra.api import computedomain as cd
from fabricdra.api import labels
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.jsontypes import JSON
from fabricdra.controller import objects, status
from fabricdra.controller.claims import domain_uid, node_fabric
from fabricdra.controller.deps import PlacementDeps
from fabricdra.controller.indexes import BY_DOMAIN, BY_FABRIC, BY_UID
from fabricdra.controller.ownership import Ownership
from fabricdra.controller.placement import Placement
from tests.unit.test_reconciler_deps import MemApi, MemCache

UID, NS, NAME = "uid-gang", "team", "job"


def _node(name: str, fabric: str, *, cordoned: bool = False) -> JSON:
    return {
        "metadata": {"name": name, "labels": {labels.FABRIC_DOMAIN: fabric}},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _domain(placed: str) -> JSON:
    return {
        "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": 1},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "job-imex"}}, "numNodes": 2},
        "status": {"fabricDomain": placed, "channels": [1]},
    }


def _claim(name: str, fabric: str | None) -> JSON:
    """A claim as kube-controller-manager makes it from the domain's template pinned to
    `fabric` (None: the template before the domain was pinned)."""
    domain = ComputeDomain.model_validate(_domain(fabric or ""))
    template = objects.workload_claim_template(domain, 1, fabric)
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": template["spec"]["metadata"]["labels"],
        },
        "spec": template["spec"]["spec"],
    }


class World:
    """Two fabric domains of two nodes each; the gang (numNodes 2) placed in rack-a."""

    def __init__(self, *, cordoned: str = "", claims: list[JSON] | None = None) -> None:
        self.nodes = MemCache(
            [
                _node(n, f, cordoned=n == cordoned)
                for n, f in (("a1", "rack-a"), ("a2", "rack-a"), ("b1", "rack-b"), ("b2", "rack-b"))
            ],
            {BY_FABRIC: lambda o: [node_fabric(o)]},
        )
        self.domains = MemCache([_domain("rack-a")], {BY_UID: lambda o: [o["metadata"]["uid"]]})
        self.claims = MemCache(claims or [], {BY_DOMAIN: lambda o: [domain_uid(o)]})
        self.own = Ownership()
        self.own.set_key(UID, f"{NS}/{NAME}")
        self.enqueued: list[str] = []
        self.placement = Placement(
            PlacementDeps(
                rest=MemApi(),
                domains=self.domains,
                nodes=self.nodes,
                claims=self.claims,
                device_slices=MemCache(),
                allocations=MemCache(),
                ownership=self.own,
                require_verified_nodes=False,
                enqueue_domain=self.enqueued.append,
            )
        )

    def place(self) -> str | None:
        obj: Any = self.domains.get(f"{NS}/{NAME}")
        return self.placement.place(ComputeDomain.model_validate(obj), f"{NS}/{NAME}").fabric

    def pods_gone(self) -> None:
        self.claims.objs.clear()


def test_a_claim_says_which_fabric_domain_its_template_pinned_it_to() -> None:
    assert objects.pinned_fabric(_claim("c", "rack-a")) == "rack-a"
    assert objects.pinned_fabric(_claim("c", "")) == ""  # pinned to nodes without a fabric
    assert objects.pinned_fabric(_claim("c", None)) is None
    assert objects.pinned_fabric({"metadata": {"name": "other"}}) is None


def test_a_timed_out_gang_stays_while_its_pods_claims_can_only_go_there() -> None:
    world = World(claims=[_claim("j0", "rack-a"), _claim("j1", "rack-a")])
    assert world.place() == "rack-a"
    world.own.set_owner("a1", UID)  # one pod's claim got there in time; a2 failed it
    note = world.placement.failed(UID, "rack-a", ["a1"])
    assert note.startswith("the gang stays placed in fabric domain rack-a: 2 claim(s)"), note
    assert world.placement.timed_out(UID) == note  # its Ready message says so (status.py)
    world.own.set_owner("a1", cd.FREE_OWNER)  # released
    assert world.place() == "rack-a"
    # A second claim of the gang released on another node: the same answer, nothing more.
    assert world.placement.failed(UID, "rack-a", []).startswith("the gang stays placed")
    # Its pods are made again (their claims go with the old pods): now it moves, without a2.
    world.pods_gone()
    assert world.place() == "rack-b"
    assert world.placement.timed_out(UID).startswith(
        "the gang is placed again, in fabric domain rack-b,"
    )


def test_a_timed_out_gang_without_pods_tied_to_its_fabric_domain_moves_at_once() -> None:
    # Claims made before the gang was placed (unpinned) can follow it anywhere.
    world = World(claims=[_claim("j0", None)])
    assert world.place() == "rack-a"
    world.own.set_owner("a1", UID)
    note = world.placement.failed(UID, "rack-a", ["a1"])
    assert note.startswith("the gang is placed again without the nodes"), note
    assert world.enqueued == [f"{NS}/{NAME}"]
    world.own.set_owner("a1", cd.FREE_OWNER)
    assert world.place() == "rack-b"


def test_a_gang_that_ran_where_it_was_kept_is_not_moved_when_its_pods_end() -> None:
    world = World(claims=[_claim("j0", "rack-a"), _claim("j1", "rack-a")])
    assert world.place() == "rack-a"
    world.placement.failed(UID, "rack-a", [])
    world.placement.ran(UID)  # retried there, it held both nodes
    assert world.placement.timed_out(UID) == ""  # nothing to say about it any more
    world.pods_gone()  # and completed
    assert world.place() == "rack-a"


def test_a_gang_waiting_again_after_its_timeout_says_why_in_ready() -> None:
    domain = ComputeDomain.model_validate(_domain("rack-a"))
    note = "the gang stays placed in fabric domain rack-a: ..."
    new, _ = status.compute(domain, status.Observed(True, "", [], {}, gang_timeout=note), "t0")
    ready = next(c for c in new.conditions if c.type == cd.READY)
    assert (ready.status, ready.reason) == ("False", "WaitingForNodes")
    assert ready.message == f"0/2 nodes joined; the gang timeout released it: {note}"


def test_a_gang_whose_node_fails_stays_while_its_pods_claims_can_only_go_there() -> None:
    """A node of its fabric domain cordoned before the gang got all its nodes: it moves at
    once when nothing ties it there (placement.py `_still_fits`), not while claims of its
    pods were made for it there."""
    world = World(cordoned="a2", claims=[_claim("j0", "rack-a")])
    assert world.place() == "rack-a"
    world.pods_gone()
    assert world.place() == "rack-b"


def test_a_gang_timer_runs_from_its_claims_allocation_time() -> None:
    """Issue 29, point 7: a fresh Ownership (a restarted or newly elected controller) that
    first sees a gang's claims 250 s after they were allocated has 50 s left of a 300 s
    timeout, not 300; the earliest allocation of the gang starts its one timer; a claim
    allocated after a release starts a new one."""
    from fabricdra.controller.claims import allocated_at

    gang, t0 = (UID, "fabric-a"), 1_000_000.0
    own = Ownership()
    assert own.gang_hold("team/b", gang, 300, allocated_at=t0 + 10, now=t0 + 250) == 60
    assert own.gang_hold("team/a", gang, 300, allocated_at=t0, now=t0 + 250) == 50
    assert own.gang_hold("team/b", gang, 300, allocated_at=t0 + 10, now=t0 + 251) == 49
    assert own.gang_hold("team/a", gang, 300, allocated_at=t0, now=t0 + 300) is None
    assert own.gang_hold("team/b", gang, 300, allocated_at=t0 + 10, now=t0 + 301) is None
    assert own.gang_hold("team/b", gang, 300, allocated_at=t0 + 320, now=t0 + 330) == 290
    # Unknown allocation time (the API does not say): from now; a stamp ahead of our clock
    # never extends the wait.
    other = Ownership()
    assert other.gang_hold("team/c", ("u2", "f"), 300, now=t0) == 300
    assert other.gang_hold("team/d", ("u3", "f"), 300, allocated_at=t0 + 99, now=t0) == 300
    # The API keeps whole seconds: the end of the recorded second.
    stamped = {"status": {"allocation": {"allocationTimestamp": "2026-12-07T00:00:00Z"}}}
    assert allocated_at(stamped) == 1796601601.0
    assert allocated_at({"status": {"allocation": {}}}) is None
