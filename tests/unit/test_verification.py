"""Verification probes and the gate, over kernel-shaped sysfs trees and recorded NVML answers.
Bandwidth tools are real executables written into a folder put on the probe's search path."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.verification import (
    Override,
    ProbeResult,
    load_expectations,
    parse_expectations,
)
from fabricdra.kubeletplugin.discovery.node import Discovery
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.verification import (
    Tools,
    VerificationRun,
    decide,
    fingerprint,
    override_from_annotation,
    run_passed,
    run_probes,
)
from fabricdra.kubeletplugin.verification.runner import CHANGED, FIRST_RUN, Schedule
from tests.sysfs.builder import PcieLink, Port, SysfsBuilder
from tests.sysfs.nodes import discover_at, h100_snapshot, hgx_h100

# The active probes turned off (Skipped, not required): these tests are about the others;
# tests/unit/test_active_probes.py runs the tools.
NO_TOOLS = Tools(run_bandwidth=False)
EXPECT = load_expectations()


def _node(tmp_path: Path, **hgx: Any) -> tuple[SysfsBuilder, Any]:
    b = SysfsBuilder(tmp_path / "sys")
    return b, hgx_h100(b, **hgx)


def _probe(
    b: SysfsBuilder, snapshot: dict[str, Any] | None, tools: Tools = NO_TOOLS
) -> tuple[list[ProbeResult], Discovery]:
    d = discover_at(b.root, snapshot)
    assert d.interfaces is not None
    assert d.accelerators is not None
    tree = SysfsTree(b.root)
    try:
        return run_probes(tree, d.interfaces, d.accelerators, d.nvml, EXPECT, tools), d
    finally:
        tree.close()


def _by(results: list[ProbeResult], probe: str, device: str) -> ProbeResult:
    [r] = [r for r in results if r.probe == probe and r.device.startswith(device)]
    return r


def test_a_healthy_hgx_node_passes_with_the_active_probes_turned_off(tmp_path: Path) -> None:
    b, hgx = _node(tmp_path)
    results, _ = _probe(b, h100_snapshot(hgx.gpus))
    passed, why = run_passed(results, EXPECT)
    assert passed, why
    assert {r.outcome for r in results if r.probe in ("pcie-link", "nvlink", "rdma-port")} == {
        "Passed"
    }
    # 8 GPUs (pcie + nvlink), 8 NICs (pcie, port, errors, bandwidth), three node probes
    # (host->GPU, GPU<->GPU, NCCL), and the inventory, not run: the tree has no DMI model with
    # a profile.
    assert len(results) == 8 * 2 + 8 * 4 + 3 + 1
    assert _by(results, "inventory", "node").outcome == "NotRun"
    tools = [r for r in results if r.probe.endswith("bandwidth") or r.probe == "nccl-allreduce"]
    assert {r.outcome for r in tools} == {"Skipped"}
    assert all("turned off" in (r.reason or "") for r in tools)


def test_a_gpu_trained_on_fewer_lanes_fails_the_node(tmp_path: Path) -> None:
    b, hgx = _node(tmp_path)
    gpu = hgx.gpus[2]
    b.write(f"bus/pci/devices/{gpu}/current_link_width", "8")
    results, _ = _probe(b, h100_snapshot(hgx.gpus))
    r = _by(results, "pcie-link", gpu)
    assert r.outcome == "Failed"
    assert "trained at x8 of x16" in (r.reason or "")
    assert r.measured == "x8 32.0 GT/s PCIe (max x16 32.0 GT/s PCIe)"
    passed, why = run_passed(results, EXPECT)
    assert not passed
    assert f"pcie-link on {gpu}" in why


def test_an_idle_gpu_at_a_lower_speed_passes_but_a_nic_does_not(tmp_path: Path) -> None:
    b, hgx = _node(tmp_path)
    gpu, nic = hgx.gpus[0], hgx.nics[1]
    b.write(f"bus/pci/devices/{gpu}/current_link_speed", "2.5 GT/s PCIe")
    b.write(f"bus/pci/devices/{nic}/current_link_speed", "16.0 GT/s PCIe")
    results, _ = _probe(b, h100_snapshot(hgx.gpus))
    assert _by(results, "pcie-link", gpu).outcome == "Passed"
    nic_result = _by(results, "pcie-link", f"mlx5_1 ({nic})")
    assert nic_result.outcome == "Failed"
    assert "not its maximum" in (nic_result.reason or "")


def test_a_gen4_slot_is_below_the_class_minimum(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rb = b.root_bus("pci0000:00")
    gen4 = PcieLink(speed="16.0 GT/s PCIe", max_speed="16.0 GT/s PCIe")
    b.gpu(b.bridge(rb, "0000:00:01.0"), "0000:01:00.0", link=gen4)
    results, _ = _probe(b, h100_snapshot(["0000:01:00.0"]))
    r = _by(results, "pcie-link", "0000:01:00.0")
    assert r.outcome == "Failed"
    assert "16 GT/s is below 32 GT/s" in (r.reason or "")


def test_missing_link_files_are_not_run_and_keep_the_node_unverified(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rb = b.root_bus("pci0000:00")
    b.gpu(b.bridge(rb, "0000:00:01.0"), "0000:01:00.0", link=None)
    results, _ = _probe(b, h100_snapshot(["0000:01:00.0"]))
    r = _by(results, "pcie-link", "0000:01:00.0")
    assert r.outcome == "NotRun"
    assert "current_link_width: absent" in (r.reason or "")
    passed, why = run_passed(results, EXPECT)
    assert not passed
    assert why.startswith("required probes did not run: pcie-link")
    run = VerificationRun(datetime.now(UTC), "fp", results, passed, why)
    assert decide(run, "fp", None).state == "Unverified"


def test_nvlink_not_recorded_is_not_run_and_a_link_down_fails(tmp_path: Path) -> None:
    b, hgx = _node(tmp_path)
    snap = h100_snapshot(hgx.gpus)
    del snap[hgx.gpus[0]]["nvlinks"]
    snap[hgx.gpus[1]]["nvlinks"][5]["active"] = False
    results, _ = _probe(b, snap)
    absent = _by(results, "nvlink", hgx.gpus[0])
    assert absent.outcome == "NotRun"
    assert "no NVLink state" in (absent.reason or "")
    down = _by(results, "nvlink", hgx.gpus[1])
    assert down.outcome == "Failed"
    assert down.measured == "17 of 18 links active"
    assert down.reason == "links down: 5"


def test_nvlink_without_nvml_is_not_run(tmp_path: Path) -> None:
    b, _ = _node(tmp_path)
    results, _ = _probe(b, None)
    r = [r for r in results if r.probe == "nvlink"]
    assert r
    assert {x.outcome for x in r} == {"NotRun"}


def test_rdma_rate_and_error_counters(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rb = b.root_bus("pci0000:00")
    for i, (rate, counters) in enumerate(
        [
            ("25 Gb/sec (1X EDR)", None),  # slow, and no counters folder
            ("400 Gb/sec (4X NDR)", (("symbol_error", 7), ("link_downed", 0))),
        ]
    ):
        nic = f"0000:0{i + 1}:00.0"
        pf = b.nic(b.bridge(rb, f"0000:00:0{i + 1}.0"), nic, f"eth{i}")
        b.rdma(pf, f"mlx5_{i}", [Port(netdev=f"eth{i}", rate=rate, counters=counters)])
    results, _ = _probe(b, None)
    slow = _by(results, "rdma-port", "mlx5_0")
    assert slow.outcome == "Failed"
    assert slow.reason == "port 1 at 25 Gb/s"
    assert _by(results, "rdma-errors", "mlx5_0").outcome == "NotRun"
    # Counted before the run (cumulative since the driver loaded): not a rise in its window.
    errors = _by(results, "rdma-errors", "mlx5_1")
    assert errors.outcome == "Passed"
    assert errors.measured == "2 counters read, none rose"
    assert _by(results, "rdma-port", "mlx5_1").outcome == "Passed"


def test_a_nic_whose_link_failed_is_skipped_not_failed(tmp_path: Path) -> None:
    b, hgx = _node(tmp_path, broken_nics=(3,))
    results, _ = _probe(b, h100_snapshot(hgx.gpus))
    skipped = [r for r in results if r.device.startswith("mlx5_3")]
    assert {r.outcome for r in skipped} == {"Skipped"}
    assert run_passed(results, EXPECT)[0]


# --- the active probes' figures (the runs themselves: test_active_probes.py) --------------

FIGURES = {
    "gpuBandwidthGBs": "gpu-bandwidth",
    "hostBandwidthGBs": "host-bandwidth",
    "ncclAllReduceBusGBs": "nccl-allreduce",
    "nicBandwidthFraction": "nic-bandwidth",
    "nicBandwidthGbps": "nic-bandwidth",
}


def test_every_bandwidth_figure_has_a_source_and_its_probe_is_required() -> None:
    """A class that has a figure requires its probe (a node without the tools is not
    verified), and names where the figure comes from."""
    for row in EXPECT.classes:
        for field, probe in FIGURES.items():
            if getattr(row, field) is None:
                continue
            assert probe in row.required, (row.name, probe)
            assert row.sources.get(field, "").startswith("https://"), (row.name, field)
    # azurehpc-health-checks' figures, not the old guesses (600 GB/s, 80 Gb/s)
    assert EXPECT.for_gpu("gb200-186gb-nvl72").gpuBandwidthGBs == 335.0
    assert EXPECT.for_gpu("h200-141gb-sxm").ncclAllReduceBusGBs == 431.0
    assert EXPECT.for_nic().nicBandwidthFraction == 0.9
    assert "nic-bandwidth" in EXPECT.for_nic().required


# --- gate, fingerprint, schedule, data -------------------------------------------------------


def _run(passed: bool, fp: str = "fp", probes: list[ProbeResult] | None = None) -> VerificationRun:
    return VerificationRun(datetime(2026, 1, 2, tzinfo=UTC), fp, probes or [], passed, "why")


def test_gate_states() -> None:
    assert decide(None, "fp", None).state == "Unverified"
    assert decide(None, "fp", None).reason == "no verification run yet"
    assert decide(_run(True), "fp", None).state == "Verified"
    changed = decide(_run(True), "other", None)
    assert changed.state == "Unverified"
    assert "changed since the last run" in changed.reason
    assert not changed.offered
    failed_probe = ProbeResult(
        probe="nvlink", device="0000:18:00.0", deviceClass="h100-80gb-sxm", outcome="Failed"
    )
    assert decide(_run(False, probes=[failed_probe]), "fp", None).state == "Failed"
    over = decide(_run(False, probes=[failed_probe]), "fp", _override("RMA 123"), NOW)
    assert over.state == "Overridden"
    assert over.offered
    assert over.passed is False  # the run it overrides is still recorded
    assert over.reason == "marked verified by hand: RMA 123"


NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


def _override(reason: str, fp: str | None = "fp", expires: datetime | None = None) -> Override:
    return Override(reason=reason, fingerprint=fp, expires=expires or NOW + timedelta(days=1))


def test_an_override_holds_only_for_the_hardware_it_was_given_for() -> None:
    """A repair after the override (a swapped GPU: a new fingerprint) ends it: the node is
    gated by what its runs say again, and the record says why the override is not applied."""
    given = _override("RMA 123", fp="fp")
    applied = decide(_run(True, fp="fp"), "fp", given, NOW)
    assert (applied.state, applied.override, applied.overrideIgnored) == ("Overridden", given, None)
    assert applied.currentFingerprint == "fp"
    repaired = decide(_run(False, fp="fp"), "new", given, NOW)
    assert repaired.state == "Unverified"
    assert not repaired.offered
    assert repaired.override is None
    assert repaired.currentFingerprint == "new"
    assert repaired.overrideIgnored is not None
    assert "given for hardware fp, the node is now new" in repaired.overrideIgnored
    # the new hardware's own passed run still verifies it: the stale override is only ignored
    assert decide(_run(True, fp="new"), "new", given, NOW).state == "Verified"


def test_an_expired_override_is_ignored() -> None:
    failed_probe = ProbeResult(
        probe="nvlink", device="0000:18:00.0", deviceClass="h100-80gb-sxm", outcome="Failed"
    )
    run = _run(False, probes=[failed_probe])
    over = _override("burn-in", expires=NOW + timedelta(seconds=1))
    assert decide(run, "fp", over, NOW).state == "Overridden"
    expired = decide(run, "fp", over, NOW + timedelta(seconds=1))
    assert expired.state == "Failed"
    assert expired.override is None
    assert expired.overrideIgnored == "override expired at 2026-03-01T12:00:01Z: not applied"
    # a zone-less timestamp (written by hand) is read as UTC
    naive = _override("burn-in", expires=datetime(2026, 3, 1, 11))
    assert decide(run, "fp", naive, NOW).state == "Failed"


def test_an_override_bound_to_no_hardware_or_without_expiry_is_ignored() -> None:
    for over in (
        Override(reason="plain words"),  # the old annotation form, or hand-written text
        Override(reason="no expiry", fingerprint="fp"),
        Override(reason="no hardware", expires=NOW + timedelta(days=1)),
    ):
        v = decide(_run(False), "fp", over, NOW)
        assert v.state == "Unverified", over
        assert v.override is None
        assert v.overrideIgnored
        assert "not applied" in v.overrideIgnored


def test_override_annotation() -> None:
    doc = {
        "reason": "burn-in done",
        "by": "ops@x",
        "time": "2026-01-02T03:04:05Z",
        "fingerprint": "abc",
        "expires": "2026-01-09T03:04:05Z",
    }
    o = override_from_annotation(json.dumps(doc))
    assert o is not None
    assert (o.reason, o.by, o.fingerprint) == ("burn-in done", "ops@x", "abc")
    assert o.expires == datetime(2026, 1, 9, 3, 4, 5, tzinfo=UTC)
    assert override_from_annotation("plain words") == Override(reason="plain words")
    assert override_from_annotation("  ") is None
    assert override_from_annotation(None) is None


def test_fingerprint_changes_with_a_swapped_gpu_or_a_driver_upgrade(tmp_path: Path) -> None:
    b, hgx = _node(tmp_path)
    snap = h100_snapshot(hgx.gpus)

    def fp(s: dict[str, Any]) -> str:
        d = discover_at(b.root, s)
        assert d.interfaces is not None
        assert d.accelerators is not None
        tree = SysfsTree(b.root)
        try:
            return fingerprint(tree, d.interfaces, d.accelerators)
        finally:
            tree.close()

    b.write("module/nvidia/version", "570.86.15")
    first = fp(snap)
    assert fp(snap) == first
    snap[hgx.gpus[4]]["uuid"] = "GPU-ffffffff-5b0e-4c1a-9f3e-000000000000"
    swapped = fp(snap)
    assert swapped != first
    b.write("module/nvidia/version", "580.65.06")
    assert fp(snap) != swapped


def test_schedule_and_restore() -> None:
    s = Schedule(interval=3600)
    assert s.due("a") == FIRST_RUN
    s.ran(_run(True, "a"))
    assert s.due("a") is None
    assert s.due("b") == CHANGED
    s.requested = True
    assert s.due("a") == "requested"
    old = decide(
        VerificationRun(datetime.now(UTC) - timedelta(hours=2), "a", [], True, "ok"), "a", None
    )
    restored = Schedule(interval=3600)
    assert restored.restore(old)
    assert restored.due("a") == "agent restarted"  # a restart reruns, whatever the age
    restored.ran(_run(True, "a"))
    assert restored.due("a") is None
    assert not Schedule().restore(decide(None, "a", None))  # nothing ran: nothing to restore


def test_expectations_data_is_checked() -> None:
    assert EXPECT.for_gpu("h100-80gb-sxm").nvlinkActiveLinks == 18
    assert EXPECT.for_gpu("no-such-class").name == "gpu-default"
    assert "rdma-port" in EXPECT.for_nic().required
    with pytest.raises(ValueError, match="no 'rdma' row"):
        parse_expectations(json.dumps({"classes": [{"class": "gpu-default", "required": []}]}))
    with pytest.raises(ValueError, match="bogus"):
        parse_expectations(json.dumps({"classes": [{"class": "rdma", "required": ["bogus"]}]}))
