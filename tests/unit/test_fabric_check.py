"""The multi-node NVLink check of a fabric domain (controller/fabriccheck.py, issue 18 point
4): when it runs, what it writes on pass, fail and not-run, its retries, and that a restarted
controller does not run a passed check again. The decisions are pure; the reconciler is run
with in-memory caches and a runner that answers what a real run would have found."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from fabricdra.api import labels
from fabricdra.api.fabriccheck import record_of
from fabricdra.controller import fabriccheck as fc
from fabricdra.controller.capacity import unusable
from fabricdra.controller.deps import FabricCheckDeps
from fabricdra.controller.fabriccheck import (
    ONE_NODE,
    CheckResult,
    FabricCheck,
    members,
    outcome,
    plan,
    retry_delay,
)
from fabricdra.controller.indexes import BY_FABRIC, BY_NODE
from fabricdra.controller.status import Event
from tests.fleetdata import GB200, _claim, _gpu, _nic, _slice

RACK = "nvlink-0123-1"
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _node(name: str, fabric: str = RACK, **extra_labels: str) -> dict[str, Any]:
    node_labels = {labels.FABRIC_DOMAIN: fabric, labels.VERIFIED: "true", **extra_labels}
    return {
        "metadata": {"name": name, "labels": node_labels, "annotations": {}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _no_one_holds(node: str) -> bool:
    return False


def _checked(node: dict[str, Any], hw: str, fabric: str = RACK) -> dict[str, Any]:
    """The node as a passed check left it."""
    node["metadata"]["labels"][labels.FABRIC_VERIFIED] = "true"
    node["metadata"]["annotations"][labels.FABRIC_CHECK] = json.dumps(
        {
            "fabric": fabric,
            "passed": True,
            "reason": "ok",
            "time": "2026-12-01T00:00:00Z",
            "fingerprint": "f",
            "nodeFingerprint": hw,
        }
    )
    return node


def test_a_new_domain_of_idle_verified_nodes_is_checked_over_all_of_them() -> None:
    nodes = [_node("t1"), _node("t2"), _node("t3")]
    fps = members(nodes, {"t1": "h1", "t2": "h2", "t3": "h3"}, _no_one_holds, require_verified=True)
    p = plan(RACK, nodes, fps, 335.0, [GB200])
    assert p.action == "run"
    assert p.nodes == ("t1", "t2", "t3")
    assert p.fingerprint == fc.membership_fingerprint({"t1": "h1", "t2": "h2", "t3": "h3"})


def test_members_are_idle_usable_verified_nodes_that_published_a_fingerprint() -> None:
    nodes = [_node("ok"), _node("busy"), _node("fresh"), _node("unreported")]
    del nodes[2]["metadata"]["labels"][labels.VERIFIED]
    hw = {"ok": "h", "busy": "h", "fresh": "h"}  # "unreported": no NodeDevices record yet
    got = members(nodes, hw, lambda n: n == "busy", require_verified=True)
    assert got == {"ok": "h"}
    # Without the per-node gate required, a node without the label still takes pods.
    assert set(members(nodes, hw, lambda n: n == "busy", require_verified=False)) == {
        "ok",
        "fresh",
    }


def test_a_domain_whose_members_all_passed_is_not_checked_again() -> None:
    """Covered: labelled, with a passed record for this domain on the hardware it has now. A
    node that went busy (so the idle set shrank) or a restart changes nothing."""
    nodes = [_checked(_node("t1"), "h1"), _checked(_node("t2"), "h2"), _node("t3")]
    fps = {"t1": "h1", "t2": "h2"}  # t3 is busy
    assert plan(RACK, nodes, fps, 335.0, [GB200]).action == "none"


def test_a_tray_added_or_repaired_makes_the_domain_checked_again() -> None:
    nodes = [_checked(_node("t1"), "h1"), _checked(_node("t2"), "h2"), _node("t3")]
    added = plan(RACK, nodes, {"t1": "h1", "t2": "h2", "t3": "h3"}, 335.0, [GB200])
    assert added.action == "run"
    assert added.nodes == ("t1", "t2", "t3")
    repaired = plan(RACK, nodes, {"t1": "h1-new-gpu", "t2": "h2"}, 335.0, [GB200])
    assert repaired.action == "run"
    assert repaired.nodes == ("t1", "t2")
    # A record of another fabric domain (the tray moved racks) does not cover it here.
    moved = [_checked(_node("t1"), "h1", fabric="nvlink-other-2"), _checked(_node("t2"), "h2")]
    assert plan(RACK, moved, {"t1": "h1", "t2": "h2"}, 335.0, [GB200]).action == "run"


def test_a_single_node_domain_is_labelled_without_a_run() -> None:
    p = plan(RACK, [_node("solo")], {"solo": "h"}, 335.0, [GB200])
    assert (p.action, p.nodes, p.reason) == ("pass", ("solo",), ONE_NODE)


def test_with_one_idle_member_of_several_the_check_waits() -> None:
    nodes = [_node("t1"), _node("t2")]
    p = plan(RACK, nodes, {"t1": "h1"}, 335.0, [GB200])
    assert p.action == "wait"
    assert p.nodes == ("t1",)


def test_a_class_without_a_gpu_to_gpu_figure_holds_nothing() -> None:
    assert fc.threshold([GB200]) == 335.0
    assert fc.threshold(["some-new-gpu"]) is None  # gpu-default has no figure
    p = plan(RACK, [_node("t1"), _node("t2")], {"t1": "a", "t2": "b"}, None, ["some-new-gpu"])
    assert p.action == "pass"
    assert "nothing to hold" in p.reason


def test_a_pass_labels_and_records_every_checked_node() -> None:
    nodes = [_node("t1"), _node("t2")]
    fps = {"t1": "h1", "t2": "h2"}
    p = plan(RACK, nodes, fps, 335.0, [GB200])
    result = CheckResult("Passed", "8 cross-tray pairs at 797.7 GB/s or more", 797.73)
    w = outcome(RACK, p, result, nodes, fps, 335.0, NOW)
    assert [(x.node, x.label) for x in w.nodes] == [("t1", True), ("t2", True)]
    assert w.events == []
    rec = w.nodes[0].record
    assert rec is not None
    assert (rec.passed, rec.fabric, rec.nodeFingerprint, rec.fingerprint) == (
        True,
        RACK,
        "h1",
        p.fingerprint,
    )
    assert (rec.thresholdGBs, rec.minGBs, rec.nodes, rec.time) == (335.0, 797.73, ["t1", "t2"], NOW)
    patch = fc.node_patch(w.nodes[0])
    assert patch["metadata"]["labels"] == {labels.FABRIC_VERIFIED: "true"}
    assert json.loads(patch["metadata"]["annotations"][labels.FABRIC_CHECK])["passed"] is True


def test_a_failure_unlabels_only_the_trays_it_measured_and_names_the_pair() -> None:
    """Issue 29 point 10a: t3, labelled by an earlier check and held by a running domain now,
    was not in this check: nothing was measured on it, so it keeps its label and record (it
    used to lose the label with the whole domain)."""
    busy = _checked(_node("t3"), "h3")  # labelled by an earlier check, busy now
    nodes = [_node("t1"), _node("t2"), busy]
    fps = {"t1": "h1", "t2": "h2"}
    p = plan(RACK, nodes, fps, 335.0, [GB200])
    result = CheckResult(
        "Failed",
        "t1/GPU 0 <- t2/GPU 3: 12.50 GB/s, below 335 GB/s",
        12.5,
        "t1/GPU 0 <- t2/GPU 3",
        ("t1", "t2"),
    )
    w = outcome(RACK, p, result, nodes, fps, 335.0, NOW)
    assert [(x.node, x.label) for x in w.nodes] == [("t1", False), ("t2", False)]
    assert fc.node_patch(w.nodes[0])["metadata"]["labels"] == {labels.FABRIC_VERIFIED: None}
    assert {n for n, _ in w.events} == {"t1", "t2"}
    ev = w.events[0][1]
    assert ev.type == "Warning"
    assert ev.reason == "FabricCheckFailed"
    assert "t1/GPU 0 <- t2/GPU 3: 12.50 GB/s, below 335 GB/s" in ev.message


def test_a_check_that_did_not_run_changes_no_label() -> None:
    nodes = [_node("t1"), _node("t2")]
    fps = {"t1": "h1", "t2": "h2"}
    p = plan(RACK, nodes, fps, 335.0, [GB200])
    w = outcome(RACK, p, CheckResult("NotRun", "no verification image"), nodes, fps, 335.0, NOW)
    assert w.nodes == []
    assert [(n, e.reason) for n, e in w.events] == [
        ("t1", "FabricCheckNotRun"),
        ("t2", "FabricCheckNotRun"),
    ]


def test_retries_back_off_as_the_per_node_verification_does() -> None:
    assert [retry_delay(n) for n in (1, 2, 3, 7, 20)] == [60, 120, 240, 3600, 3600]


# --- the reconciler, with in-memory caches ---------------------------------------------


class _Cache:
    def __init__(self, objs: Sequence[dict[str, Any]], index: str, key: Any) -> None:
        self.objs = {o["metadata"]["name"]: o for o in objs}
        self.index, self.key = index, key

    def get(self, key: str) -> dict[str, Any] | None:
        return self.objs.get(key)

    def by_index(self, name: str, value: str) -> list[dict[str, Any]]:
        assert name == self.index
        if self.key is None:  # claims: indexed by the pools of their results
            return [o for o in self.objs.values() if value in _pools(o)]
        return [o for o in self.objs.values() if self.key(o) == value]


def _pools(claim: dict[str, Any]) -> set[str]:
    results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    return {r["pool"] for r in results}


class _Runner:
    def __init__(self, *answers: CheckResult) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, tuple[str, ...], float]] = []

    def run(self, fabric: str, gpus: Mapping[str, int], threshold_gbs: float) -> CheckResult:
        assert all(n == 4 for n in gpus.values())  # every node publishes 4 GPUs
        self.calls.append((fabric, tuple(gpus), threshold_gbs))
        return self.answers.pop(0)

    def cleanup(self) -> None:
        return None


class _Cluster:
    """Nodes, their NodeDevices fingerprints and GPU slices; patches applied as the API
    server applies a merge patch to labels and annotations."""

    def __init__(self, names: Sequence[str]) -> None:
        self.nodes = _Cache(
            [_node(n) for n in names],
            BY_FABRIC,
            lambda o: o["metadata"]["labels"].get(labels.FABRIC_DOMAIN),
        )
        self.node_devices = _Cache(
            [
                {
                    "metadata": {"name": n},
                    "status": {"verification": {"state": "Verified", "currentFingerprint": n}},
                }
                for n in names
            ],
            "none",
            None,
        )
        slices = [_slice(n, [_gpu(i, GB200, RACK, []) for i in range(4)]) for n in names]
        for s in slices:
            s["metadata"]["name"] = s["spec"]["nodeName"]
        self.slices = _Cache(slices, BY_NODE, lambda o: o["spec"]["nodeName"])
        self.claims = _Cache([], BY_NODE, None)  # every claim's allocation, by node (pool)
        self.events: list[tuple[str, Event]] = []
        self.requeued: list[tuple[str, float]] = []
        self.clock = 1000.0

    def patch(self, name: str, patch: dict[str, Any]) -> object:
        meta = self.nodes.objs[name]["metadata"]
        for part in ("labels", "annotations"):
            for k, v in (patch["metadata"].get(part) or {}).items():
                if v is None:
                    meta[part].pop(k, None)
                else:
                    meta[part][k] = v
        return {}

    def deps(self, runner: _Runner) -> FabricCheckDeps:
        return FabricCheckDeps(
            patch_node=self.patch,
            node_event=lambda n, e: self.events.append((n, e)),
            nodes=self.nodes,
            node_devices=self.node_devices,
            device_slices=self.slices,
            allocations=self.claims,
            held=_no_one_holds,
            runner=runner,
            require_verified_nodes=True,
            require_synced=lambda: None,
            requeue_after=lambda k, d: self.requeued.append((k, d)),
            clock=lambda: self.clock,
            now=lambda: NOW,
        )

    def labelled(self) -> list[str]:
        return sorted(
            n
            for n, o in self.nodes.objs.items()
            if o["metadata"]["labels"].get(labels.FABRIC_VERIFIED) == "true"
        )


def test_a_passed_check_opens_the_domain_and_a_restart_does_not_run_it_again() -> None:
    cluster = _Cluster(["t1", "t2"])
    assert unusable(cluster.nodes.objs["t1"], require_fabric_verified=True) != ""
    runner = _Runner(CheckResult("Passed", "all pairs at 797.7 GB/s or more", 797.7))
    FabricCheck(cluster.deps(runner)).reconcile(RACK)
    assert runner.calls == [(RACK, ("t1", "t2"), 335.0)]
    assert cluster.labelled() == ["t1", "t2"]
    assert unusable(cluster.nodes.objs["t1"], require_fabric_verified=True) == ""
    rec = record_of(cluster.nodes.objs["t2"])
    assert rec is not None
    assert rec.passed
    assert rec.nodeFingerprint == "t2"
    # A new leader (a fresh FabricCheck) reads the records: nothing to run.
    again = _Runner()
    FabricCheck(cluster.deps(again)).reconcile(RACK)
    assert again.calls == []


def test_a_failed_check_is_retried_with_backoff_and_sooner_when_membership_changes() -> None:
    cluster = _Cluster(["t1", "t2"])
    bad = CheckResult("Failed", "t1/GPU 0 <- t2/GPU 3: 12.50 GB/s, below 335 GB/s", 12.5)
    good = CheckResult("Passed", "ok", 797.7)
    runner = _Runner(bad, bad, good)
    check = FabricCheck(cluster.deps(runner))
    check.reconcile(RACK)
    assert cluster.labelled() == []
    assert cluster.requeued == [(RACK, 60.0)]
    assert [e.reason for _, e in cluster.events] == ["FabricCheckFailed", "FabricCheckFailed"]
    why = unusable(cluster.nodes.objs["t1"], require_fabric_verified=True)
    assert why.startswith(f"fabric domain {RACK} failed its multi-node NVLink check: t1/GPU 0")
    # Reconciled again before the minute is up (a node event): nothing runs.
    cluster.clock += 30
    check.reconcile(RACK)
    assert len(runner.calls) == 1
    assert cluster.requeued[-1] == (RACK, 30.0)
    # Due: it runs, fails again, waits twice as long.
    cluster.clock += 30
    check.reconcile(RACK)
    assert len(runner.calls) == 2
    assert cluster.requeued[-1] == (RACK, 120.0)
    # The tray is repaired (its hardware fingerprint changes): checked at once.
    cluster.node_devices.objs["t2"]["status"]["verification"]["currentFingerprint"] = "t2-rma"
    check.reconcile(RACK)
    assert len(runner.calls) == 3
    assert cluster.labelled() == ["t1", "t2"]


def test_a_single_node_domain_is_labelled_by_the_reconciler_without_a_run() -> None:
    cluster = _Cluster(["solo"])
    runner = _Runner()
    FabricCheck(cluster.deps(runner)).reconcile(RACK)
    assert runner.calls == []
    assert cluster.labelled() == ["solo"]
    rec = record_of(cluster.nodes.objs["solo"])
    assert rec is not None
    assert rec.reason == ONE_NODE


def test_the_none_domain_is_never_checked() -> None:
    cluster = _Cluster(["c1", "c2"])
    for o in cluster.nodes.objs.values():
        o["metadata"]["labels"][labels.FABRIC_DOMAIN] = labels.NO_FABRIC
    runner = _Runner()
    FabricCheck(cluster.deps(runner)).reconcile(labels.NO_FABRIC)
    assert runner.calls == []
    assert cluster.labelled() == []


def test_a_check_is_not_run_again_while_the_node_cache_lags_its_own_writes() -> None:
    """The Node cache shows the check's writes a moment after the PATCH: a reconcile in that
    moment saw the checked nodes still uncovered and ran the whole check a second time."""
    cluster = _Cluster(["t1", "t2"])
    writes: list[str] = []
    runner = _Runner(CheckResult("Passed", "ok", 797.7))
    deps = cluster.deps(runner)
    lagging = FabricCheckDeps(**{**deps.__dict__, "patch_node": lambda n, p: writes.append(n)})
    check = FabricCheck(lagging)
    check.reconcile(RACK)
    check.reconcile(RACK)  # the cache has not caught up
    assert len(runner.calls) == 1
    assert writes == ["t1", "t2"]
    assert cluster.requeued == [(RACK, 1.0)]


def test_only_nodes_whose_per_node_gate_is_open_are_checked() -> None:
    """Whether or not gang placement requires the per-node label, the check measures only
    nodes their agent verified (NodeDevices status.verification.state)."""
    record = {"currentFingerprint": "h", "fingerprint": "old"}
    for state, fp in (("Verified", "h"), ("Overridden", "h"), ("Failed", ""), ("Unverified", "")):
        nd = {"metadata": {"name": "n"}, "status": {"verification": {**record, "state": state}}}
        assert fc.hardware_fingerprint(fc.node_devices_view(nd)) == fp
    cluster = _Cluster(["t1", "t2", "t3"])
    cluster.node_devices.objs["t3"]["status"]["verification"]["state"] = "Failed"
    runner = _Runner(CheckResult("Passed", "ok", 797.7))
    FabricCheck(cluster.deps(runner)).reconcile(RACK)
    assert runner.calls == [(RACK, ("t1", "t2"), 335.0)]


def test_a_subset_of_the_failed_nodes_waits_out_the_backoff() -> None:
    """After a failure, the check's own ComputeDomain still holds some nodes while it is
    deleted (or a workload took one): the idle set shrinks, but nothing new is there to
    measure, so the check is not run again before its backoff ends."""
    cluster = _Cluster(["t1", "t2", "t3"])
    bad = CheckResult("Failed", "t1/GPU 0 <- t2/GPU 3: 12.50 GB/s, below 335 GB/s", 12.5)
    runner = _Runner(bad, bad)
    deps = cluster.deps(runner)
    check = FabricCheck(deps)
    check.reconcile(RACK)
    assert cluster.requeued == [(RACK, 60.0)]
    cluster.clock += 10
    busy = FabricCheck(FabricCheckDeps(**{**deps.__dict__, "held": lambda n: n == "t3"}))
    busy._backoff = check._backoff  # the same controller, t3 held now
    busy.reconcile(RACK)
    assert len(runner.calls) == 1
    assert cluster.requeued[-1] == (RACK, 50.0)


def test_a_node_running_a_gpu_job_is_not_idle_and_is_not_checked() -> None:
    """Issue 29 point 10b: "idle" meant "held by no ComputeDomain", so the check's privileged
    workers, with every GPU, shared a tray with a single-node GPU job (a claim of one GPU,
    no ComputeDomain). A node with any GPU (or MIG device) claim allocated is busy; a NIC
    claim or an admin-access GPU claim (monitoring) leaves it idle."""
    cluster = _Cluster(["t1", "t2", "t3", "t4"])
    cluster.slices.objs["t4"]["spec"]["devices"].append(_nic("rdma-0"))
    job = _claim("train", "team-a", [("t3", "gpu-2")])
    nic_only = _claim("nic", "team-b", [("t4", "rdma-0")])
    watcher = _claim("dcgm", "monitoring", [("t1", "gpu-0")])
    watcher["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    for c in (job, nic_only, watcher):
        cluster.claims.objs[c["metadata"]["name"]] = c
    runner = _Runner(CheckResult("Passed", "ok", 797.7))
    FabricCheck(cluster.deps(runner)).reconcile(RACK)
    assert runner.calls == [(RACK, ("t1", "t2", "t4"), 335.0)]
    assert cluster.labelled() == ["t1", "t2", "t4"]
    assert fc.gpu_claims("t3", cluster.slices.by_index(BY_NODE, "t3"), [job]) == ["team-a/train"]


def test_the_check_says_what_it_is_doing_for_the_gangs_that_wait_for_it() -> None:
    """Issue 29 point 10d: the cause a waiting gang's status names (placement.py reads
    `state`): waiting for a second idle node, did not run (no verification image), failed
    with its pair; nothing once passed. Each change is announced (waiting gangs re-say it)."""
    cluster = _Cluster(["t1", "t2"])
    changed: list[str] = []
    no_image = "no verification image is configured to run it from"
    runner = _Runner(
        CheckResult("NotRun", no_image),
        CheckResult("Failed", "t1/GPU 0 <- t2/GPU 3: 12.50 GB/s, below 335 GB/s", 12.5),
        CheckResult("Passed", "ok", 797.7),
    )
    deps = FabricCheckDeps(**{**cluster.deps(runner).__dict__, "state_changed": changed.append})
    check = FabricCheck(deps)
    assert check.state(RACK) == ""
    one_busy = FabricCheck(FabricCheckDeps(**{**deps.__dict__, "held": lambda n: n == "t2"}))
    one_busy.reconcile(RACK)
    assert one_busy.state(RACK) == (
        "the check waits: a second idle verified node of the domain is needed to check against"
    )
    check.reconcile(RACK)
    assert check.state(RACK) == f"the check did not run: {no_image}"
    cluster.clock += 60
    check.reconcile(RACK)
    assert check.state(RACK) == (
        "the check failed: t1/GPU 0 <- t2/GPU 3: 12.50 GB/s, below 335 GB/s"
    )
    cluster.clock += 120
    check.reconcile(RACK)
    assert check.state(RACK) == ""
    assert len(changed) >= 4
    assert set(changed) == {RACK}


def test_on_a_failed_rack_only_elastic_and_multi_clique_claims_are_refused() -> None:
    """Issue 29 point 10e (the decision; the integration test runs it against the API
    server): a pending claim of an elastic or multi-clique domain on a node whose check failed
    is refused; a gang's (placed) and a one-node domain's are not, nor the check's own domain
    (labelled, in the driver's namespace) — a look-alike in a tenant namespace is — nor a
    claim already admitted; and nothing is refused without --fabric-check."""
    from fabricdra.controller.admission import ClaimOnNode
    from fabricdra.controller.fabriccheckrun import RUN_LABEL
    from fabricdra.controller.indexes import BY_UID
    from fabricdra.controller.nodes import NodeReconciler
    from fabricdra.controller.ownership import Ownership
    from tests.unit.test_reconciler_deps import MemApi, MemCache, node_deps

    def domain(
        uid: str, ns: str = "team", labels_: dict[str, str] | None = None, **spec: Any
    ) -> dict[str, Any]:
        meta = {"name": uid, "namespace": ns, "uid": uid, "labels": labels_ or {}}
        return {"metadata": meta, "spec": spec}

    run = {RUN_LABEL: "fabricdra-fabric-check-x"}
    domains = MemCache(
        [
            domain("elastic"),
            domain("spans", allowMultipleCliques=True, numNodes=4),
            domain("gang", numNodes=2),
            domain("one", numNodes=1),
            domain("check", "fabricdra-system", run),
            domain("look-alike", "team", run),
        ],
        {BY_UID: lambda o: [o["metadata"]["uid"]]},
    )
    node = _node("t1")
    node["metadata"]["annotations"][labels.FABRIC_CHECK] = json.dumps(
        {
            "fabric": RACK,
            "passed": False,
            "reason": "t1/GPU 0 <- t2/GPU 3: 12.50 GB/s, below 335 GB/s",
            "time": "2026-12-01T00:00:00Z",
            "fingerprint": "f",
        }
    )
    api, nodes, own = MemApi(), MemCache([node]), Ownership()

    def reconciler(fabric_check: bool) -> NodeReconciler:
        deps = node_deps(api, domains, nodes, own, namespace="fabricdra-system")
        return NodeReconciler(dataclasses.replace(deps, fabric_check=fabric_check))

    views = [
        ClaimOnNode(f"ns/{uid}", uid, "pending", "t")
        for uid in ("elastic", "spans", "gang", "one", "check", "look-alike")
    ] + [ClaimOnNode("ns/running", "elastic", "admitted", "t")]
    refused = reconciler(True)._fabric_check_refusals(node, views)
    assert sorted(refused) == ["ns/elastic", "ns/look-alike", "ns/spans"]
    assert refused["ns/elastic"] == (
        f"node t1: fabric domain {RACK} failed its multi-node NVLink check: t1/GPU 0 <- t2/GPU "
        "3: 12.50 GB/s, below 335 GB/s; an elastic ComputeDomain is not admitted there until a "
        "check of that fabric domain passes"
    )
    assert "a multi-clique ComputeDomain" in refused["ns/spans"]
    assert reconciler(False)._fabric_check_refusals(node, views) == {}
    passed = _checked(copy_of(node), "h1")  # a later check passed with it
    assert reconciler(True)._fabric_check_refusals(passed, views) == {}


def copy_of(obj: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(obj))  # type: ignore[no-any-return]
