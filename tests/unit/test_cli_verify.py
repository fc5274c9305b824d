"""`fabricdra verify` as a user runs it, over kernel-shaped sysfs trees: its exit status, its
stdout and its stderr. The first test runs it as a real process (`python -m fabricdra.cli`);
the others call the same entry point in this process (`fabricdra.cli.main`, which the process
runs), as each process start costs the unit tier about half a second."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from fabricdra.cli import main
from tests.sysfs.builder import PcieLink, SysfsBuilder
from tests.sysfs.nodes import dgx_h100, h100_snapshot, hgx_h100, write_json


def fabricdra_process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabricdra.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def fabricdra(*args: str) -> subprocess.CompletedProcess[str]:
    """What `fabricdra_process` returns, from `main` called here (argparse's exits too)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["fabricdra", *args], code, out.getvalue(), err.getvalue())


def test_the_sample_node_passes_only_with_its_tools_or_the_active_probes_turned_off() -> None:
    # Without the tools the classes' required bandwidth probes cannot run: not passed (the
    # whole process: its exit status is what a script sees).
    done = fabricdra_process("verify", "--sample")
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("NOT PASSED: required probes did not run: ")
    assert "nvbandwidth is not installed" in done.stdout
    done = fabricdra("verify", "--sample", "--no-bandwidth")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("PASSED: 37 probes passed")
    # What did not run is still listed: turned-off tools are Skipped, never Passed.
    assert "gpu-bandwidth   node" in done.stdout
    assert "active probes turned off" in done.stdout


def test_a_degraded_node_exits_1_with_a_table_of_what_failed(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    b.write(f"bus/pci/devices/{hgx.gpus[1]}/current_link_width", "4")
    snap = write_json(tmp_path / "nvml.json", h100_snapshot(hgx.gpus))
    args = ("--sysfs-root", str(b.root), "--nvml-snapshot", str(snap), "--no-bandwidth")
    done = fabricdra("verify", *args)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0] == f"NOT PASSED: failed: pcie-link on {hgx.gpus[1]}"
    assert lines[1].split() == [
        "PROBE", "DEVICE", "CLASS", "OUTCOME", "MEASURED", "EXPECTED", "REASON"
    ]  # fmt: skip
    assert any(
        line.startswith("pcie-link") and hgx.gpus[1] in line and "Failed" in line for line in lines
    )
    # `inventory` on the same readable node stays exit 0: verify is the command that fails.
    assert fabricdra("inventory", *args[:-1]).returncode == 0

    doc = json.loads(fabricdra("verify", *args, "-o", "json").stdout)
    assert doc["passed"] is False
    failed = [p for p in doc["probes"] if p["outcome"] == "Failed"]
    assert failed == [
        {
            "probe": "pcie-link",
            "device": hgx.gpus[1],
            "deviceClass": "h100-80gb-sxm",
            "outcome": "Failed",
            "measured": "x4 32.0 GT/s PCIe (max x16 32.0 GT/s PCIe)",
            "expected": "width = max_link_width and at least x16 32 GT/s",
            "reason": "trained at x4 of x16; x4 is below x16",
        }
    ]


def test_override_needs_a_reason() -> None:
    done = fabricdra("verify", "--override", "node-1")
    assert done.returncode == 2
    assert "--override needs --reason" in done.stderr


def test_an_override_lasts_a_stated_positive_time() -> None:
    for bad in ("0d", "forever", "7"):
        done = fabricdra("verify", "--override", "node-1", "--reason", "x", "--expires-in", bad)
        assert done.returncode == 2, bad
        assert "--expires-in" in done.stderr
    done = fabricdra("verify", "--fingerprint", "abc")
    assert done.returncode == 2
    assert "--fingerprint goes with --override" in done.stderr


# --- issue 18: the hardware the system model promises ----------------------------------------


def _dgx_args(tmp_path: Path, **kw: Any) -> tuple[SysfsBuilder, tuple[str, ...]]:
    b = SysfsBuilder(tmp_path / "sys")
    dgx = dgx_h100(b, **kw)
    snap = write_json(tmp_path / "nvml.json", h100_snapshot(dgx.gpus))
    return b, ("--sysfs-root", str(b.root), "--nvml-snapshot", str(snap), "--no-bandwidth")


def test_a_whole_dgx_h100_passes(tmp_path: Path) -> None:
    _, args = _dgx_args(tmp_path)
    done = fabricdra("verify", *args)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_dgx_h100_that_lost_a_gpu_does_not_pass(tmp_path: Path) -> None:
    _, args = _dgx_args(tmp_path, missing_gpus=(7,))
    done = fabricdra("verify", *args)
    assert done.returncode == 1
    assert "7 of 8 GPUs (H100 SXM)" in done.stdout


def test_a_dgx_h100_whose_compute_hca_trained_at_200_does_not_pass(tmp_path: Path) -> None:
    _, args = _dgx_args(tmp_path, rates={6: "200 Gb/sec (2X NDR)"})
    done = fabricdra("verify", *args)
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == "NOT PASSED: failed: rdma-port on mlx5_6"


def test_an_x4_gen1_switch_uplink_does_not_pass(tmp_path: Path) -> None:
    b, args = _dgx_args(tmp_path)
    b.pcie_link("devices/pci0000:b9/0000:b9:01.0", PcieLink(width=4, speed="2.5 GT/s PCIe"))
    done = fabricdra("verify", *args)
    assert done.returncode == 1
    assert "uplink 0000:b9:01.0 trained at x4 of x16" in done.stdout


def test_error_counts_from_before_the_run_do_not_fail_it(tmp_path: Path) -> None:
    # Cumulative since the driver loaded: a reseat's link_downed and symbol errors stay.
    _, args = _dgx_args(tmp_path, counters={1: (("symbol_error", 500), ("link_downed", 2))})
    done = fabricdra("verify", *args)
    assert done.returncode == 0, done.stdout


def test_expect_holds_an_unknown_model_to_the_operators_profile(tmp_path: Path) -> None:
    _, args = _dgx_args(tmp_path, product="Custom H100 box", board=None)
    unknown = fabricdra("verify", *args, "--all")
    assert unknown.returncode == 0
    assert "no system profile for DMI model 'Custom H100 box'" in unknown.stdout
    profile = tmp_path / "expect.yaml"
    profile.write_text("name: box\ngpus: {count: 10, deviceClass: h100-80gb-sxm}\n")
    done = fabricdra("verify", *args, "--expect", str(profile))
    assert done.returncode == 1
    assert "8 of 10 GPUs" in done.stdout
    bad = fabricdra("verify", *args, "--expect", str(tmp_path / "absent.yaml"))
    assert bad.returncode == 2


def test_node_excludes_override() -> None:
    done = fabricdra("verify", "--node", "n1", "--override", "n1", "--reason", "x")
    assert done.returncode == 2
    assert "exclude each other" in done.stderr
