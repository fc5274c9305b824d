"""The fleet view's accounting, every number against the hand count in tests/fleetdata.py."""

from __future__ import annotations

from typing import Any

from fabricdra.controller.fleet import fleet
from tests.fleetdata import (
    GB200,
    H100,
    UNVERIFIED,
    _claim,
    _gpu,
    _nic,
    _node_devices,
    _slice,
    node_object,
    scenario,
)


def test_every_number_matches_the_hand_count() -> None:
    s = scenario("x", "team-a")
    view = fleet(
        s["slices"], s["claims"], s["nodeDevices"], s["computeDomains"], s["nodeObjects"]
    ).to_json()
    assert {d["fabricDomain"]: d for d in view["domains"]} == s["expected"]
    assert view["computeDomains"] == [s["computeDomainView"]]
    totals = view["totals"]
    assert totals[GB200] == {
        "total": 20, "healthy": 19, "verified": 16, "allocated": 3, "free": 12,
        "stranded": {"computeDomain": 2, "nicsUnavailable": 4, "total": 6},
    }  # fmt: skip
    assert totals[H100]["free"] == 2
    assert totals["rdma"] == {
        "total": 10, "healthy": 9, "verified": 9, "allocated": 5, "free": 3,
        "stranded": {"computeDomain": 0, "nicsUnavailable": 0, "total": 0},
    }  # fmt: skip


def test_a_node_without_a_verification_record_is_judged_by_its_slices() -> None:
    s = scenario("x", "team-a", no_fabric=False)
    view = fleet(s["slices"], s["claims"], [], s["computeDomains"])
    assert {d.name: d.verifiedNodes for d in view.domains.values()} == {
        "nvlink-ax-1": 3,
        "nvlink-bx-1": 1,  # b2's devices carry the unverified taint
    }


def test_other_drivers_slices_are_not_counted() -> None:
    s = scenario("x", "team-a", no_fabric=False)
    foreign = {"spec": {"driver": "gpu.example.com", "nodeName": "z", "devices": [{"name": "g"}]}}
    view = fleet([*s["slices"], foreign], s["claims"], s["nodeDevices"], [])
    assert sum(d.nodes for d in view.domains.values()) == 5


def test_an_unreachable_api_publishes_no_numbers() -> None:
    from kubernetes import client
    from prometheus_client import CollectorRegistry, generate_latest

    from fabricdra.controller import fleetmetrics

    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing answers
    cfg.retries = False
    registry = CollectorRegistry()
    from fabricdra.controller.manager import Controller

    with client.ApiClient(cfg) as api:
        controller = Controller(api)
        controller.start_caches()
        caches = fleetmetrics.register(controller, registry, min_interval=0)
        try:
            text = generate_latest(registry).decode()
        finally:
            caches.stop()
            controller.stop()
    assert "fabricdra_fleet_up 0.0" in text
    assert "fabricdra_devices_" not in text  # a failed read is never published as zeros


