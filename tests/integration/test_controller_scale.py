"""Issue 22 point 10: what the controller costs per event, against a real kube-apiserver: a
fleet-metrics scrape sends no LIST (the API server's audit log says), a report Lease's
heartbeat reconciles nothing, and a node reconcile reads only its own node's claims."""

from __future__ import annotations

import subprocess
import sys
import threading
import urllib.request
import uuid
from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from e2e.harness.process import free_port
from fabricdra.api import computedomain as cd
from fabricdra.controller import metrics
from fabricdra.controller.manager import USER_AGENT, Controller, ControllerConfig
from fabricdra.controller.objects import DaemonSettings
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    CLAIMS,
    COMPUTE_DOMAINS,
    LEASES,
    MERGE_PATCH,
    NODES,
    Rest,
)
from fabricdra.kubeletplugin.computedomain.report import lease_name, write_report

from .computedomain_helpers import (
    allocate_claim,
    condition,
    create_plugin_node,
    domain_body,
    new_namespace,
    running_controller,
    settle,
    unique,
    write_allocation,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]
DEVICES_DRIVER = "devices.fabricdra.io"
FLEET_KINDS = {"resourceslices", "resourceclaims", "nodes", "computedomains", "nodedevices"}


def _unselected_lists(cp: ControlPlane, marker: str) -> tuple[int, bool]:
    """The controller's LISTs of what the fleet view reads, without a selector (what a scrape
    that lists sends; the controller's informers list with their selectors, or once at start),
    and whether `marker` (a request made after the scrape) is in the log yet."""
    events = cp.audit_events()
    seen = any(marker in e.get("requestURI", "") for e in events)
    lists = [
        e
        for e in events
        if USER_AGENT in e.get("userAgent", "")
        and e.get("verb") == "list"
        and (e.get("objectRef") or {}).get("resource") in FLEET_KINDS
        and "Selector" not in e.get("requestURI", "")
    ]
    return len(lists), seen


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def test_a_fleet_scrape_sends_no_list(control_plane: ControlPlane, rest: Rest) -> None:
    """The fleet metrics come from the controller's informers: once they are served, a scrape
    sends the API server no request at all. Before, each scrape listed every slice, claim,
    NodeDevices, ComputeDomain and Node (1.1 GB at 10,000 nodes)."""
    port = free_port()
    argv = [sys.executable, "-m", "fabricdra.cli", "controller", "--kubeconfig",
            str(control_plane.kubeconfig), "--namespace", unique("scale-system"),
            "--leader-elect", "false", "--metrics-port", str(port)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def lists_so_far() -> int:
        """The count once everything sent before this call is in the audit log: a request
        made now (a marker) is logged after them all (the log is blocking)."""
        marker = f"scale-marker-{uuid.uuid4().hex[:8]}"
        rest.get_or_none(COMPUTE_DOMAINS, marker, "default")
        return wait_for(
            lambda: (r := _unselected_lists(control_plane, marker))[1] and r, what="audit log"
        )[0]

    try:

        def served() -> str | None:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                text = _scrape(port)
            except OSError:
                return None  # not listening yet
            return text if "fabricdra_fleet_up 1.0" in text else None  # caches not synced yet

        text = wait_for(served, what="fleet metrics served", timeout=90)
        assert "fabricdra_devices_published" in text or "fabricdra_fleet_up 1.0" in text
        # Counted only now: the informers' first lists may finish while the polling above
        # runs (a CI run counted two of them as the scrape's).
        before = lists_so_far()
        for _ in range(3):
            assert "fabricdra_fleet_up 1.0" in _scrape(port)
        assert lists_so_far() - before == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _domain_reconciles() -> float:
    value = metrics.REGISTRY.get_sample_value(
        "fabricdra_controller_reconcile_seconds_count", {"target": "domain"}
    )
    return value or 0.0


def test_a_heartbeat_reconciles_no_domain(control_plane: ControlPlane, rest: Rest) -> None:
    """A report Lease renewed with nothing else changed (the daemon's heartbeat, every few
    seconds on every node) moves only that Lease's deadline: no domain is reconciled for it.
    Before, each heartbeat queued a full reconcile of its domain (at 5,000 nodes, ~1,700 a
    second)."""
    ns, driver_ns = new_namespace(control_plane, "cd-beat"), unique("cd-system")
    node = unique("beat-node")
    create_plugin_node(control_plane, node, fabric=unique("rack-beat"))
    with running_controller(
        control_plane, driver_ns, leader_election=False, resync_seconds=300.0
    ) as controller:
        rest.create(COMPUTE_DOMAINS, domain_body("beat", rct="beat-imex"), ns)
        template = wait_for(lambda: rest.get_or_none(CLAIM_TEMPLATES, "beat-imex", ns), what="rct")
        uid = template["metadata"]["labels"][cd.DOMAIN_LABEL]
        allocate_claim(rest, ns, template, node, "beat-0")
        write_report(rest, driver_ns, uid, node, ready=True, message="READY")

        def ready() -> bool:
            obj = rest.get(COMPUTE_DOMAINS, "beat", ns)
            return (condition(obj, cd.READY) or {}).get("status") == "True"

        wait_for(ready, what="domain Ready")
        wait_for(
            lambda: len(controller.domain_queue) == 0 and len(controller.node_queue) == 0,
            what="queues drained",
        )
        settle(1.0)
        before = _domain_reconciles()
        key = f"{driver_ns}/{lease_name(uid, node)}"
        for _ in range(5):
            write_report(rest, driver_ns, uid, node, ready=True, message="READY", renew=True)
            renewed = rest.get(LEASES, lease_name(uid, node), driver_ns)["spec"]["renewTime"]
            wait_for(
                lambda renewed=renewed: (
                    (controller.leases.get(key) or {}).get("spec", {}).get("renewTime") == renewed
                ),
                what="the controller saw the heartbeat",
            )
        settle(1.0)
        assert _domain_reconciles() - before == 0
        assert ready()
        # A report that says something new still reaches the domain.
        write_report(rest, driver_ns, uid, node, ready=False, message="IMEX down")
        wait_for(lambda: not ready(), what="the new report read")


def test_a_node_reconcile_reads_only_its_own_claims(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """With claims of several domains on many nodes, reconciling one node reads that node's
    claim and that claim's domain from the caches (the informers' indexes), not every claim
    and every domain. Before, each node reconcile scanned all of them (48 ms a node at
    10,000 nodes, a 483 s resync sweep)."""
    ns, driver_ns = new_namespace(control_plane, "cd-index"), unique("cd-system")
    rack = unique("rack-index")
    nodes = [unique("index-node") for _ in range(12)]
    for name in nodes:
        create_plugin_node(control_plane, name, fabric=rack)
    templates: list[dict[str, Any]] = []
    with running_controller(control_plane, driver_ns, leader_election=False):
        for d in range(3):
            rest.create(COMPUTE_DOMAINS, domain_body(f"ix{d}", rct=f"ix{d}-imex"), ns)
            rct = wait_for(
                lambda d=d: rest.get_or_none(CLAIM_TEMPLATES, f"ix{d}-imex", ns), what="rct"
            )
            templates.append(rct)
        for i, name in enumerate(nodes):
            allocate_claim(rest, ns, templates[i % 3], name, f"ix-{i}")
    # A controller with its caches only (no workers): the one reconcile below is the only
    # reader of its caches.
    cfg = ControllerConfig(
        namespace=driver_ns, daemon=DaemonSettings(namespace=driver_ns), leader_election=False
    )
    controller = Controller(control_plane.api_client(), cfg)
    controller.start_caches()
    try:
        wait_for(controller.caches_synced, what="caches synced")
        wait_for(lambda: len(controller.claims) >= len(nodes), what="claims cached")
        claims, domains = controller.claims.reads, controller.domains.reads
        controller.reconcile_node(nodes[5])
        assert controller.claims.reads - claims == 1  # its own claim, of 12
        assert controller.domains.reads - domains <= 2  # that claim's domain, of 3 (twice)
    finally:
        controller.stop()


def test_a_claims_node_is_processed_before_a_resync_sweep(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """A claim allocated while a resync sweep's node keys wait in the queue has its node
    decided first (its admission), not after every node of the sweep. Before, the queue was
    one FIFO: at 5,000 nodes an admission waited behind 5,000 resync keys (issue 22.11: 27 s /
    53 s p50 / p99 after a gang's last allocation). Here the test is the node worker: a
    controller with its caches only, a 1 s resync."""
    ns, driver_ns = new_namespace(control_plane, "cd-prio"), unique("cd-system")
    rack = unique("rack-prio")
    nodes = [unique("prio-node") for _ in range(8)]
    for name in nodes:
        create_plugin_node(control_plane, name, fabric=rack)
    cfg = ControllerConfig(
        namespace=driver_ns,
        daemon=DaemonSettings(namespace=driver_ns),
        leader_election=False,
        resync_seconds=1.0,
    )
    controller = Controller(control_plane.api_client(), cfg)
    controller.start_caches()
    queue = controller.node_queue
    try:
        wait_for(controller.caches_synced, what="caches synced")
        while (key := queue.get(timeout=0)) is not None:  # the start's keys
            queue.done(key)
        wait_for(lambda: len(queue) >= len(nodes), what="a resync sweep queued every node")
        template = {
            "spec": {
                # A domain's claims carry its label (no domain here: the node stays free).
                "metadata": {"labels": {cd.DOMAIN_LABEL: str(uuid.uuid4())}},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "channel", "exactly": {"deviceClassName": cd.CHANNEL_CLASS}}
                        ],
                        "config": [],
                    }
                },
            }
        }
        # Handlers run in the order they were added: this one after the controller's.
        seen = threading.Event()
        controller.claims.on_event(
            lambda e, o, n: (
                seen.set() if ((n or {}).get("status") or {}).get("allocation") else None
            )
        )
        claimed = nodes[-1]  # the sweep's last of these (informer order: creation)
        allocate_claim(rest, ns, template, claimed, "prio-0")
        wait_for(seen.is_set, what="the controller's handlers saw the allocation")
        # The event keys (the claim's node, and any node the control plane changed meanwhile)
        # go ahead of the sweep's; with its keys overdue (a 1 s resync), one sweep key at most
        # before each event key, never the whole sweep.
        events, swept = queue.depth()
        assert swept >= len(nodes) - 1
        ahead = [queue.get(timeout=0) for _ in range(2 * events)]
        assert claimed in ahead
    finally:
        controller.stop()


