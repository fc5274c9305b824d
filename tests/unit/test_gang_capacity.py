"""Which nodes gang placement counts (controller/capacity.py, issue 22 point 3): only those
that can take a pod now."""

from __future__ import annotations

from typing import Any

from fabricdra.api import labels
from fabricdra.controller.capacity import unusable, usable_by_fabric


def _node(
    name: str,
    fabric: str = "rack-a",
    *,
    ready: str | None = "True",
    cordoned: bool = False,
    taints: tuple[str, ...] = (),
    verified: bool = False,
) -> dict[str, Any]:
    node_labels = {labels.FABRIC_DOMAIN: fabric} if fabric else {}
    if verified:
        node_labels[labels.VERIFIED] = "true"
    conds = [] if ready is None else [{"type": "Ready", "status": ready}]
    spec: dict[str, Any] = {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints]}
    if cordoned:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": name, "labels": node_labels},
        "spec": spec,
        "status": {"conditions": conds},
    }


def test_only_ready_schedulable_nodes_count() -> None:
    assert unusable(_node("ok")) == ""
    assert unusable(_node("down", ready="False")) == "Ready is False"
    assert unusable(_node("gone", ready="Unknown")) == "Ready is Unknown"
    assert unusable(_node("new", ready=None)) == "Ready is not reported"
    assert unusable(_node("drained", cordoned=True)) == "cordoned"
    assert "unreachable" in unusable(_node("far", taints=("node.kubernetes.io/unreachable",)))
    # A taint the workload may tolerate is the workload's business, not placement's.
    assert unusable(_node("gpu", taints=("nvidia.com/gpu",))) == ""


def test_verified_only_where_the_gate_is_required() -> None:
    assert unusable(_node("fresh"), require_verified=False) == ""
    assert "not verified" in unusable(_node("fresh"), require_verified=True)
    assert unusable(_node("checked", verified=True), require_verified=True) == ""


def test_usable_by_fabric_keeps_a_fabric_whose_nodes_all_fail() -> None:
    nodes = [
        _node("a1"),
        _node("a2", ready="False"),
        _node("b1", "rack-b", cordoned=True),
        _node("c1", "rack-c"),
        _node("c2", "rack-c"),
        _node("plain", ""),
    ]
    assert usable_by_fabric(nodes, exclude={"c2"}) == {
        "rack-a": ["a1"],
        "rack-b": [],
        "rack-c": ["c1"],
    }


def test_a_node_counts_only_with_a_free_healthy_verified_gpu() -> None:
    """Issue 18 point 8: the fleet view's device rules (capacity.devices/allocate) decide the
    room, over the same wire-form slices and claims."""
    from fabricdra.controller.capacity import gpu_room
    from tests.fleetdata import GB200, UNHEALTHY, UNVERIFIED, _claim, _gpu, _nic, _slice

    slices = [
        _slice("ok", [_gpu(0, GB200, "rack-a", []), _gpu(1, GB200, "rack-a", [])]),
        _slice("sick", [_gpu(0, GB200, "rack-a", [UNHEALTHY])]),
        _slice("gated", [_gpu(0, GB200, "rack-a", [UNVERIFIED])]),
        _slice("basic-sick", [_gpu(0, GB200, "rack-a", [], {"health": {"string": "Unhealthy"}})]),
        _slice("full", [_gpu(0, GB200, "rack-a", [])]),
        _slice("nics-only", [_nic("nic-0")]),
    ]
    room = gpu_room(slices, [_claim("c", "ns", [("full", "gpu-0"), ("ok", "gpu-1")])])
    assert room == {"ok": 1, "sick": 0, "gated": 0, "basic-sick": 0, "full": 0}
    names = ["ok", "sick", "gated", "basic-sick", "full", "nics-only", "no-slice"]
    nodes = [_node(n) for n in names]
    # A node that publishes no GPU of ours is judged by the node alone.
    assert usable_by_fabric(nodes, gpu_room=room) == {"rack-a": ["ok", "nics-only", "no-slice"]}
    # The gang's own nodes (their GPUs allocated to it) still count for it.
    assert usable_by_fabric(nodes, gpu_room=room, keep={"full"})["rack-a"] == [
        "ok", "full", "nics-only", "no-slice"
    ]  # fmt: skip


