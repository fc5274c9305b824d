"""The measured loss against a real kube-apiserver (issue 28 point 7's last sentence): a
running controller shows the loss a fabric check recorded on a rack's Nodes in the status of
the spanning gang placed in that rack (the CRD stores it; a failed reading stays without
figures), not in a gang placed elsewhere; and the loss's split run (a ComputeDomain across
cliques, mpirun of all_reduce_perf_mpi) is accepted as the controller's user, ends without a
reading when its pods never start (no kubelet here), and leaves nothing behind."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import labels
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.fabriccheck import FabricCheckRecord, LossReading, dump
from fabricdra.controller import fabricloss
from fabricdra.controller.fabriccheckrun import KubeRunner, RunSettings
from fabricdra.kube.rest import COMPUTE_DOMAINS, NODES, PODS, Rest

from .computedomain_helpers import new_namespace, running_controller, unique
from .test_computedomain_spanning import _racks, _shares, _spanning
from .test_fabric_check_run import _as_controller, _left

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]

AT = datetime(2026, 12, 7, 4, 0, tzinfo=UTC)


def _record(fabric: str, split: LossReading) -> str:
    in_domain = LossReading(
        nodes=["t1", "t2"], fabricDomains=[fabric], messageBytes=1 << 30,
        busBwGBps=812.4, stepTimeMs=2.312,
    )  # fmt: skip
    loss = fabricloss.measured(in_domain, split, AT, fabric)
    record = FabricCheckRecord(
        fabric=fabric, passed=True, reason="ok", time=AT, fingerprint="f", measuredLoss=loss
    )
    return dump(record)


def _loss(rest: Rest, ns: str, name: str) -> dict[str, Any] | None:
    found = (rest.get(COMPUTE_DOMAINS, name, ns).get("status") or {}).get("measuredLoss")
    return dict(found) if found else None


def test_a_spanning_gang_shows_the_loss_measured_in_its_racks(
    control_plane: ControlPlane, rest: Rest
) -> None:
    ns, driver_ns = new_namespace(control_plane, "cd-loss"), unique("cd-system")
    l1, l2 = unique("leaf"), unique("leaf")
    a, b, c, d = (unique(f"0000loss{x}") for x in "abcd")
    racks = _racks(control_plane, rest, {a: (2, l1), b: (2, l1), c: (2, l2), d: (2, l2)})
    required = {"topology": {"required": "tier-1"}}
    with running_controller(control_plane, driver_ns, leader_election=False):
        rest.create(COMPUTE_DOMAINS, _spanning("wide", 4, **required), ns)
        wait_for(lambda: sum(_shares(rest, ns, "wide").values()) == 4, what="wide placed")
        first = set(_shares(rest, ns, "wide"))
        rest.create(COMPUTE_DOMAINS, _spanning("other", 4, **required), ns)
        wait_for(lambda: sum(_shares(rest, ns, "other").values()) == 4, what="other placed")
        mine = sorted(first)[0]
        split = LossReading(
            nodes=["t1", "r1"], fabricDomains=[mine, "elsewhere"], messageBytes=1 << 30,
            busBwGBps=46.1, stepTimeMs=40.75,
        )  # fmt: skip
        annotation = {labels.FABRIC_CHECK: _record(mine, split)}
        rest.patch(NODES, racks[mine][0], {"metadata": {"annotations": annotation}})
        loss = wait_for(lambda: _loss(rest, ns, "wide"), what="wide shows the loss", timeout=60)
        assert loss["inDomain"]["busBwGBps"] == 812.4
        assert loss["split"]["stepTimeMs"] == 40.75
        assert loss["ratio"] == pytest.approx(40.75 / 2.312, rel=1e-3)
        assert loss["source"].startswith(f"fabric check of fabric domain {mine}")
        # What the API server stored reads back as the model.
        stored = ComputeDomain.model_validate(rest.get(COMPUTE_DOMAINS, "wide", ns))
        assert stored.status.measuredLoss is not None
        assert stored.status.measuredLoss.measuredAt == AT
        assert _loss(rest, ns, "other") is None  # placed in the other leaf's racks

        # A newer check whose split did not run: no figure, no ratio (never a zero).
        failed = fabricloss.failed(["t1"], [mine], "no idle tray of another NVLink domain")
        newer = _record(mine, failed).replace("2026-12-07T04:00:00", "2026-12-07T05:00:00")
        annotation = {labels.FABRIC_CHECK: newer}
        rest.patch(NODES, racks[mine][1], {"metadata": {"annotations": annotation}})

        def no_ratio() -> dict[str, Any] | None:
            got = _loss(rest, ns, "wide")
            return got if got is not None and "ratio" not in got else None

        loss = wait_for(no_ratio, what="the newer reading shown", timeout=60)
        assert loss["split"] == {
            "nodes": ["t1"],
            "fabricDomains": [mine],
            "error": "no idle tray of another NVLink domain",
        }
        rest.delete(COMPUTE_DOMAINS, "wide", ns)
        rest.delete(COMPUTE_DOMAINS, "other", ns)


def test_the_split_run_is_accepted_and_without_pods_ends_without_a_reading(
    control_plane: ControlPlane, rest: Rest
) -> None:
    ns = new_namespace(control_plane, "fc-loss")
    as_controller = _as_controller(control_plane, rest, ns)
    seen: dict[str, list[dict[str, Any]]] = {}

    def sleep(_: float) -> None:
        if not seen:
            for kind in (COMPUTE_DOMAINS, PODS):
                seen[kind.plural] = rest.list(kind, ns)["items"]

    settings = RunSettings(image="registry.invalid/fabricdra-verify:test", namespace=ns,
                           timeout_seconds=1.0)  # fmt: skip
    runner = KubeRunner(as_controller, settings, poll_seconds=0.2, start_seconds=1.0, sleep=sleep)
    output, why = runner.all_reduce(
        "nvlink-loss-1/loss-split", ["tray-1", "tray-2"], 4, multiple_cliques=True
    )
    assert output is None
    assert why.startswith("the check did not finish: the workers still not running after 1 s")
    reading = fabricloss.failed(["tray-1", "tray-2"], ["nvlink-loss-1", "nvlink-loss-2"], why)
    assert reading.stepTimeMs is None
    domain = seen["computedomains"][0]
    assert domain["spec"]["allowMultipleCliques"] is True
    assert {p["spec"]["nodeSelector"]["kubernetes.io/hostname"] for p in seen["pods"]} == {
        "tray-1",
        "tray-2",
    }
    assert _left(rest, ns) == []