def test_an_allocation_elsewhere_re_places_no_waiting_gang(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Issue 28 point 4d: a GPU claim allocated anywhere only takes room, so it cannot help a
    gang that fits nowhere; it re-placed every waiting gang over the whole fleet (0.76 s of
    CPU per allocation with 50 gangs waiting at 5,000 nodes). A released allocation still
    re-places them."""
    ns, driver_ns = new_namespace(control_plane, "cd-cost"), unique("cd-system")
    rack = unique("rack-cost")
    nodes = [unique("cost") for _ in range(3)]
    for node in nodes:
        create_plugin_node(control_plane, node, rack)
    rest.patch(NODES, nodes[2], {"spec": {"unschedulable": True}})  # 2 of 3 nodes usable
    with running_controller(
        control_plane, driver_ns, leader_election=False, resync_seconds=300.0
    ) as controller:
        rest.create(COMPUTE_DOMAINS, domain_body("big", mode="host", num_nodes=3), ns)

        def waiting() -> bool:
            ready = condition(rest.get(COMPUTE_DOMAINS, "big", ns), cd.READY) or {}
            return ready.get("reason") == "WaitingForFabric"

        wait_for(waiting, what="the gang of 3 waiting (2 usable nodes)")
        wait_for(
            lambda: len(controller.domain_queue) == 0 and len(controller.node_queue) == 0,
            what="queues drained",
        )
        settle(1.0)
        before = _domain_reconciles()
        body = {
            "metadata": {"name": "gpu"},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": "gpu.fabricdra.io"}}
                    ]
                }
            },
        }
        rest.create(CLAIMS, body, ns)
        result = {"request": "gpu", "driver": DEVICES_DRIVER, "pool": nodes[0], "device": "gpu-0"}
        write_allocation(rest, ns, "gpu", nodes[0], {"results": [result]})
        wait_for(
            lambda: ((controller.allocations.get(f"{ns}/gpu") or {}).get("status") or {}).get(
                "allocation"
            ),
            what="the controller saw the allocation",
        )
        wait_for(
            lambda: len(controller.domain_queue) == 0 and len(controller.node_queue) == 0,
            what="queues drained",
        )
        settle(1.0)
        assert _domain_reconciles() - before == 0
        # Released, its GPU is room again: the waiting gang is placed again (still waiting).
        rest.patch(
            CLAIMS,
            "gpu",
            {"status": {"allocation": None}},
            ns,
            sub="status",
            content_type=MERGE_PATCH,
        )
        wait_for(lambda: _domain_reconciles() > before, what="the gang placed again")
        assert waiting()
