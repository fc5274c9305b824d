"""The measured loss (issue 28 point 7's last sentence; controller/fabricloss.py): nccl-tests
all_reduce_perf output parsed (its real table format: tests/standins/all_reduce_perf and
github.com/NVIDIA/nccl-tests src/common.cu), a failed run never a zero, the fabric check
running the in-domain and split runs after it passed and keeping them on its records, and a
spanning ComputeDomain showing the newest one taken in its fabric domains in its status."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api import labels
from fabricdra.api.computedomain import ComputeDomain
from fabricdra.api.fabriccheck import FabricCheckRecord, LossReading, dump, record_of
from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.controller import fabricloss, status
from fabricdra.controller.fabriccheck import CheckResult, FabricCheck
from fabricdra.controller.fabriccheckrun import objects
from fabricdra.controller.sshkey import new_pair
from tests.fleetdata import GB200, _gpu, _slice
from tests.unit.test_fabric_check import NOW, RACK, _checked, _Cluster, _node

STANDIN = Path(__file__).resolve().parents[1] / "standins" / "all_reduce_perf"
OTHER = "nvlink-0123-2"
FAR = "nvlink-0123-3"
SIZE = 17179869184  # the stand-in's one size (16 GiB)

# nccl-tests with -c 0 prints N/A in #wrong; two sizes, the second the one asked for.
UNCHECKED = """\
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
   536870912     134217728     float     sum      -1   2800.1  191.73  335.53    N/A   2790.4  192.40  336.70    N/A
  1073741824     268435456     float     sum      -1   5234.5  205.13  358.97    N/A   5220.0  205.70  359.98    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 347.80