def test_a_finished_gang_says_so_in_ready() -> None:
    """Issue 18 point 8: Ready=False, Finished is what releases a gang's placement (placement
    .finished reads it back from the status, so a restarted controller honours it too)."""
    from fabricdra.api.computedomain import ComputeDomain
    from fabricdra.controller import status
    from fabricdra.controller.placement import FINISHED, finished

    domain = ComputeDomain.model_validate(
        {
            "apiVersion": "fabricdra.io/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": "job", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": {"numNodes": 2, "imexMode": "host",
                     "channel": {"resourceClaimTemplate": {"name": "job-channel"}}},
            "status": {"fabricDomain": "rack-a", "channels": [0]},
        }
    )  # fmt: skip
    observed = status.Observed(True, "", [], {}, finished=True)
    new, _ = status.compute(domain, observed, "2026-01-01T00:00:00Z")
    ready = next(c for c in new.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", FINISHED)
    assert "rack-a" in ready.message
    assert finished({"status": new.model_dump(mode="json")})
    assert not finished({"status": {"conditions": [{"type": "Ready", "reason": "Ready"}]}})


def _fabric_checked(node: dict[str, Any]) -> dict[str, Any]:
    node["metadata"]["labels"][labels.FABRIC_VERIFIED] = "true"
    return node


def test_a_verified_node_of_an_unchecked_fabric_domain_is_not_offered_under_the_fabric_check() -> (
    None
):
    """Issue 18 point 4: the per-node probes never see the NVLink trunk between trays, so
    under `--fabric-check` a node of a fabric domain counts only once its domain's multi-node
    check passed with it; the unusable reason says which domain is waiting for it."""
    fresh = _node("tray", "nvlink-abc-1", verified=True)
    assert unusable(fresh, require_verified=True) == ""  # the fabric check not required
    why = unusable(fresh, require_verified=True, require_fabric_verified=True)
    assert why == (
        "fabric domain nvlink-abc-1 not checked yet (fabricdra.io/fabric-verified is not 'true')"
    )
    checked = _fabric_checked(_node("tray", "nvlink-abc-1", verified=True))
    assert unusable(checked, require_verified=True, require_fabric_verified=True) == ""
    # Verified still comes first: the fabric label does not open the per-node gate.
    assert "not verified" in unusable(
        _fabric_checked(_node("t")), require_verified=True, require_fabric_verified=True
    )


def _failed(node: dict[str, Any], reason: str) -> dict[str, Any]:
    """The node with a failed check's record for the fabric domain it is in."""
    import json

    record = {
        "fabric": node["metadata"]["labels"][labels.FABRIC_DOMAIN],
        "passed": False,
        "reason": reason,
        "time": "2026-01-01T00:00:00Z",
        "fingerprint": "f",
    }
    node["metadata"]["annotations"] = {labels.FABRIC_CHECK: json.dumps(record)}
    return node


def test_a_failed_fabric_check_is_the_reason_given() -> None:
    node = _failed(
        _node("tray", "nvlink-abc-1", verified=True),
        "t1 GPU 0 <- t2 GPU 3: 12.5 GB/s, below 600 GB/s",
    )
    why = unusable(node, require_fabric_verified=True)
    assert why == (
        "fabric domain nvlink-abc-1 failed its multi-node NVLink check: "
        "t1 GPU 0 <- t2 GPU 3: 12.5 GB/s, below 600 GB/s"
    )


def test_nodes_in_no_multi_node_fabric_are_not_held_to_the_fabric_check() -> None:
    for fabric in ("", labels.NO_FABRIC):
        node = _node("box", fabric, verified=True)
        assert unusable(node, require_verified=True, require_fabric_verified=True) == ""


def test_usable_by_fabric_counts_only_fabric_checked_nodes_under_the_fabric_check() -> None:
    nodes = [
        _node("a1", "rack-a", verified=True),
        _node("a2", "rack-a", verified=True),
        _fabric_checked(_node("b1", "rack-b", verified=True)),
        _fabric_checked(_node("b2", "rack-b", verified=True)),
    ]
    assert usable_by_fabric(nodes, require_verified=True) == {
        "rack-a": ["a1", "a2"],
        "rack-b": ["b1", "b2"],
    }
    assert usable_by_fabric(nodes, require_verified=True, require_fabric_verified=True) == {
        "rack-a": [],
        "rack-b": ["b1", "b2"],
    }


def test_what_holds_nodes_back_under_the_fabric_check_is_said_per_fabric_domain() -> None:
    """Issue 29 point 10d: a gang waiting under the fabric check said only "no room". Now its
    message names the cause per fabric domain: what the domain's check is doing (no
    verification image, waiting, failed with its pair), else its nodes' records; domains
    with the same cause are named together, so 277 racks make one line."""
    from fabricdra.controller.capacity import held_back_by_fabric_check

    failed = _failed(
        _node("c1", "rack-c", verified=True), "c1/GPU 0 <- c2/GPU 3: 12.50 GB/s, below 335 GB/s"
    )
    nodes = {
        "a1": _node("a1", "rack-a", verified=True),
        "b1": _node("b1", "rack-b", verified=True),
        "c1": failed,
        "d1": _node("d1", "rack-d", verified=True),
        "e1": _fabric_checked(_node("e1", "rack-e", verified=True)),
    }
    no_image = "the check did not run: no verification image is configured"
    states = {"rack-a": no_image, "rack-b": no_image}
    counted = {"rack-a": [], "rack-b": [], "rack-c": [], "rack-d": [], "rack-e": ["e1"]}
    unchecked_too = {f: [n for n, o in nodes.items() if _fabric(o) == f] for f in counted}
    said = held_back_by_fabric_check(counted, unchecked_too, nodes.get, lambda f: states.get(f, ""))
    assert said == (
        "the multi-node NVLink check (--fabric-check) has not passed with nodes that would "
        f"count: fabric domains rack-a, rack-b: {no_image}; fabric domain rack-c: the check "
        "failed: c1/GPU 0 <- c2/GPU 3: 12.50 GB/s, below 335 GB/s; fabric domain rack-d: not "
        "checked yet (fabricdra.io/fabric-verified is not 'true')"
    )
    # Many racks with one cause: a few named, the rest counted.
    many = {f"rack-{i:03d}": [f"n{i}"] for i in range(277)}
    line = held_back_by_fabric_check(
        {f: [] for f in many}, many, lambda n: None, lambda f: no_image
    )
    assert line.endswith(f"rack-000, rack-001, rack-002 and 274 more: {no_image}")
    # Nothing held back by the check: nothing said.
    assert held_back_by_fabric_check(counted, counted, nodes.get, states.get) == ""


def _fabric(node: dict[str, Any]) -> str:
    return str(node["metadata"]["labels"].get(labels.FABRIC_DOMAIN, ""))
