"""`fabricdra fleet` and the controller's fleet metrics against the real control plane: slices,
allocated claims, NodeDevices and a ComputeDomain for several nodes and two fabric domains,
every number checked against the hand count in tests/fleetdata.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.controller import fleetmetrics
from fabricdra.controller.manager import Controller, ControllerConfig
from fabricdra.kube.rest import CLAIMS, COMPUTE_DOMAINS, NODES, SLICES, Rest
from tests.fleetdata import GB200, _gpu, _slice, scenario
from tests.integration.computedomain_helpers import install_crd
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("installed", "leaves_nothing_behind"),
]


@pytest.fixture(scope="module")
def fleet_objects(control_plane: ControlPlane) -> dict[str, Any]:
    """The scenario's objects, created as the plugin, scheduler and controller would leave them.
    Only fabric-domain nodes: the "none" domain is shared with other tests' nodes."""
    suffix = uuid.uuid4().hex[:6]
    ns = f"fleet-{suffix}"
    s = scenario(suffix, ns, no_fabric=False)
    control_plane.create_namespace(ns)
    for body in s["slices"]:  # Ready, schedulable Nodes: devices on them can be free
        control_plane.create_node(body["spec"]["nodeName"])
    with control_plane.api_client() as api:
        rest = Rest(api)
        install_crd(rest)
        for body in s["slices"]:
            rest.create(SLICES, body)
        for body in s["claims"]:
            status = body.pop("status", None)
            rest.create(CLAIMS, body, ns)
            if status:  # what kube-scheduler writes at allocation
                rest.patch(CLAIMS, body["metadata"]["name"], {"status": status}, ns, sub="status")
        for body in s["nodeDevices"]:
            status = body.pop("status")
            rest.create(fleetmetrics.NODE_DEVICES, body)
            rest.patch(fleetmetrics.NODE_DEVICES, body["metadata"]["name"], {"status": status},
                       sub="status")  # fmt: skip
        for body in s["computeDomains"]:
            status = body.pop("status")
            rest.create(COMPUTE_DOMAINS, body, ns)
            rest.patch(COMPUTE_DOMAINS, body["metadata"]["name"], {"status": status}, ns,
                       sub="status")  # fmt: skip
    return s


def _fleet(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabricdra.cli", "fleet", "--kubeconfig", str(cp.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_fleet_json_matches_the_hand_count(
    control_plane: ControlPlane, fleet_objects: dict[str, Any]
) -> None:
    done = _fleet(control_plane, "-o", "json")
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    expected = fleet_objects["expected"]
    ours = {d["fabricDomain"]: d for d in view["domains"] if d["fabricDomain"] in expected}
    assert ours == expected
    ns = fleet_objects["computeDomainView"]["namespace"]
    assert [cd for cd in view["computeDomains"] if cd["namespace"] == ns] == [
        fleet_objects["computeDomainView"]
    ]


def test_fleet_table(control_plane: ControlPlane, fleet_objects: dict[str, Any]) -> None:
    done = _fleet(control_plane)
    assert done.returncode == 0, done.stderr
    a = next(iter(fleet_objects["expected"]))
    rows = [line.split() for line in done.stdout.splitlines()]
    assert [a, GB200, "12", "11", "12", "3", "8", "2"] in rows
    assert [a, "rdma", "6", "6", "6", "3", "3", "0"] in rows
    # nodes, verified, largest fit, free GPUs on partial nodes, stranded by CD / by no NIC
    assert [a, "3", "3", "1", "2", "2", "0"] in rows
    ns = fleet_objects["computeDomainView"]["namespace"]
    assert [f"{ns}/cd1", a, "True", fleet_objects["nodes"]["a3"]] in rows


def test_fleet_tiers_and_defrag(control_plane: ControlPlane, fleet_objects: dict[str, Any]) -> None:
    """Issue 28 point 4: free GPUs, largest gang and segment per switch tier (the scenario's
    nodes put under one leaf), and `--defrag` naming what holds fabric domain A."""
    from fabricdra.api.scaleout import TIER_LABELS

    leaf = f"leaf-{uuid.uuid4().hex[:6]}"
    n = fleet_objects["nodes"]
    a, b = list(fleet_objects["expected"])
    ns = fleet_objects["computeDomainView"]["namespace"]
    with control_plane.api_client() as api:
        rest = Rest(api)
        for key in ("a1", "a2", "a3", "b1", "b2"):
            rest.patch(NODES, n[key], {"metadata": {"labels": {TIER_LABELS[0]: leaf}}})
    done = _fleet(control_plane, "--defrag", "-o", "json")
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert next(r for r in view["tiers"] if r["name"] == leaf) == {
        "tier": "tier-1", "label": TIER_LABELS[0], "name": leaf, "nodes": 5,
        "fabricDomains": [a, b], "freeGpus": 12, "largestGang": 2, "largestSegment": 1,
    }  # fmt: skip
    assert "does not preempt" in view["defrag"]["note"]
    # a2 keeps an unhealthy GPU whatever is evicted: 2 of the 3 nodes come free whole.
    assert next(c for c in view["defrag"]["candidates"] if c["fabricDomain"] == a) == {
        "fabricDomain": a,
        "workloads": [
            {"kind": "ComputeDomain", "namespace": ns, "name": "cd1", "gpus": 2},
            {"kind": "ResourceClaim", "namespace": ns, "name": "c1", "gpus": 1},
        ],
        "evictedGpus": 3,
        "nodes": 3,
        "nodesFreed": 2,
    }
    table = _fleet(control_plane, "--defrag", "--limit", "100")
    assert table.returncode == 0, table.stderr
    assert "kube-scheduler does not preempt" in table.stdout
    rows = [line.split() for line in table.stdout.splitlines()]
    assert ["tier-1", leaf, "5", "2", "12", "2", "1"] in rows
    assert [a, "2/3", "2", "ComputeDomain", f"{ns}/cd1", "2"] in rows