"""  # noqa: E501


def _table(busbw: float, ranks: int = 8, size: int = fabricloss.MESSAGE_BYTES) -> str:
    """all_reduce_perf's table (the header lines of UNCHECKED) with one row at `size`, `ranks`
    ranks: algbw = busbw * n / (2(n-1)), time = size / algbw (nccl-tests PERFORMANCE.md)."""
    algbw = busbw * ranks / (2 * (ranks - 1))
    t = size / algbw / 1e3
    row = f"{size:>12} {size // 4:>13}     float     sum      -1 {t:8.1f} {algbw:7.2f} {busbw:7.2f}"
    return "\n".join([*UNCHECKED.splitlines()[:3], f"{row}      0 {t:8.1f} {algbw:7.2f} "
                      f"{busbw:7.2f}      0", "# Out of bounds values : 0 OK"])  # fmt: skip


def _standin(**values: float) -> str:
    env = {"STANDIN_VALUE": ",".join(f"{k}={v}" for k, v in values.items()), "PATH": ""}
    return subprocess.run(
        [sys.executable, str(STANDIN), "-g", "8"], capture_output=True, text=True, env=env,
        check=True,
    ).stdout  # fmt: skip


def test_a_reading_is_the_out_of_place_time_and_busbw_at_the_message_size() -> None:
    r = fabricloss.reading(_standin(busbw=480.52), ["t1", "t2"], [RACK], SIZE)
    assert r.error == ""
    assert r.busBwGBps == pytest.approx(480.52)
    # algbw = busbw * n / (2(n-1)) for 8 ranks; time = size / algbw (nccl-tests PERFORMANCE.md)
    assert r.stepTimeMs == pytest.approx(SIZE / (480.52 * 8 / 14) / 1e6, rel=1e-3)
    assert (r.nodes, r.fabricDomains, r.messageBytes) == (["t1", "t2"], [RACK], SIZE)
    unchecked = fabricloss.reading(UNCHECKED, ["t1"], [RACK], 1 << 30)
    assert (unchecked.stepTimeMs, unchecked.busBwGBps) == (5.2345, 358.97)


def test_a_failed_run_has_an_error_and_no_figure_never_a_zero() -> None:
    wrong = fabricloss.reading(_standin(wrong=3), ["t1", "t2"], [RACK], SIZE)
    assert wrong.error == "all_reduce_perf_mpi reported 3 wrong results"
    assert (wrong.busBwGBps, wrong.stepTimeMs) == (None, None)
    missing = fabricloss.reading("mpirun: command not found\n", ["t1"], [RACK], SIZE)
    assert missing.error.startswith(f"all_reduce_perf_mpi printed no row for {SIZE} B")
    assert "mpirun: command not found" in missing.error
    assert missing.stepTimeMs is None
    # The record as stored: no figure at all, not 0.
    loss = fabricloss.measured(wrong, missing, NOW, RACK)
    stored = json.loads(loss.model_dump_json(exclude_none=True))
    assert "busBwGBps" not in stored["inDomain"]
    assert "ratio" not in stored


def test_the_ratio_is_split_over_in_domain_only_when_both_were_measured() -> None:
    fast = LossReading(nodes=["t1", "t2"], fabricDomains=[RACK], busBwGBps=800.0, stepTimeMs=2.5)
    slow = LossReading(nodes=["t1", "r1"], fabricDomains=[RACK, OTHER], busBwGBps=90.0,
                       stepTimeMs=22.0)  # fmt: skip
    loss = fabricloss.measured(fast, slow, NOW, RACK)
    assert loss.ratio == 8.8
    assert loss.source == f"fabric check of fabric domain {RACK}: nccl-tests all_reduce_perf_mpi"
    nothing = fabricloss.failed(["t1"], [RACK], "x")
    assert fabricloss.measured(fast, nothing, NOW, RACK).ratio is None


def test_the_split_partner_prefers_the_same_tier1_switch() -> None:
    tier1 = {"t1": "leaf-1", "r1": "leaf-2", "r2": "leaf-1"}
    assert fabricloss.split_partner("t1", tier1, [("r1", OTHER), ("r2", OTHER)]) == "r2"
    assert fabricloss.split_partner("t1", {}, [("r2", OTHER), ("r1", OTHER)]) == "r1"
    assert fabricloss.split_partner("t1", tier1, []) is None


def test_the_command_is_one_size_with_results_checked() -> None:
    assert fabricloss.command(1 << 30) == [
        "all_reduce_perf_mpi", "-b", "1073741824", "-e", "1073741824", "-f", "2", "-g", "1",
        "-w", "10", "-n", "50", "-c", "1",
    ]  # fmt: skip
    body = objects(RACK, ["t1", "r1"], 4, _settings(), new_pair(), "x",
                   program=fabricloss.command(), multiple_cliques=True)  # fmt: skip
    domain = body["computedomains"][0]
    assert domain["spec"]["allowMultipleCliques"] is True
    assert "numNodes" not in domain["spec"]  # elastic: gang placement does not hold it
    launcher = body["pods"][-1]["spec"]["containers"][0]["command"][-1]
    assert "all_reduce_perf_mpi -b 1073741824" in launcher
    assert "-np 8" in launcher
    plain = objects(RACK, ["t1", "t2"], 4, _settings(), new_pair(), "x")
    assert "allowMultipleCliques" not in plain["computedomains"][0]["spec"]


def _settings() -> Any:
    from fabricdra.controller.fabriccheckrun import RunSettings

    return RunSettings(image="verify:1")


# --- the fabric check runs it ------------------------------------------------------------


class _LossRunner:
    """The check passes; all_reduce answers per key what a real run printed (None: not run)."""

    def __init__(self, outputs: Mapping[str, str | None]) -> None:
        self.outputs = dict(outputs)
        self.all_reduces: list[tuple[str, tuple[str, ...], int, bool]] = []

    def run(self, fabric: str, gpus: Mapping[str, int], threshold_gbs: float) -> CheckResult:
        return CheckResult("Passed", "ok", 797.7)

    def cleanup(self) -> None:
        return None

    def all_reduce(
        self, key: str, nodes: Sequence[str], per_node: int, *, multiple_cliques: bool
    ) -> tuple[str | None, str]:
        self.all_reduces.append((key, tuple(nodes), per_node, multiple_cliques))
        out = self.outputs[key.rsplit("/", 1)[1]]
        return (out, "") if out is not None else (None, "the workers still not running")


class _Items:
    """The test cluster's Node cache with `items()` (the split partner is looked up fleet-wide)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)

    def items(self) -> list[dict[str, Any]]:
        return list(self.cache.objs.values())


