"""The active probes (nvbandwidth, ib_write_bw loopback, all_reduce_perf) run as one shell
script, in parallel, each under its own timeout, against the stand-in tools in tests/standins
(real executables printing the tools' real output formats). Outcomes and the order of events
the stand-ins log are asserted, never wall time."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.verification import ProbeResult, load_expectations
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.verification import Tools, VerificationRun, run_passed, run_probes
from fabricdra.kubeletplugin.verification.active import (
    parse_all_reduce,
    parse_ib_write_bw,
    parse_nvbandwidth,
    parse_run,
)
from fabricdra.kubeletplugin.verification.runner import run_once
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import discover_at, h100_snapshot, hgx_h100

STANDINS = Path(__file__).resolve().parents[1] / "standins"
EXPECT = load_expectations()
ACTIVE = ("gpu-bandwidth", "host-bandwidth", "nccl-allreduce", "nic-bandwidth")


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "standin"
    d.mkdir()
    monkeypatch.setenv("STANDIN_DIR", str(d))
    for var in (
        "STANDIN_HANG",
        "STANDIN_AWAIT",
        "STANDIN_VALUE",
        "STANDIN_LATE_SERVER",
        "STANDIN_END_AFTER",
        "STANDIN_HOLD",
    ):
        monkeypatch.delenv(var, raising=False)
    return d


def _node(tmp_path: Path) -> tuple[SysfsBuilder, Any]:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    return b, hgx


def _run(tmp_path: Path, tools: Tools, busy: str | None = None) -> list[ProbeResult]:
    b, hgx = _node(tmp_path)
    d = discover_at(b.root, h100_snapshot(hgx.gpus))
    assert d.interfaces is not None
    assert d.accelerators is not None
    tree = SysfsTree(b.root)
    try:
        return run_probes(tree, d.interfaces, d.accelerators, d.nvml, EXPECT, tools, busy=busy)
    finally:
        tree.close()


def _active(results: list[ProbeResult]) -> dict[tuple[str, str], ProbeResult]:
    return {(r.probe, r.device): r for r in results if r.probe in ACTIVE}


# Each tool's timeout where stand-ins hang: every hung tool costs one, so it is short (it was
# 15 s). It need only outlast one stand-in's start (a tool TERMed before Python ran its first
# line leaves no trace): about 1 s on the 2-core CI machine at load 12. What must happen before
# the first kill is not raced against it: the hung stand-ins, told to stop, end only once it
# has (STANDIN_END_AFTER), within the kill grace that timeout gives them (KILL_AFTER, 5 s).
HANG_TIMEOUT = 5


def _tools(timeout: float = 60.0) -> Tools:
    return Tools(path=str(STANDINS), timeout_seconds=timeout)


def test_every_tool_runs_and_its_real_output_format_is_read(tmp_path: Path, standin: Path) -> None:
    results = _run(tmp_path, _tools())
    found = _active(results)
    # node: host->GPU, GPU<->GPU, NCCL; one loopback per NIC (8 on the HGX board)
    assert len(found) == 3 + 8
    assert {r.outcome for r in found.values()} == {"Passed"}, found
    assert found[("host-bandwidth", "node")].measured == (
        "weakest host->GPU0 55.37 GB/s over 8 GPUs"
    )
    assert found[("host-bandwidth", "node")].expected == "every host->GPU copy at least 48 GB/s"
    gpu = found[("gpu-bandwidth", "node")]
    assert gpu.measured == "weakest pair GPU0<-GPU1 391.18 GB/s over 56 pairs"
    assert gpu.expected == "every GPU pair at least 335 GB/s"
    nccl = found[("nccl-allreduce", "node")]
    assert nccl.measured == "480.52 GB/s bus bandwidth at 16GB"
    assert nccl.expected == "bus bandwidth at least 460 GB/s"
    [nic] = [r for (p, _), r in found.items() if p == "nic-bandwidth"][:1]
    assert nic.measured == "391.71 Gb/s"
    assert nic.expected == "loopback at least 360 Gb/s"  # 0.9 of the port's 400 Gb/s
    passed, why = run_passed(results, EXPECT)
    assert passed, why
    calls = (standin / "calls").read_text().splitlines()
    assert "nvbandwidth -t host_to_device_memcpy_ce device_to_device_memcpy_read_ce" in calls
    assert "all_reduce_perf -b 16G -e 16G -f 2 -g 8" in calls
    # the GPU tools share a lane: nvbandwidth finished before all_reduce_perf started
    events = (standin / "events").read_text().splitlines()
    assert events.index("end nvbandwidth") < events.index("start all_reduce_perf")


def test_figures_below_the_class_minimum_fail_by_name(
    tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_VALUE", "h2d=30.5,busbw=301.2,mlx5_2=200.25")
    monkeypatch.setenv("STANDIN_D2D_WEAK", "0:2:120.25")
    results = _run(tmp_path, _tools())
    found = _active(results)
    assert found[("host-bandwidth", "node")].outcome == "Failed"
    assert found[("host-bandwidth", "node")].reason == (
        "below 48 GB/s: " + ", ".join(f"GPU{g} 30.5" for g in range(8))
    )
    assert found[("gpu-bandwidth", "node")].reason == "below 335 GB/s: GPU0<-GPU2 120.25"
    assert found[("nccl-allreduce", "node")].reason == "below 460 GB/s"
    assert found[("nic-bandwidth", "mlx5_2")].outcome == "Failed"
    assert found[("nic-bandwidth", "mlx5_2")].reason == "below 360 Gb/s"
    assert found[("nic-bandwidth", "mlx5_0")].outcome == "Passed"
    passed, why = run_passed(results, EXPECT)
    assert not passed
    assert "host-bandwidth on node" in why


def test_hung_tools_cost_one_timeout_each_in_parallel_and_end_their_lane(
    tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tool hangs: each is killed at its own timeout, all of them were started before
    the first ended (parallel: a hung stand-in told to stop waits for those starts, which
    tools run one after another would never reach before timeout's KILL), and the GPU lane's
    next tool is not started after nvbandwidth hung."""
    monkeypatch.setenv("STANDIN_HANG", "nvbandwidth,ib_write_bw")
    monkeypatch.setenv("STANDIN_END_AFTER", "start nvbandwidth=1,start ib_write_bw:=8")
    results = _run(tmp_path, _tools(timeout=HANG_TIMEOUT))
    found = _active(results)
    for key in [("host-bandwidth", "node"), ("gpu-bandwidth", "node")] + [
        k for k in found if k[0] == "nic-bandwidth"
    ]:
        assert found[key].outcome == "Failed", found[key]
        assert (
            found[key].reason
            == f"{'nvbandwidth' if 'node' in key else 'ib_write_bw'} ran past {HANG_TIMEOUT} s"
        )
    nccl = found[("nccl-allreduce", "node")]
    assert nccl.outcome == "Skipped"
    assert nccl.reason == "not started: nvbandwidth ran past its timeout first"
    events = (standin / "events").read_text().splitlines()
    starts = [e for e in events if e.startswith("start ") and "server" not in e]
    ends = [i for i, e in enumerate(events) if e.startswith("end ") and "server" not in e]
    # nvbandwidth and 8 clients (one may have started twice: a refused connect is retried);
    # all_reduce_perf never started
    assert len(set(starts)) == 1 + 8
    assert max(events.index(s) for s in starts) < min(ends)
    assert "all_reduce_perf" not in (standin / "calls").read_text()