def test_controller_metrics_carry_the_same_numbers(
    control_plane: ControlPlane, fleet_objects: dict[str, Any]
) -> None:
    registry = CollectorRegistry()
    # Served from a controller's caches (its informers only: nothing is reconciled here).
    controller = Controller(control_plane.api_client(), ControllerConfig(leader_election=False))
    controller.start_caches()
    caches = fleetmetrics.register(controller, registry, min_interval=0)
    try:
        wait_for(
            lambda: "fabricdra_fleet_up 1.0" in generate_latest(registry).decode(),
            what="fleet caches synced",
        )
        text = generate_latest(registry).decode()
    finally:
        caches.stop()
        controller.stop()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    a, b = list(fleet_objects["expected"])

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("fabricdra_fleet_up") == 1
    assert value("fabricdra_devices_allocated", fabric_domain=a, device_class=GB200) == 3
    assert value("fabricdra_devices_free", fabric_domain=a, device_class=GB200) == 8
    assert value("fabricdra_devices_published", fabric_domain=b, device_class="rdma") == 2
    assert value("fabricdra_devices_healthy", fabric_domain=b, device_class="rdma") == 1
    assert value("fabricdra_devices_verified", fabric_domain=b, device_class=GB200) == 4
    stranded = "fabricdra_devices_stranded_gpus"
    assert value(stranded, fabric_domain=a, device_class=GB200, reason="computeDomain") == 2
    assert value(stranded, fabric_domain=b, device_class=GB200, reason="nicsUnavailable") == 4
    assert value("fabricdra_fabric_domain_largest_fit_nodes", fabric_domain=a) == 1
    assert value("fabricdra_fabric_domain_verified_nodes", fabric_domain=b) == 1


def test_fleet_watch_prints_again_until_interrupted(
    control_plane: ControlPlane, fleet_objects: dict[str, Any]
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fabricdra.cli", "fleet", "--kubeconfig",
         str(control_plane.kubeconfig), "--watch", "--interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    headers = 0
    try:
        for line in proc.stdout:
            headers += line.startswith("--- ")
            if headers == 2:  # a second view printed: --watch repeats
                break
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    assert headers == 2
    assert proc.returncode == 0, err


def test_fleet_counts_the_newest_slice_generation_on_nodes_that_take_pods(
    control_plane: ControlPlane,
) -> None:
    """The API keeps a pool's older generation listed while the publisher replaces it, and a
    cordoned or NotReady Node keeps its slices: neither is room."""
    suffix = uuid.uuid4().hex[:6]
    fabric = f"nvlink-gen{suffix}-1"
    fresh, cordoned, down = (f"{k}-{suffix}" for k in ("fresh", "cordoned", "down"))
    for node in (fresh, cordoned, down):
        control_plane.create_node(node)
    with control_plane.api_client() as api:
        rest = Rest(api)
        rest.patch(NODES, cordoned, {"spec": {"unschedulable": True}})
        rest.patch(NODES, down, {"status": {"conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}},
            sub="status")  # fmt: skip
        gpus = [_gpu(i, GB200, fabric, []) for i in range(4)]
        rest.create(SLICES, _slice(fresh, gpus, generation=1))  # the older, still listed
        rest.create(SLICES, _slice(fresh, gpus[:2], generation=2))
        rest.create(SLICES, _slice(cordoned, gpus[:2]))
        rest.create(SLICES, _slice(down, gpus[:2]))
    done = _fleet(control_plane, "-o", "json")
    assert done.returncode == 0, done.stderr
    view = {d["fabricDomain"]: d for d in json.loads(done.stdout)["domains"]}[fabric]
    counts = view["classes"][GB200]
    assert (counts["total"], counts["healthy"], counts["free"]) == (6, 6, 2)
    assert (view["nodes"], view["largestFit"]) == (3, 1)
