"""The fleet view's accounting, every number against the hand count in tests/fleetdata.py."""

from __future__ import annotations

from fabricdra.controller.fleet import fleet
from tests.fleetdata import GB200, H100, scenario


def test_every_number_matches_the_hand_count() -> None:
    s = scenario("x", "team-a")
    view = fleet(s["slices"], s["claims"], s["nodeDevices"], s["computeDomains"]).to_json()
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
    with client.ApiClient(cfg) as api:
        fleetmetrics.register(api, registry, min_interval=0)
        text = generate_latest(registry).decode()
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


# --- issue 18 point 7: admin access, and the basic model's health --------------------------


def _gpu(name: str, **attrs: object) -> dict[str, object]:
    kinds = {bool: "bool", str: "string"}
    base: dict[str, object] = {"type": "gpu", "deviceClass": "h100-80gb-sxm", **attrs}
    return {
        "name": name,
        "attributes": {k: {kinds[type(v)]: v} for k, v in base.items()},
    }


def _slice(node: str, *devices: dict[str, object]) -> dict[str, object]:
    return {
        "spec": {
            "driver": "devices.fabricdra.io",
            "nodeName": node,
            "pool": {"name": node},
            "devices": list(devices),
        }
    }


def _claim(node: str, device: str, admin: bool) -> dict[str, object]:
    result: dict[str, object] = {
        "request": "r",
        "driver": "devices.fabricdra.io",
        "pool": node,
        "device": device,
    }
    if admin:
        result["adminAccess"] = True
    return {"status": {"allocation": {"devices": {"results": [result]}}}}


def test_an_admin_access_claim_takes_no_device() -> None:
    """Admin access (monitoring, repair) looks at a device without taking it: the scheduler
    still hands the device out, so the fleet view must still count it free."""
    slices = [_slice("n1", _gpu("gpu-0"), _gpu("gpu-1"))]
    claims = [_claim("n1", "gpu-0", admin=True), _claim("n1", "gpu-1", admin=False)]
    c = fleet(slices, claims, [], []).totals()["h100-80gb-sxm"]
    assert (c.total, c.allocated, c.free) == (2, 1, 1)


def test_on_the_basic_model_an_unhealthy_device_is_neither_healthy_nor_free() -> None:
    """1.34/1.35 publish no taints: health is the `health` attribute, the gate `verified`."""
    slices = [
        _slice(
            "n1",
            _gpu("gpu-0", health="Unhealthy", verified=True),
            _gpu("gpu-1", health="Healthy", verified=False),
            _gpu("gpu-2", health="Healthy", verified=True),
            _gpu("gpu-3", health="Unknown", verified=True),  # not known bad: counted healthy
        )
    ]
    c = fleet(slices, [], [], []).totals()["h100-80gb-sxm"]
    assert (c.total, c.healthy, c.verified, c.free) == (4, 3, 3, 2)
