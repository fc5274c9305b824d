"""`fabricdra verify` as a user runs it: a real process over kernel-shaped sysfs trees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import h100_snapshot, hgx_h100, write_json


def fabricdra(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabricdra.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_sample_node_passes_and_inventory_is_unaffected() -> None:
    done = fabricdra("verify", "--sample")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("PASSED: 37 probes passed")
    # What did not pass is still listed: absent tools are NotRun, never Passed.
    assert "gpu-bandwidth  node" in done.stdout
    assert "nvbandwidth is not installed" in done.stdout


def test_a_degraded_node_exits_1_with_a_table_of_what_failed(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    b.write(f"bus/pci/devices/{hgx.gpus[1]}/current_link_width", "4")
    snap = write_json(tmp_path / "nvml.json", h100_snapshot(hgx.gpus))
    args = ("--sysfs-root", str(b.root), "--nvml-snapshot", str(snap))
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
    assert fabricdra("inventory", *args).returncode == 0

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