def test_probes_run_at_the_same_time(
    tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each loopback client passes only if it sees nvbandwidth running alongside it (the
    stand-in fails otherwise); nvbandwidth keeps running until all 8 have seen it."""
    monkeypatch.setenv("STANDIN_AWAIT", "nvbandwidth")
    monkeypatch.setenv("STANDIN_HOLD", "nvbandwidth:saw nvbandwidth running=8")
    found = _active(_run(tmp_path, _tools()))
    nics = {k: r for k, r in found.items() if k[0] == "nic-bandwidth"}
    assert len(nics) == 8
    assert {r.outcome for r in nics.values()} == {"Passed"}, nics
    saw = [e for e in (standin / "events").read_text().splitlines() if e.startswith("saw ")]
    assert len(saw) == 8


def test_the_loopback_client_retries_a_refused_connect(
    tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """perftest's client connects once; a server that listens late refuses the first tries
    (the stand-in server listens only once its client was refused: no race with a delay)."""
    monkeypatch.setenv("STANDIN_LATE_SERVER", "refused")
    found = _active(_run(tmp_path, _tools()))
    nics = [r for k, r in found.items() if k[0] == "nic-bandwidth"]
    assert {r.outcome for r in nics} == {"Passed"}, nics
    refused = [e for e in (standin / "events").read_text().splitlines() if e.startswith("refused")]
    assert refused  # at least one client was refused first, then connected on a retry


def test_a_node_without_the_tools_is_not_verified(tmp_path: Path, standin: Path) -> None:
    empty = tmp_path / "no-tools"
    empty.mkdir()
    results = _run(tmp_path, Tools(path=str(empty)))
    found = _active(results)
    assert {r.outcome for r in found.values()} == {"NotRun"}
    assert found[("nccl-allreduce", "node")].reason == "all_reduce_perf is not installed"
    passed, why = run_passed(results, EXPECT)
    assert not passed
    assert why.startswith("required probes did not run: ")


def test_active_probes_turned_off_are_skipped_and_not_required(tmp_path: Path) -> None:
    results = _run(tmp_path, Tools(run_bandwidth=False))
    found = _active(results)
    assert {r.outcome for r in found.values()} == {"Skipped"}
    assert all("turned off" in (r.reason or "") for r in found.values())
    passed, why = run_passed(results, EXPECT)
    assert passed, why


def test_a_busy_node_keeps_its_last_measurements_instead_of_running_the_tools(
    tmp_path: Path, standin: Path
) -> None:
    b, hgx = _node(tmp_path)
    d = discover_at(b.root, h100_snapshot(hgx.gpus))
    assert d.interfaces is not None
    assert d.accelerators is not None
    tree = SysfsTree(b.root)
    try:
        first = run_once(tree, d.interfaces, d.accelerators, d.nvml, "fp", tools=_tools())
        assert first.passed, first.reason
        (standin / "calls").unlink()
        busy = "node busy: 2 claims prepared"
        again = run_once(
            tree,
            d.interfaces,
            d.accelerators,
            d.nvml,
            "fp",
            tools=_tools(),
            busy=busy,
            previous=first,
        )
        fresh = run_once(
            tree, d.interfaces, d.accelerators, d.nvml, "other", tools=_tools(), busy=busy
        )
    finally:
        tree.close()
    assert not (standin / "calls").exists()  # no tool ran on the busy node
    assert again.passed, again.reason
    kept = _active(again.probes)[("nccl-allreduce", "node")]
    assert kept.measured == "480.52 GB/s bus bandwidth at 16GB"
    assert kept.reason == f"from the run at {first.time.isoformat()} ({busy})"
    # on other hardware (a new fingerprint) nothing is carried: not run, so not verified
    assert not fresh.passed
    assert {r.reason for r in _active(fresh.probes).values()} == {busy}


# --- the formats, from the upstream documentation -----------------------------------------

NVBANDWIDTH_README = """\
Running host_to_device_memcpy_ce.
memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)
          0         1
