"""The multi-node NVLink check of a fabric domain (issue 18 point 4), against a real
kube-apiserver: the controller under `--fabric-check` finds a domain whose idle verified
nodes were never checked, runs the check (here a runner answering as nvbandwidth's run would:
the real launch needs GPUs and is tested in test_fabric_check_run.py), and writes the outcome on
the Nodes — the label gang placement waits for, the record, an Event on a failure."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import labels
from fabricdra.api.fabriccheck import record_of
from fabricdra.controller.fabriccheck import CheckResult
from fabricdra.controller.manager import Controller
from fabricdra.kube.rest import CLAIMS, COMPUTE_DOMAINS, EVENTS, NODE_DEVICES, NODES, SLICES, Rest
from tests.fleetdata import GB200, _gpu, _slice

from .computedomain_helpers import (
    condition,
    create_plugin_node,
    domain_body,
    new_namespace,
    running_controller,
    unique,
)
from .dra_setup import installed  # noqa: F401 - a fixture (the NodeDevices CRD)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("leaves_nothing_behind", "installed"),
]


class _Answers:
    """A runner that answers as a run of the check would have; records what it was asked.
    `hold`: each run waits until it is set (a run takes minutes in a cluster)."""

    def __init__(self, *answers: CheckResult, hold: threading.Event | None = None) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, tuple[str, ...], float]] = []
        self.hold = hold

    def run(self, fabric: str, gpus: Mapping[str, int], threshold_gbs: float) -> CheckResult:
        assert all(n == 4 for n in gpus.values())  # every node publishes 4 GPUs
        self.calls.append((fabric, tuple(gpus), threshold_gbs))
        if self.hold is not None:
            assert self.hold.wait(60), "the test never let the check finish"
        return self.answers.pop(0) if self.answers else CheckResult("NotRun", "no more")

    def cleanup(self) -> None:
        return None


def _rack(control_plane: ControlPlane, rest: Rest, rack: str, count: int) -> list[str]:
    """`count` verified nodes of fabric domain `rack`, each with 4 GB200 GPUs published and
    the hardware fingerprint its agent records."""
    names = sorted(unique("fc") for _ in range(count))
    for name in names:
        create_plugin_node(control_plane, name, rack)
        rest.patch(NODES, name, {"metadata": {"labels": {labels.VERIFIED: "true"}}})
        rest.create(SLICES, _slice(name, [_gpu(i, GB200, rack, []) for i in range(4)]))
        body = {"apiVersion": "fabricdra.io/v1alpha1", "kind": "NodeDevices"}
        rest.create(NODE_DEVICES, {**body, "metadata": {"name": name}, "spec": {}})
        rest.patch(
            NODE_DEVICES,
            name,
            {
                "status": {
                    "verification": {
                        "state": "Verified",
                        "reason": "passed",
                        "currentFingerprint": f"hw-{name}",
                    }
                }
            },
            sub="status",
        )
    return names


def checking_controller(
    control_plane: ControlPlane, driver_ns: str, runner: _Answers | None = None, **kw: Any
) -> AbstractContextManager[Controller]:
    """The controller under --fabric-check (and --require-verified-nodes), its check run by
    `runner` (None: the real fabriccheckrun.KubeRunner)."""
    return running_controller(
        control_plane,
        driver_ns,
        leader_election=False,
        require_verified_nodes=True,
        fabric_check=True,
        fabric_runner=runner,
        **kw,
    )


def _label(rest: Rest, node: str) -> str | None:
    value = rest.get(NODES, node)["metadata"].get("labels", {}).get(labels.FABRIC_VERIFIED)
    return None if value is None else str(value)


def _events(rest: Rest, node: str) -> list[dict[str, Any]]:
    items = rest.list(EVENTS, "default").get("items", [])
    return [e for e in items if e.get("involvedObject", {}).get("name") == node]


def test_a_passed_check_labels_the_domain_and_a_gang_then_places_there(
    control_plane: ControlPlane, rest: Rest
) -> None:
    ns, driver_ns = new_namespace(control_plane, "fc-pass"), unique("cd-system")
    rack = unique("00000fcpass")
    nodes = _rack(control_plane, rest, rack, 2)
    runner = _Answers(CheckResult("Passed", "2 cross-tray pairs, lowest 797.73 GB/s", 797.73))
    with checking_controller(control_plane, driver_ns, runner):
        wait_for(lambda: all(_label(rest, n) == "true" for n in nodes), what="labelled")
        assert runner.calls == [(rack, tuple(nodes), 335.0)]
        record = record_of(rest.get(NODES, nodes[0]))
        assert record is not None
        assert record.passed
        assert record.nodeFingerprint == f"hw-{nodes[0]}"
        assert record.nodes == nodes
        assert record.minGBs == 797.73
        rest.create(COMPUTE_DOMAINS, domain_body("gang", mode="host", num_nodes=2), ns)
        wait_for(
            lambda: rest.get(COMPUTE_DOMAINS, "gang", ns).get("status", {}).get("fabricDomain"),
            what="gang placed",
        )
    # A restarted controller (a new leader) reads the records: the check is not run again.
    again = _Answers()
    with checking_controller(control_plane, driver_ns, again) as controller:
        wait_for(lambda: controller.caches_synced(), what="synced")
        controller.reconcile_fabric(rack)  # as its fabric worker would, from the real caches
        assert again.calls == []


def test_a_failed_check_keeps_the_domain_closed_and_says_why_on_the_node(
    control_plane: ControlPlane, rest: Rest
) -> None:
    ns, driver_ns = new_namespace(control_plane, "fc-fail"), unique("cd-system")
    rack = unique("00000fcfail")
    nodes = _rack(control_plane, rest, rack, 2)
    worst = f"{nodes[0]}/GPU 1 <- {nodes[1]}/GPU 2"
    runner = _Answers(
        CheckResult(
            "Failed", f"{worst}: 41.20 GB/s, below 335 GB/s", 41.2, worst, (nodes[0], nodes[1])
        )
    )
    with checking_controller(control_plane, driver_ns, runner):
        wait_for(lambda: record_of(rest.get(NODES, nodes[1])) is not None, what="recorded")
        assert all(_label(rest, n) is None for n in nodes)
        wait_for(
            lambda: any(e["reason"] == "FabricCheckFailed" for e in _events(rest, nodes[0])),
            what="a FabricCheckFailed event",
        )
        ev = next(e for e in _events(rest, nodes[0]) if e["reason"] == "FabricCheckFailed")
        assert f"{worst}: 41.20 GB/s, below 335 GB/s" in ev["message"]
        rest.create(COMPUTE_DOMAINS, domain_body("gang", mode="host", num_nodes=2), ns)
        ready = wait_for(
            lambda: condition(rest.get(COMPUTE_DOMAINS, "gang", ns), "Ready"), what="Ready"
        )
        wait_for(
            lambda: (
                (condition(rest.get(COMPUTE_DOMAINS, "gang", ns), "Ready") or {}).get("reason")
                == "WaitingForFabric"
            ),
            what="the gang waits for a fabric domain",
        )
        assert ready is not None
        assert not rest.get(COMPUTE_DOMAINS, "gang", ns).get("status", {}).get("fabricDomain")


def test_a_gang_waiting_for_its_fabric_domain_is_placed_when_the_check_passes(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """The gang comes first: it waits (no fabric-checked node anywhere) while the check runs;
    the check's label on the Nodes is a placement fact, so the gang is placed then, not at the
    next resync."""
    ns, driver_ns = new_namespace(control_plane, "fc-wake"), unique("cd-system")
    rack = unique("00000fcwake")
    nodes = _rack(control_plane, rest, rack, 2)
    hold = threading.Event()
    runner = _Answers(CheckResult("Passed", "ok", 797.73), hold=hold)
    # No resync comes to the rescue within the test.
    with checking_controller(control_plane, driver_ns, runner, resync_seconds=600.0):
        rest.create(COMPUTE_DOMAINS, domain_body("gang", mode="host", num_nodes=2), ns)
        wait_for(
            lambda: (
                (condition(rest.get(COMPUTE_DOMAINS, "gang", ns), "Ready") or {}).get("reason")
                == "WaitingForFabric"
            ),
            what="the gang waits for a fabric domain",
        )
        wait_for(lambda: runner.calls, what="the check running")
        hold.set()
        wait_for(lambda: all(_label(rest, n) == "true" for n in nodes), what="labelled")
        placed = wait_for(
            lambda: rest.get(COMPUTE_DOMAINS, "gang", ns).get("status", {}).get("fabricDomain"),
            what="gang placed once the check passed",
        )
        assert placed == rack


def test_a_node_running_a_gpu_job_is_left_out_of_the_check_until_the_job_ends(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Issue 29 point 10b: a single-node GPU job (a claim of one GPU, no ComputeDomain) runs
    on a tray: the check's privileged workers, with every GPU, must not share it. The check
    runs over the two idle trays; when the job's claim is deallocated, the tray is idle and,
    never checked, is measured against the others."""
    from tests.fleetdata import _claim

    ns, driver_ns = new_namespace(control_plane, "fc-busy"), unique("cd-system")
    rack = unique("00000fcbusy")
    nodes = _rack(control_plane, rest, rack, 3)
    busy = nodes[1]
    job = _claim("train", ns, [(busy, "gpu-2")])
    status = job.pop("status")
    rest.create(CLAIMS, job, ns)
    rest.patch(CLAIMS, "train", {"status": status}, ns, sub="status")
    idle = tuple(n for n in nodes if n != busy)
    runner = _Answers(CheckResult("Passed", "ok", 797.73), CheckResult("Passed", "ok", 797.73))
    with checking_controller(control_plane, driver_ns, runner):
        wait_for(lambda: all(_label(rest, n) == "true" for n in idle), what="idle trays labelled")
        assert runner.calls == [(rack, idle, 335.0)]
        assert _label(rest, busy) is None
        rest.patch(CLAIMS, "train", {"status": {"allocation": None}}, ns, sub="status")
        wait_for(lambda: _label(rest, busy) == "true", what="the tray checked once idle")
        assert runner.calls[1] == (rack, tuple(nodes), 335.0)