def _cluster_with_neighbours() -> _Cluster:
    """t1, t2 in RACK (to check) under leaf-1; r1 (leaf-2) and r2 (leaf-1) in OTHER, passed
    their own check; f1 in FAR never checked."""
    cluster = _Cluster(["t1", "t2"])
    for n in ("t1", "t2"):
        cluster.nodes.objs[n]["metadata"]["labels"][TIER_LABELS[0]] = "leaf-1"
    for name, fabric, leaf, checked in (
        ("r1", OTHER, "leaf-2", True),
        ("r2", OTHER, "leaf-1", True),
        ("f1", FAR, "leaf-1", False),
    ):
        node = _node(name, fabric, **{TIER_LABELS[0]: leaf})
        cluster.nodes.objs[name] = _checked(node, name, fabric) if checked else node
        cluster.node_devices.objs[name] = {
            "metadata": {"name": name},
            "status": {"verification": {"state": "Verified", "currentFingerprint": name}},
        }
        s = _slice(name, [_gpu(i, GB200, fabric, []) for i in range(4)])
        s["metadata"]["name"] = name
        cluster.slices.objs[name] = s
    return cluster


def _deps(cluster: _Cluster, runner: Any, *, measure: bool = True) -> Any:
    import dataclasses

    d = cluster.deps(runner)
    return dataclasses.replace(d, nodes=_Items(cluster.nodes), measure_loss=measure)


def test_after_a_passed_check_the_loss_is_measured_and_kept_on_its_records() -> None:
    cluster = _cluster_with_neighbours()
    runner = _LossRunner({"loss-in-domain": _table(800.0), "loss-split": _table(90.0)})
    FabricCheck(_deps(cluster, runner)).reconcile(RACK)
    assert runner.all_reduces == [
        (f"{RACK}/loss-in-domain", ("t1", "t2"), 4, False),
        # r2: the idle checked tray of another NVLink domain under t1's leaf (r1 is not)
        (f"{RACK}/loss-split", ("t1", "r2"), 4, True),
    ]
    rec = record_of(cluster.nodes.objs["t2"])
    assert rec is not None
    assert rec.passed
    assert rec.measuredLoss is not None
    loss = rec.measuredLoss
    assert loss.inDomain.busBwGBps == 800.0
    assert loss.split.busBwGBps == 90.0
    assert loss.split.fabricDomains == [RACK, OTHER]
    assert loss.ratio == pytest.approx(800.0 / 90.0, rel=1e-3)  # same size, time ∝ 1/busbw
    assert loss.measuredAt == NOW


def test_with_no_tray_to_split_across_the_split_says_so_and_there_is_no_ratio() -> None:
    cluster = _Cluster(["t1", "t2"])
    runner = _LossRunner({"loss-in-domain": _table(800.0)})
    FabricCheck(_deps(cluster, runner)).reconcile(RACK)
    rec = record_of(cluster.nodes.objs["t1"])
    assert rec is not None
    assert rec.measuredLoss is not None
    assert rec.measuredLoss.inDomain.busBwGBps == 800.0
    assert rec.measuredLoss.split.error.startswith("no idle tray of another NVLink domain")
    assert rec.measuredLoss.split.busBwGBps is None
    assert rec.measuredLoss.ratio is None
    assert cluster.labelled() == ["t1", "t2"]  # the check's own outcome is unchanged


def test_a_run_that_did_not_start_is_an_error_not_a_zero() -> None:
    cluster = _cluster_with_neighbours()
    runner = _LossRunner({"loss-in-domain": None, "loss-split": _table(90.0)})
    FabricCheck(_deps(cluster, runner)).reconcile(RACK)
    rec = record_of(cluster.nodes.objs["t1"])
    assert rec is not None
    assert rec.measuredLoss is not None
    assert rec.measuredLoss.inDomain.error == "the workers still not running"
    assert rec.measuredLoss.inDomain.stepTimeMs is None
    assert rec.measuredLoss.ratio is None


def test_without_the_flag_nothing_extra_runs() -> None:
    cluster = _cluster_with_neighbours()
    runner = _LossRunner({})
    FabricCheck(_deps(cluster, runner, measure=False)).reconcile(RACK)
    assert runner.all_reduces == []
    rec = record_of(cluster.nodes.objs["t1"])
    assert rec is not None
    assert rec.passed
    assert rec.measuredLoss is None


# --- a spanning ComputeDomain shows it ---------------------------------------------------


def _recorded(name: str, fabric: str, ratio_ms: float, at: datetime) -> dict[str, Any]:
    fast = LossReading(nodes=["a", "b"], fabricDomains=[fabric], busBwGBps=800.0, stepTimeMs=2.0)
    slow = LossReading(nodes=["a", "z"], fabricDomains=[fabric, "x"], busBwGBps=90.0,
                       stepTimeMs=ratio_ms)  # fmt: skip
    rec = FabricCheckRecord(
        fabric=fabric, passed=True, reason="ok", time=at, fingerprint="f",
        measuredLoss=fabricloss.measured(fast, slow, at, fabric),
    )  # fmt: skip
    node = _node(name, fabric)
    node["metadata"]["annotations"][labels.FABRIC_CHECK] = dump(rec)
    return node