0      6.20     12.36

Running device_to_device_memcpy_read_ce.
memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)
          0         1
0       N/A    388.50
1    390.00       N/A

SUM device_to_device_memcpy_read_ce 778.50
"""


def test_parsers_read_the_documented_formats() -> None:
    m = parse_nvbandwidth(NVBANDWIDTH_README)
    assert m["host_to_device_memcpy_ce"] == {(0, 0): 6.2, (0, 1): 12.36}
    assert m["device_to_device_memcpy_read_ce"] == {(0, 1): 388.5, (1, 0): 390.0}
    perftest = (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        " 65536      5000             391.84             391.71 \t\t   0.747139\n"
    )
    assert parse_ib_write_bw(perftest) == 391.71
    assert parse_ib_write_bw("Couldn't connect to localhost:18515\n") is None
    nccl = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 402.11 \n#\n"
    assert parse_all_reduce(nccl) == 402.11
    assert parse_all_reduce("# nThread 1 nGpus 8\n") is None


def test_the_run_output_is_split_by_marker_lines() -> None:
    text = (
        "=== fabricdra-probe p0 rc=0\nRunning x.\n"
        "=== fabricdra-probe p1 rc=skip\n"
        "=== fabricdra-probe p2 rc=none\n"
        "=== fabricdra-probes done\n"
    )
    got = parse_run(text)
    assert got["p0"].rc == 0
    assert got["p0"].output == "Running x.\n"
    assert got["p1"].skipped
    assert got["p1"].rc is None
    assert got["p2"].rc is None
    assert not got["p2"].skipped


def test_a_run_that_never_answered_leaves_the_active_probes_not_run(tmp_path: Path) -> None:
    class Broken:
        def run(self, script: str, timeout: float) -> str:
            raise RuntimeError("pod fabricdra-verify-x: ImagePullBackOff")

    found = _active(_run(tmp_path, Tools(executor=Broken())))
    assert {r.outcome for r in found.values()} == {"NotRun"}
    assert {r.reason for r in found.values()} == {
        "the verification run failed: pod fabricdra-verify-x: ImagePullBackOff"
    }


def _unused() -> VerificationRun:  # keeps the import used for type checkers
    return VerificationRun(datetime.now(UTC), "fp", [], True, "")
