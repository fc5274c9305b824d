"""Verification that measures what the system model promises (issue 18): the GPUs and compute
HCAs of a DGX H100-shaped tree against its built-in profile or an operator's, the PCIe uplinks
above each device, error counters judged as rises over a window, and a schedule that retries a
run that did not pass instead of holding the node a day."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.verification import (
    ProbeResult,
    SystemProfile,
    load_expectations,
    load_profiles,
    parse_profile,
    profile_for,
)
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.verification import (
    ErrorBaseline,
    Tools,
    VerificationRun,
    choose_system,
    run_passed,
    run_probes,
)
from fabricdra.kubeletplugin.verification.runner import (
    RESTARTED,
    RETRY,
    RETRY_MAX,
    SCHEDULED,
    Schedule,
)
from tests.sysfs.builder import PcieLink, SysfsBuilder
from tests.sysfs.nodes import dgx_h100, discover_at, h100_snapshot, hgx_h100

NO_TOOLS = Tools(run_bandwidth=False)
EXPECT = load_expectations()


def _probe(
    b: SysfsBuilder,
    snapshot: dict[str, Any] | None,
    *,
    expect: SystemProfile | None = None,
    baseline: ErrorBaseline | None = None,
) -> list[ProbeResult]:
    d = discover_at(b.root, snapshot)
    assert d.interfaces is not None
    assert d.accelerators is not None
    tree = SysfsTree(b.root)
    try:
        return run_probes(
            tree,
            d.interfaces,
            d.accelerators,
            d.nvml,
            EXPECT,
            NO_TOOLS,
            system=choose_system(tree, expect),
            baseline=baseline,
        )
    finally:
        tree.close()


def _by(results: list[ProbeResult], probe: str, device: str) -> ProbeResult:
    [r] = [r for r in results if r.probe == probe and r.device.startswith(device)]
    return r


def _dgx(tmp_path: Path, **kw: Any) -> tuple[SysfsBuilder, list[ProbeResult]]:
    b = SysfsBuilder(tmp_path / "sys")
    dgx = dgx_h100(b, **kw)
    return b, _probe(b, h100_snapshot(dgx.gpus))


# --- 1. expected inventory per system model ---------------------------------------------------


def test_a_whole_dgx_h100_is_recognised_from_dmi_and_passes(tmp_path: Path) -> None:
    _, results = _dgx(tmp_path)
    passed, why = run_passed(results, EXPECT)
    assert passed, why
    gpus = _by(results, "inventory", "gpus")
    assert (gpus.outcome, gpus.deviceClass) == ("Passed", "DGX H100")
    assert gpus.measured == "8 of 8 GPUs"
    assert gpus.expected == "8 x H100 SXM (h100-80gb-sxm)"
    hcas = _by(results, "inventory", "compute-hcas")
    assert hcas.outcome == "Passed"
    # The storage NICs (mlx5_8..11, Ethernet, no GPU beside them) are not compute HCAs.
    assert hcas.measured == "8: " + ", ".join(f"mlx5_{i}" for i in range(8))
    assert hcas.expected == "8 x compute HCA InfiniBand at 400 Gb/s"
    assert _by(results, "rdma-port", "mlx5_0").expected == (
        "every port at least 400 Gb/s (DGX H100 compute HCA)"
    )
    assert _by(results, "rdma-port", "mlx5_8").expected == "every port at least 100 Gb/s"


def test_a_dgx_h100_that_lost_a_gpu_fails_saying_what_is_missing(tmp_path: Path) -> None:
    _, results = _dgx(tmp_path, missing_gpus=(5,))
    r = _by(results, "inventory", "gpus")
    assert r.outcome == "Failed"
    assert r.measured == "7 of 8 GPUs"
    assert (r.reason or "").startswith("7 of 8 GPUs (H100 SXM): DGX H100 (DMI model 'DGXH100'")
    passed, why = run_passed(results, EXPECT)
    assert not passed
    assert "inventory on gpus" in why


def test_a_missing_compute_hca_fails_the_node(tmp_path: Path) -> None:
    _, results = _dgx(tmp_path, missing_hcas=(2,))
    r = _by(results, "inventory", "compute-hcas")
    assert r.outcome == "Failed"
    assert (r.reason or "").startswith("7 of 8 compute HCAs next to a GPU")


def test_a_compute_hca_at_200_of_400_fails_by_name(tmp_path: Path) -> None:
    _, results = _dgx(tmp_path, rates={3: "200 Gb/sec (2X NDR)"})
    slow = _by(results, "rdma-port", "mlx5_3")
    assert slow.outcome == "Failed"
    assert slow.reason == "port 1 at 200 Gb/s"
    assert slow.expected == "every port at least 400 Gb/s (DGX H100 compute HCA)"
    assert _by(results, "rdma-port", "mlx5_2").outcome == "Passed"
    passed, why = run_passed(results, EXPECT)
    assert not passed
    assert "rdma-port on mlx5_3" in why


def test_an_unknown_model_without_expect_says_so_and_does_not_fail(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    b.dmi("PowerEdge XE9680", "0TTMJ8", vendor="Dell Inc.")
    results = _probe(b, h100_snapshot(hgx.gpus))
    r = _by(results, "inventory", "node")
    assert r.outcome == "NotRun"
    assert r.reason == (
        "no system profile for DMI model 'PowerEdge XE9680' / '0TTMJ8': pass --expect to hold "
        "it to one"
    )
    assert run_passed(results, EXPECT)[0]


def test_an_expect_file_holds_any_system_to_its_figures(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)  # no DMI at all: only the operator's file says what it should have
    nine = parse_profile(
        "name: XE9680\n"
        "gpus: {count: 9, deviceClass: h100-80gb-sxm}\n"
        "hcas: {count: 8, linkLayer: Ethernet, rateGbps: 800, nextToGpu: true}\n"
    )
    results = _probe(b, h100_snapshot(hgx.gpus), expect=nine)
    assert _by(results, "inventory", "gpus").measured == "8 of 9 GPUs"
    assert _by(results, "inventory", "gpus").outcome == "Failed"
    assert _by(results, "inventory", "compute-hcas").outcome == "Passed"
    assert _by(results, "rdma-port", "mlx5_0").reason == "port 1 at 400 Gb/s"
    json_profile = parse_profile(json.dumps({"gpus": {"count": 8}}))
    assert json_profile.name == "expected"
    ok = _probe(b, h100_snapshot(hgx.gpus), expect=json_profile)
    assert _by(ok, "inventory", "gpus").outcome == "Passed"
    with pytest.raises(ValueError, match="gpus"):
        parse_profile("gpus: {count: many}\n")


@pytest.mark.parametrize(
    ("names", "profile"),
    [
        (["DGXH100"], "DGX H100"),
        (["NVIDIA DGX-H100 "], "DGX H100"),
        (["dgx h200"], "DGX H200"),
        (["DGXB200", ""], "DGX B200"),
        (["ProLiant XD685", "HGX B200 8-GPU"], "HGX B200 8-GPU"),
        (["GB200 NVL"], "GB200 NVL72 compute tray"),
        (["GB300 NVL compute tray"], "GB300 NVL72 compute tray"),
        (["PowerEdge XE9680"], None),
    ],
)
def test_dmi_names_are_matched_ignoring_spelling(names: list[str], profile: str | None) -> None:
    found = profile_for(names)
    assert (found.name if found else None) == profile


def test_every_built_in_profile_cites_a_source_and_names_a_known_class() -> None:
    classes = {c.name for c in EXPECT.classes}
    names = {p.name for p in load_profiles()}
    assert {"DGX H100", "DGX H200", "DGX B200", "HGX H100 8-GPU", "HGX H200 8-GPU"} <= names
    assert {"HGX B200 8-GPU", "GB200 NVL72 compute tray", "GB300 NVL72 compute tray"} <= names
    for p in load_profiles():
        assert p.sources, p.name
        assert all(s.startswith("https://") for s in p.sources), p.name
        assert p.gpus is not None, p.name
        assert p.gpus.deviceClass in classes, p.name


# --- 2. PCIe: width and speed against the device's own maximum, uplinks included -------------


def test_an_x4_gen1_uplink_fails_every_device_below_it(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    dgx = dgx_h100(b)
    usp = "0000:38:00.0"  # the switch upstream port above GPU 1 and HCA mlx5_1
    gen1_x4 = PcieLink(width=4, speed="2.5 GT/s PCIe")
    b.pcie_link(f"devices/pci0000:37/0000:37:01.0/{usp}", gen1_x4)
    results = _probe(b, h100_snapshot(dgx.gpus))
    gpu = _by(results, "pcie-link", dgx.gpus[1])
    assert gpu.outcome == "Failed"
    assert gpu.reason == f"uplink {usp} trained at x4 of x16, 2.5 GT/s PCIe of 32.0 GT/s PCIe"
    assert _by(results, "pcie-link", "mlx5_1 (").outcome == "Failed"
    assert _by(results, "pcie-link", dgx.gpus[0]).outcome == "Passed"


def test_an_uplink_at_full_width_but_lower_speed_fails(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    dgx = dgx_h100(b)
    rp = "devices/pci0000:15/0000:15:01.0"  # the root port above GPU 0's switch
    b.pcie_link(rp, PcieLink(speed="16.0 GT/s PCIe"))
    results = _probe(b, h100_snapshot(dgx.gpus))
    assert _by(results, "pcie-link", dgx.gpus[0]).reason == (
        "uplink 0000:15:01.0 trained at 16.0 GT/s PCIe of 32.0 GT/s PCIe"
    )


def test_the_bridge_right_above_a_gpu_shares_its_idle_speed_but_not_its_width(
    tmp_path: Path,
) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    dgx = dgx_h100(b)
    dsp = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0"
    b.pcie_link(dsp, PcieLink(speed="2.5 GT/s PCIe"))  # the GPU's own link, idle
    b.write(f"bus/pci/devices/{dgx.gpus[0]}/current_link_speed", "2.5 GT/s PCIe")
    assert _by(_probe(b, h100_snapshot(dgx.gpus)), "pcie-link", dgx.gpus[0]).outcome == "Passed"
    b.pcie_link(dsp, PcieLink(width=8))
    r = _by(_probe(b, h100_snapshot(dgx.gpus)), "pcie-link", dgx.gpus[0])
    assert r.reason == "uplink 0000:17:00.0 trained at x8 of x16"


# --- 3. error counters: rises over a window from a baseline ------------------------------------


def test_counts_from_before_the_first_pass_do_not_fail_a_rise_does(tmp_path: Path) -> None:
    # A cable reseat before the agent started left link_downed=2 and symbol_error=500.
    b = SysfsBuilder(tmp_path / "sys")
    dgx = dgx_h100(b, counters={4: (("symbol_error", 500), ("link_downed", 2))})
    snap = h100_snapshot(dgx.gpus)
    counters = "class/infiniband/mlx5_4/ports/1/counters"
    baseline = ErrorBaseline()
    first = _by(_probe(b, snap, baseline=baseline), "rdma-errors", "mlx5_4")
    assert first.outcome == "Passed"
    assert first.measured == "2 counters read, none rose"
    assert baseline.readings[("mlx5_4", 1, "symbol_error")] == 500

    b.write(f"{counters}/symbol_error", "508")  # within the limit of 10 per window
    assert _by(_probe(b, snap, baseline=baseline), "rdma-errors", "mlx5_4").outcome == "Passed"

    b.write(f"{counters}/symbol_error", "530")
    b.write(f"{counters}/link_downed", "3")
    r = _by(_probe(b, snap, baseline=baseline), "rdma-errors", "mlx5_4")
    assert r.outcome == "Failed"
    assert r.reason == "port 1 link_downed rose by 1 > 0; port 1 symbol_error rose by 22 > 10"
    assert "symbol_error rise <= 10" in (r.expected or "")

    # The window moved on: a quiet link passes the next run (a retry recovers by itself).
    assert _by(_probe(b, snap, baseline=baseline), "rdma-errors", "mlx5_4").outcome == "Passed"
    # A counter below its baseline was reset: it rose by what it reads now.
    b.write(f"{counters}/symbol_error", "4")
    assert _by(_probe(b, snap, baseline=baseline), "rdma-errors", "mlx5_4").outcome == "Passed"


def test_the_shipped_counter_limits() -> None:
    assert EXPECT.for_nic().rdmaErrorCounters == {
        "symbol_error": 10,
        "link_error_recovery": 10,
        "link_downed": 0,
        "port_rcv_errors": 0,
        "local_link_integrity_errors": 0,
        "excessive_buffer_overrun_errors": 0,
    }


# --- 5. recovery: retry with backoff, restart reruns -------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _run(passed: bool, fp: str = "fp") -> VerificationRun:
    return VerificationRun(datetime(2026, 1, 2, tzinfo=UTC), fp, [], passed, "why")


def test_a_run_that_did_not_pass_is_retried_with_backoff_not_after_a_day() -> None:
    clock = Clock()
    s = Schedule(interval=86400, clock=clock)
    waits = []
    for _ in range(9):
        s.ran(_run(False))
        assert s.due("fp") is None
        waits.append(s.retry_after())
        clock.now += s.retry_after()
        assert s.due("fp") == RETRY
    assert waits == [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]
    assert max(waits) == RETRY_MAX
    s.ran(_run(True))
    clock.now += RETRY_MAX
    assert s.due("fp") is None  # passed: only the schedule again
    clock.now += 86400
    assert s.due("fp") == SCHEDULED
    s.ran(_run(False))
    assert s.retry_after() == 60  # a new streak starts short


def test_a_restarted_agent_reruns_while_the_recorded_verdict_holds_the_gate() -> None:
    from fabricdra.kubeletplugin.verification import decide

    recorded = decide(_run(False), "fp", None)
    s = Schedule(interval=86400, clock=Clock())
    assert s.restore(recorded)
    assert s.last_run is not None  # the gate keeps the recorded verdict meanwhile
    assert not s.last_run.passed
    assert s.due("fp") == RESTARTED
    s.ran(_run(True))
    assert s.due("fp") is None
    assert s.runs == 1


def test_a_request_starts_a_fresh_error_window() -> None:
    s = Schedule()
    s.baseline.readings[("mlx5_0", 1, "link_downed")] = 3
    s.ran(_run(True))
    s.request()
    assert s.due("fp") == "requested"
    assert s.baseline.readings == {}