def test_racks_are_checked_concurrently(control_plane: ControlPlane, rest: Rest) -> None:
    """Issue 29 point 10c: one worker checked one rack at a time (at first install of 277
    racks, a day before the last was offered). Two racks, each check held running until both
    have started: with the default bound (--fabric-check-concurrency) they run side by side."""
    driver_ns = unique("cd-system")
    racks = [unique("00000fcconca"), unique("00000fcconcb")]
    for rack in racks:
        _rack(control_plane, rest, rack, 2)
    hold = threading.Event()
    runner = _Answers(
        CheckResult("Passed", "ok", 797.73), CheckResult("Passed", "ok", 797.73), hold=hold
    )
    try:
        with checking_controller(control_plane, driver_ns, runner):
            wait_for(lambda: len(runner.calls) == 2, what="both racks' checks running at once")
            assert sorted(c[0] for c in runner.calls) == racks
    finally:
        hold.set()


def test_with_no_verification_image_a_waiting_gang_says_so(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Issue 29 point 10d: with the chart's defaults (no verification image) the check can
    never run; every gang waited with "no fabric domain has 2 nodes free", never naming the
    cause. The real runner (fabriccheckrun.KubeRunner) without an image: the gang's Ready
    message names the missing image and the fabric domain."""
    ns, driver_ns = new_namespace(control_plane, "fc-noimg"), unique("cd-system")
    rack = unique("00000fcnoimg")
    _rack(control_plane, rest, rack, 2)
    with checking_controller(control_plane, driver_ns):
        rest.create(COMPUTE_DOMAINS, domain_body("gang", mode="host", num_nodes=2), ns)

        def said() -> str:
            ready = condition(rest.get(COMPUTE_DOMAINS, "gang", ns), "Ready") or {}
            message = str(ready.get("message", ""))
            return message if "no verification image is configured" in message else ""

        message = wait_for(said, what="the gang's Ready message naming the missing image")
        assert f"fabric domain {rack}: the check did not run" in message
        ready = condition(rest.get(COMPUTE_DOMAINS, "gang", ns), "Ready") or {}
        assert ready.get("reason") == "WaitingForFabric"


def _claim_conditions(rest: Rest, ns: str, claim: str) -> dict[str, dict[str, Any]]:
    devices = rest.get(CLAIMS, claim, ns).get("status", {}).get("devices", []) or []
    return {c["type"]: c for d in devices for c in d.get("conditions", []) or []}


def test_elastic_and_multi_clique_domains_are_not_admitted_on_a_rack_whose_check_failed(
    control_plane: ControlPlane, rest: Rest
) -> None:
    """Issue 29 point 10e: gang placement keeps gangs off a rack whose check failed, but an
    elastic domain (no numNodes) and a multi-clique one are never placed: the scheduler put
    their claims there and they were admitted across a trunk that failed its check. Their
    claims are refused at binding, naming the failure, and their status says why."""
    from fabricdra.api import computedomain as cd
    from fabricdra.api.computedomain import ComputeDomain
    from fabricdra.controller import objects

    from .computedomain_helpers import allocate_claim

    ns, driver_ns = new_namespace(control_plane, "fc-elastic"), unique("cd-system")
    rack = unique("00000fcelastic")
    nodes = _rack(control_plane, rest, rack, 2)
    worst = f"{nodes[0]}/GPU 1 <- {nodes[1]}/GPU 2"
    failed = f"{worst}: 41.20 GB/s, below 335 GB/s"
    runner = _Answers(CheckResult("Failed", failed, 41.2, worst, (nodes[0], nodes[1])))
    with checking_controller(control_plane, driver_ns, runner):
        wait_for(lambda: record_of(rest.get(NODES, nodes[0])) is not None, what="recorded")
        spans = domain_body("span", num_nodes=2)
        spans["spec"]["allowMultipleCliques"] = True
        for body in (domain_body("elastic"), spans):
            rest.create(COMPUTE_DOMAINS, body, ns)
        for name in ("elastic", "span"):
            obj = wait_for(
                lambda n=name: (
                    (o := rest.get(COMPUTE_DOMAINS, n, ns))["status"].get("channels") and o
                ),
                what=f"{name}'s channel recorded",
            )
            domain = ComputeDomain.model_validate(obj)
            template = objects.workload_claim_template(domain, domain.status.channels[0])
            allocate_claim(rest, ns, template, nodes[0], f"{name}-0", binding_conditions=True)
        for name in ("elastic", "span"):
            refused = wait_for(
                lambda n=name: _claim_conditions(rest, ns, f"{n}-0").get(cd.CONFLICT_CONDITION),
                what=f"{name}'s claim refused",
            )
            assert refused["reason"] == "FabricCheckFailed"
            assert f"fabric domain {rack} failed its multi-node NVLink check" in refused["message"]
            assert failed in refused["message"]
            assert cd.ADMITTED_CONDITION not in _claim_conditions(rest, ns, f"{name}-0")
            degraded = wait_for(
                lambda n=name: (
                    (c := condition(rest.get(COMPUTE_DOMAINS, n, ns), "Degraded"))
                    and c["reason"] == "FabricCheckFailed"
                    and c
                ),
                what=f"{name}'s status naming the failed check",
            )
            assert failed in degraded["message"]