def test_the_dashboard_queries_only_metrics_the_controller_serves() -> None:
    import json
    import re
    from pathlib import Path

    from prometheus_client import CollectorRegistry, generate_latest

    from fabricdra.controller import fleetmetrics

    dashboard = Path(__file__).resolve().parents[2] / "charts/fabricdra/dashboards/fleet.json"
    doc = json.loads(dashboard.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    used = set(re.findall(r"\b(fabricdra_[a-z_]+)", " ".join(exprs)))
    # What the collector serves, from a fleet computed over the hand-counted scenario.
    s = scenario("x", "team-a")
    view = fleet(s["slices"], s["claims"], s["nodeDevices"], [])
    registry = CollectorRegistry()
    registry.register(fleetmetrics.FleetCollector(lambda: view))
    served = set(re.findall(r"^(fabricdra_[a-z_]+)", generate_latest(registry).decode(), re.M))
    assert used
    assert used <= served, used - served


def _one_node(devices: list[dict[str, Any]], **node: Any) -> dict[str, Any]:
    """The fleet view (JSON) of node n1 alone, with `devices` in one slice."""
    return fleet([_slice("n1", devices)], [], [], [], [node_object("n1", **node)]).to_json()


def _gpus(n: int = 2, domain: str | None = "nvlink-z-1", **extra: Any) -> list[dict[str, Any]]:
    return [_gpu(i, GB200, domain, [], {k: {"string": v} for k, v in extra.items()})
            for i in range(n)]  # fmt: skip


def test_basic_model_health_attribute_makes_a_device_neither_healthy_nor_free() -> None:
    # 1.34/1.35 publish no taints: health is the `health` attribute (resourceslices.py).
    devs = [*_gpus(1), _gpu(1, GB200, "nvlink-z-1", [], {"health": {"string": "Unhealthy"}})]
    c = _one_node(devs)["totals"][GB200]
    assert (c["total"], c["healthy"], c["free"]) == (2, 1, 1)


def test_basic_model_verified_false_makes_a_device_neither_verified_nor_free() -> None:
    devs = [_gpu(i, GB200, "nvlink-z-1", [], {"verified": {"bool": False}}) for i in range(2)]
    view = _one_node(devs)
    assert (view["totals"][GB200]["verified"], view["totals"][GB200]["free"]) == (0, 0)
    assert view["domains"][0]["verifiedNodes"] == 0


def test_the_none_domain_fits_a_compute_domain_of_one_at_most() -> None:
    slices = [_slice(f"n{i}", _gpus(2, None)) for i in range(3)]
    view = fleet(slices, [], [], [], [node_object(f"n{i}") for i in range(3)])
    assert view.domains["none"].largestFit == 1
    # A fabric domain's whole nodes still add up.
    slices = [_slice(f"n{i}", _gpus(2)) for i in range(3)]
    view = fleet(slices, [], [], [], [node_object(f"n{i}") for i in range(3)])
    assert view.domains["nvlink-z-1"].largestFit == 3


def test_with_the_verification_gate_off_a_node_counts_verified_whatever_its_old_record() -> None:
    # The agent's gate off: nothing gated in the slices; the NodeDevices record is an old one.
    view = fleet([_slice("n1", _gpus(2))], [], [_node_devices("n1", "Unverified")], [],
                 [node_object("n1")])  # fmt: skip
    assert view.domains["nvlink-z-1"].verifiedNodes == 1
    assert view.domains["nvlink-z-1"].largestFit == 1
    # The gate on and closed: the slices say so, and that decides.
    tainted = [_gpu(i, GB200, "nvlink-z-1", [UNVERIFIED]) for i in range(2)]
    view = fleet([_slice("n1", tainted)], [], [_node_devices("n1", "Verified")], [],
                 [node_object("n1")])  # fmt: skip
    assert view.domains["nvlink-z-1"].verifiedNodes == 0


def test_largest_fit_follows_the_controllers_verified_node_requirement() -> None:
    # Same nodes, counted as gang placement counts them (capacity.py).
    slices = [_slice("n1", _gpus(2)), _slice("n2", _gpus(2))]
    nodes = [node_object("n1", labels={"fabricdra.io/verified": "true"}), node_object("n2")]
    assert fleet(slices, [], [], [], nodes).domains["nvlink-z-1"].largestFit == 2
    required = fleet(slices, [], [], [], nodes, require_verified_nodes=True)
    assert required.domains["nvlink-z-1"].largestFit == 1


def test_an_older_slice_generation_still_listed_is_ignored() -> None:
    old = _slice("n1", _gpus(4), generation=1)
    new = _slice("n1", _gpus(2), generation=2)
    view = fleet([new, old], [], [], [], [node_object("n1")]).to_json()
    assert view["totals"][GB200]["total"] == 2
    # A claim naming a device only the old generation had does not count it allocated.
    claim = _claim("c", "ns", [("n1", "gpu-3")])
    view = fleet([old, new], [claim], [], [], [node_object("n1")]).to_json()
    assert view["totals"][GB200]["allocated"] == 0


def test_cordoned_notready_tainted_and_missing_nodes_are_not_free() -> None:
    not_ready_taint = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    for node in (
        {"cordoned": True},
        {"ready": "False"},
        {"ready": "Unknown"},
        {"taints": [not_ready_taint]},
    ):
        view = _one_node([*_gpus(2), _nic("nic-0")], **node)
        assert view["totals"][GB200]["free"] == 0, node
        assert view["totals"][GB200]["healthy"] == 2, node  # healthy, just not free
        assert view["totals"]["rdma"]["free"] == 0, node
        assert view["domains"][0]["largestFit"] == 0, node
    # A slice whose Node is gone.
    gone = fleet([_slice("n1", _gpus(2))], [], [], [], [node_object("other")])
    assert gone.totals()[GB200].free == 0
    assert _one_node(_gpus(2))["totals"][GB200]["free"] == 2


def test_a_gpu_without_a_free_nic_on_its_pci_root_is_nic_stranded() -> None:
    gpus = [_gpu(i, GB200, "nvlink-z-1", [], {"pciRoot": {"string": f"pci0000:{i}"}})
            for i in range(3)]  # fmt: skip
    nics = [_nic(f"nic-{i}", extra={"pciRoot": {"string": f"pci0000:{i}"}}) for i in range(2)]
    # gpu-0's NIC is taken, gpu-1's is free; gpu-2's root has no NIC: any free NIC serves it.
    claim = _claim("c", "ns", [("n1", "nic-0")])
    view = fleet([_slice("n1", gpus + nics)], [claim], [], [], [node_object("n1")]).to_json()
    assert view["totals"][GB200]["stranded"]["nicsUnavailable"] == 1
    assert view["domains"][0]["largestFit"] == 1  # whole still, for an NVLink-only job


def test_largest_fit_leaves_out_the_nodes_placed_gangs_still_expect() -> None:
    """Placement's room (placement.free_nodes): a gang of 3 placed in the fabric domain and
    holding one node there expects 2 more; a finished gang expects none."""
    slices = [_slice(f"n{i}", _gpus(2)) for i in range(5)]
    nodes = [node_object(f"n{i}") for i in range(5)]

    def gang(name: str, want: int, held: list[str], reason: str = "WaitingForNodes") -> Any:
        return {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"numNodes": want},
            "status": {"fabricDomain": "nvlink-z-1",
                       "nodes": [{"name": n, "fabricDomain": "nvlink-z-1"} for n in held],
                       "conditions": [{"type": "Ready", "status": "False", "reason": reason}]},
        }  # fmt: skip

    view = fleet(slices, [], [], [gang("g", 3, ["n0"])], nodes)
    assert view.domains["nvlink-z-1"].largestFit == 2  # 4 whole nodes, 2 of them expected
    view = fleet(slices, [], [], [gang("g", 3, ["n0"], reason="Finished")], nodes)
    assert view.domains["nvlink-z-1"].largestFit == 4


