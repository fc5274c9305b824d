"""Issue 28 point 4c: causes that kept a gang's pods off a node although capacity.py counted
it, so the gang was placed where it could never fill, cycled through gang timeouts (its
pods' claims pinned there) and stayed while another rack was free: a taint its pods do not
tolerate, fewer free GPUs than a pod uses, an elastic domain taking a tray the gang expects.
Each is now counted (podfit.py, Placement.reserved). Placement is built from in-memory caches
as in test_gang_left_behind."""

from __future__ import annotations

from typing import Any

from fabricdra.api import labels
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.jsontypes import JSON
from fabricdra.controller import podfit
from fabricdra.controller.claims import domain_uid, node_fabric
from fabricdra.controller.deps import PlacementDeps
from fabricdra.controller.indexes import BY_DOMAIN, BY_FABRIC, BY_UID
from fabricdra.controller.ownership import Ownership
from fabricdra.controller.placement import Placement
from tests.unit.test_gang_left_behind import _claim
from tests.unit.test_reconciler_deps import MemApi, MemCache

UID, NS, NAME = "uid-gang", "team", "job"
ELASTIC = "uid-elastic"
MAINTENANCE = {"key": "ops.example.com/maintenance", "value": "rma", "effect": "NoSchedule"}


def _node(name: str, fabric: str, taints: list[dict[str, str]] | None = None) -> JSON:
    return {
        "metadata": {"name": name, "labels": {labels.FABRIC_DOMAIN: fabric}},
        "spec": {"taints": taints} if taints else {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


class World:
    """Racks a (a1, a2) and b (b1, b2); the gang (numNodes 2) and an elastic domain."""

    def __init__(self, *, placed: str = "", tainted: tuple[str, ...] = (), **spec: Any) -> None:
        self.nodes = MemCache(
            [
                _node(n, f, [MAINTENANCE] if n in tainted else None)
                for n, f in (("a1", "rack-a"), ("a2", "rack-a"), ("b1", "rack-b"), ("b2", "rack-b"))
            ],
            {BY_FABRIC: lambda o: [node_fabric(o)]},
        )
        gang = {
            "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": 1},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "job-imex"}}, "numNodes": 2}
            | spec,
            "status": {"fabricDomain": placed, "channels": [1]},
        }
        elastic = {
            "metadata": {"name": "elastic", "namespace": NS, "uid": ELASTIC, "generation": 1},
            "spec": {"channel": {"resourceClaimTemplate": {"name": "el-imex"}}},
            "status": {"channels": [2]},
        }
        self.domains = MemCache([gang, elastic], {BY_UID: lambda o: [o["metadata"]["uid"]]})
        self.claims = MemCache([], {BY_DOMAIN: lambda o: [domain_uid(o)]})
        self.own = Ownership()
        self.own.set_key(UID, f"{NS}/{NAME}")
        self.own.set_key(ELASTIC, f"{NS}/elastic")
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
                enqueue_domain=lambda key: None,
            )
        )

    def place(self) -> str | None:
        obj: Any = self.domains.get(f"{NS}/{NAME}")
        return self.placement.place(ComputeDomain.model_validate(obj), f"{NS}/{NAME}").fabric

    def taint(self, node: str, taint: dict[str, str]) -> None:
        obj = self.nodes.get(node)
        assert obj is not None
        obj["spec"]["taints"] = [taint]


# -- a taint the gang's pods do not tolerate ---------------------------------------------------
def test_a_tray_tainted_by_operations_is_no_room_for_a_gang_that_does_not_tolerate_it() -> None:
    # Counted, rack-a (first by name among equal fits) took the gang; a2 never ran its pod.
    assert World(tainted=("a2",)).place() == "rack-b"


def test_a_tolerated_taint_is_room() -> None:
    tolerate = [{"key": MAINTENANCE["key"], "operator": "Exists"}]
    assert World(tainted=("a2",), tolerations=tolerate).place() == "rack-a"
    wrong_value = [{"key": MAINTENANCE["key"], "value": "other"}]
    assert World(tainted=("a2",), tolerations=wrong_value).place() == "rack-b"


def test_a_taint_most_nodes_carry_says_nothing_about_where_to_go() -> None:
    # e.g. nvidia.com/gpu:NoSchedule on every GPU node: every workload here tolerates it.
    assert World(tainted=("a1", "a2", "b1", "b2")).place() == "rack-a"
    # ... also while a node just added lacks it (else one node would park every gang).
    assert World(tainted=("a1", "a2", "b1")).place() == "rack-a"
    # One tray in four is a tray's condition: counted.
    assert World(tainted=("a2",)).place() == "rack-b"


def test_a_gang_moves_off_a_tray_tainted_after_it_was_placed() -> None:
    world = World(placed="rack-a")
    assert world.place() == "rack-a"
    world.taint("a2", MAINTENANCE | {"effect": "NoExecute"})
    assert world.place() == "rack-b"


def test_taint_matching_follows_kube_scheduler() -> None:
    t = podfit.Toleration
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert podfit.tolerates(t(operator="Exists"), taint)  # empty key + Exists: everything
    assert podfit.tolerates(t(key="k", value="v"), taint)
    assert not podfit.tolerates(t(key="k", value="w"), taint)
    assert not podfit.tolerates(t(key="k", operator="Exists", effect="NoExecute"), taint)
    prefer = {"key": "p", "effect": "PreferNoSchedule"}
    assert podfit.untolerated(_node("n", "r", [prefer]), [], frozenset()) == ""


# -- fewer free GPUs than a pod uses -----------------------------------------------------------
def test_a_tray_with_fewer_free_gpus_than_a_pod_uses_is_no_room() -> None:
    shape = {"parallelism": {"groupGPUs": 4, "gpusPerNode": 4}}
    world = World(**shape)
    # a2 has 2 of its 4 GPUs free (another job took two): a 4-GPU pod cannot go there.
    world.placement._room = {"a1": 4, "a2": 2, "b1": 4, "b2": 4}  # type: ignore[assignment]
    assert world.place() == "rack-b"
    plain = World()  # pods of unknown size: one free GPU is room, as before
    plain.placement._room = {"a1": 4, "a2": 2, "b1": 4, "b2": 4}  # type: ignore[assignment]
    assert plain.place() == "rack-a"


# -- an elastic domain taking a tray the gang expects ------------------------------------------
def test_the_last_free_tray_a_placed_gang_expects_is_refused_to_an_elastic_domain() -> None:
    world = World(placed="rack-a")
    claim = _claim("j0", "rack-a")  # the gang's pods' claims are pinned to rack-a
    world.claims.objs[f"{NS}/j0"] = claim
    world.own.set_owner("a1", UID)
    assert world.place() == "rack-a"
    why = world.placement.reserved("a2", "rack-a", ELASTIC)
    assert why.startswith("node a2 is reserved: the gang(s) placed in fabric domain rack-a"), why
    assert f"{NS}/{NAME}" in why
    assert world.placement.reserved("b1", "rack-b", ELASTIC) == ""  # nobody expects rack-b
    assert world.placement.reserved("a2", "rack-a", UID) == ""  # the gang's own claim


def test_a_gang_without_claims_moves_off_a_tray_an_elastic_domain_took() -> None:
    world = World(placed="rack-a")
    assert world.place() == "rack-a"
    world.own.set_owner("a2", ELASTIC)  # admitted before the reservation existed
    assert world.place() == "rack-b"