def test_the_newest_loss_measured_in_the_gangs_fabric_domains_is_the_one_shown() -> None:
    old, new = NOW - timedelta(days=1), NOW
    nodes = [
        _recorded("a1", "rack-a", 10.0, old),
        _recorded("b1", "rack-b", 16.0, new),
        _recorded("c1", "rack-c", 30.0, new + timedelta(hours=1)),  # not the gang's
        _node("a2", "rack-a"),  # no record
    ]
    got = fabricloss.for_fabrics(["rack-a", "rack-b"], nodes)
    assert got is not None
    assert got.ratio == 8.0
    assert got.measuredAt == new
    assert fabricloss.for_fabrics(["rack-d"], nodes) is None


def _domain(spanning: bool) -> ComputeDomain:
    status_: dict[str, Any] = {}
    if spanning:
        status_["placement"] = {
            "tier": "tier-1",
            "switch": "leaf-1",
            "shares": [
                {"fabricDomain": "rack-a", "nodes": 2},
                {"fabricDomain": "rack-b", "nodes": 2},
            ],
        }
    return ComputeDomain.model_validate(
        {
            "metadata": {"name": "job", "namespace": "team", "uid": "u", "generation": 1},
            "spec": {
                "numNodes": 4,
                "allowMultipleCliques": spanning,
                **({"topology": {"required": "tier-1"}} if spanning else {}),
                "channel": {"resourceClaimTemplate": {"name": "job-channel"}},
            },
            "status": status_,
        }
    )


def test_only_a_spanning_domain_records_the_measured_loss_in_its_status() -> None:
    loss = fabricloss.for_fabrics(["rack-a"], [_recorded("a1", "rack-a", 10.0, NOW)])
    assert loss is not None
    obs = status.Observed(True, "", [], {}, measured_loss=loss)
    spanning, _ = status.compute(_domain(True), obs, "2026-12-04T12:00:00Z")
    assert spanning.measuredLoss == loss
    patch = status.status_patch(_domain(True).status, spanning)
    assert patch is not None
    assert patch["status"]["measuredLoss"]["ratio"] == 5.0  # type: ignore[index]
    single, _ = status.compute(_domain(False), obs, "2026-12-04T12:00:00Z")
    assert single.measuredLoss is None
    assert datetime.fromisoformat(
        patch["status"]["measuredLoss"]["measuredAt"]  # type: ignore[index]
    ) == NOW.astimezone(UTC)


def test_a_domain_checked_before_the_flag_is_measured_once_without_checking_again() -> None:
    """Records of checks that passed before --fabric-check-loss: the loss is measured once and
    added to them (the check itself is not run again); a second reconcile runs nothing."""
    cluster = _cluster_with_neighbours()
    for n in ("t1", "t2"):
        _checked(cluster.nodes.objs[n], n)
    runner = _LossRunner({"loss-in-domain": _table(800.0), "loss-split": None})
    check = FabricCheck(_deps(cluster, runner))
    check.reconcile(RACK)
    assert [k for k, *_ in runner.all_reduces] == [f"{RACK}/loss-in-domain", f"{RACK}/loss-split"]
    for n in ("t1", "t2"):
        rec = record_of(cluster.nodes.objs[n])
        assert rec is not None
        assert rec.passed
        assert rec.nodeFingerprint == n  # the check's own record kept
        assert rec.measuredLoss is not None
        assert rec.measuredLoss.inDomain.busBwGBps == 800.0
        assert rec.measuredLoss.split.error == "the workers still not running"
    # r1, r2 of the other domain: their own records untouched
    other = record_of(cluster.nodes.objs["r1"])
    assert other is not None
    assert other.measuredLoss is None
    check.reconcile(RACK)  # measured (a failed split included): not again
    assert len(runner.all_reduces) == 2
    # Without the flag a covered domain runs nothing.
    quiet = _LossRunner({})
    fresh = _cluster_with_neighbours()
    for n in ("t1", "t2"):
        _checked(fresh.nodes.objs[n], n)
    FabricCheck(_deps(fresh, quiet, measure=False)).reconcile(RACK)
    assert quiet.all_reduces == []