def test_an_admin_access_claim_does_not_allocate() -> None:
    claim = _claim("monitor", "ns", [("n1", "gpu-0")])
    claim["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    view = fleet([_slice("n1", _gpus(2))], [claim], [], [], [node_object("n1")]).to_json()
    assert (view["totals"][GB200]["allocated"], view["totals"][GB200]["free"]) == (0, 2)


def test_an_efa_function_is_a_nic_for_stranding() -> None:
    # An AWS node: its GPUs' own fabric is EFA, not RDMA endpoints (docs/attributes.md).
    gpus = [_gpu(i, H100, None, [], {"pciRoot": {"string": f"pci0000:{i}"}}) for i in range(2)]
    efas = [
        _nic(f"efa-{i}", extra={"type": {"string": "efa"}, "pciRoot": {"string": f"pci0000:{i}"}})
        for i in range(2)
    ]
    for e in efas:
        del e["attributes"]["rdmaMode"]
    claim = _claim("c", "ns", [("n1", "efa-0")])  # gpu-0's EFA is taken
    view = fleet([_slice("n1", gpus + efas)], [claim], [], [], [node_object("n1")]).to_json()
    assert view["totals"][H100]["stranded"]["nicsUnavailable"] == 1
    assert view["totals"]["efa"]["allocated"] == 1


def test_the_controllers_cut_down_caches_count_the_same() -> None:
    """The controller caches GPU slices and Nodes cut down to what the counts read (issue 22:
    5,000 nodes' full slices outgrew its memory limit); every number is the same as from the
    full objects, taints, shared holders, MIG and health attributes included."""
    import copy

    from fabricdra.controller.capacity import device_slice_view, gpu_room, node_view

    s = scenario("x", "team-a", no_fabric=False)
    nodes = [node_object(sl["spec"]["nodeName"]) for sl in s["slices"]]
    nodes[0]["status"]["images"] = [{"names": ["registry/x:1"], "sizeBytes": 1}]
    nodes[0]["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    full = fleet(s["slices"], s["claims"], [], s["computeDomains"], nodes).to_json()
    slices = [device_slice_view(copy.deepcopy(sl)) for sl in s["slices"]]
    cut = fleet(slices, s["claims"], [], s["computeDomains"], [node_view(n) for n in nodes])
    assert cut.to_json() == full
    assert gpu_room(slices, s["claims"]) == gpu_room(s["slices"], s["claims"])
    assert "images" not in node_view(nodes[0])["status"]
    assert "managedFields" not in node_view(nodes[0])["metadata"]
    assert node_view(nodes[0])["status"]["conditions"] == nodes[0]["status"]["conditions"]


def test_largest_fit_follows_the_controllers_fabric_check() -> None:
    # Under the controller's --fabric-check a node of a fabric domain counts for gangs only
    # once its domain's multi-node NVLink check passed with it (capacity.py): so here.
    slices = [_slice("n1", _gpus(2)), _slice("n2", _gpus(2))]
    fabric = {"fabricdra.io/fabric.domain": "nvlink-z-1", "fabricdra.io/verified": "true"}
    nodes = [
        node_object("n1", labels={**fabric, "fabricdra.io/fabric-verified": "true"}),
        node_object("n2", labels=fabric),
    ]
    assert fleet(slices, [], [], [], nodes).domains["nvlink-z-1"].largestFit == 2
    required = fleet(slices, [], [], [], nodes, require_fabric_verified=True)
    assert required.domains["nvlink-z-1"].largestFit == 1
