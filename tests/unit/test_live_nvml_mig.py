"""The live NVML discovery path (discovery/nvml/live.py) on a MIG-mode GPU, through the real
pynvml, against the C stand-in NVML (tests/nvmlfake/libnvml_mig.c, loaded as libnvidia-ml.so.1
the way pynvml loads NVML) holding the H100's placement rules: what the agent publishes with
`--dynamic-mig` and no `--nvml-snapshot` (the chart's path on a GPU node).

An instance an administrator made before the agent started (seeded in the stand-in's state)
is read through NVML's MIG device handles (name, memory, ids, placement) and adopted under its
static name; the placements it overlaps and the whole GPU are not offered. Each scenario runs
in a child process (LD_LIBRARY_PATH is read when the process starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.nvmlfake import standin
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import rdma_node

BUS = "0000:20:00.0"  # rdma_node's GPU
STEM = "0000-20-00-0"

READ = """
import json, sys
from fabricdra.kubeletplugin.devices import DeviceConfig, gpu_info
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml.live import read_live
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.resourceslices import ApiFeatures, build_slices
from fabricdra.kubeletplugin.verification.probes import Tools, run_probes
from fabricdra.api.verification import load_expectations
readings = read_live()
d = discover(SysfsTree(sys.argv[1]), nvml_source=lambda: readings)
inv = build_devices(
    d.interfaces or [], d.accelerators or [], DeviceConfig(dynamic_mig=True),
    gpu_info=gpu_info(readings),
)
plan = build_slices(inv, "node-a", features=ApiFeatures("current"))
devices = {
    dev["name"]: {
        "attributes": {k: next(iter(v.values())) for k, v in dev["attributes"].items()},
        "consumes": [c["counterSet"] for c in dev.get("consumesCounters", [])],
    }
    for s in plan.slices
    for dev in s["spec"].get("devices", [])
}
probes = run_probes(
    SysfsTree(sys.argv[1]), d.interfaces or [], d.accelerators or [], readings,
    load_expectations(), Tools(run_bandwidth=False),
)
print(json.dumps({
    "errors": readings.errors,
    "gpus": sorted(readings.gpus),
    "nvlinks": {b: [link.active for link in g.nvlinks or []] for b, g in readings.gpus.items()},
    "probes": {p.probe: p.outcome for p in probes},
    "devices": devices,
}))
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return standin.build(tmp_path_factory.mktemp("nvml"), "h100", bus=f"0000{BUS}")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    b = SysfsBuilder(tmp_path / "sys")
    node = rdma_node(b, [], gpu=True)
    assert node.gpus == [BUS]
    return tmp_path / "sys"


def published(lib: Path, state: Path, sysfs: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(READ), str(sysfs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LD_LIBRARY_PATH": str(lib), "FAKE_NVML_STATE": str(state)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_mig_gpu_without_instances_is_offered_whole_and_as_every_placement(
    lib: Path, sysfs: Path, tmp_path: Path
) -> None:
    out = published(lib, tmp_path / "gpu", sysfs)
    assert out["errors"] == {}
    assert out["gpus"] == [BUS]
    # An H100 SXM's 18 NVLink links, read one by one: the nvlink probe its class requires
    # passes, so the node verifies with the active probes off (as on the harness).
    assert out["nvlinks"] == {BUS: [True] * 18}
    assert out["probes"]["nvlink"] == "Passed"
    assert out["probes"]["pcie-link"] == "Passed"
    devices = out["devices"]
    assert f"gpu-{STEM}" in devices
    # nvmlDeviceGetAddressingMode through pynvml's versioned structure (issue 32 point 7).
    assert devices[f"gpu-{STEM}"]["attributes"]["addressingMode"] == "HMM"
    placements = sorted(n for n in devices if n.startswith(f"mig-{STEM}-"))
    # H100 80GB: 7 + 4 + 3 + 2 + 1 + 1 placements (+me profiles not offered)
    assert len(placements) == 18, placements
    assert devices[f"mig-{STEM}-3g-40gb-m4"]["attributes"]["migPlacementStart"] == 4
    assert all(devices[n]["consumes"] == [f"gpu-{STEM}"] for n in placements)


def test_static_instance_is_read_through_nvml_and_adopted(
    lib: Path, sysfs: Path, tmp_path: Path
) -> None:
    """Before the stand-in answered a MIG device handle's name and memory, NVML's error took
    the whole GPU out of the readings (`errors`): nothing of it was offered."""
    state = tmp_path / "gpu"
    standin.seed(state, "h100", [("2g.20gb", 0)])
    out = published(lib, state, sysfs)
    assert out["errors"] == {}
    devices = out["devices"]
    adopted = devices[f"mig-{STEM}-gi1-ci0"]
    assert adopted["attributes"]["migProfile"] == "2g.20gb"
    assert adopted["attributes"]["productName"] == "NVIDIA H100 80GB HBM3 MIG 2g.20gb"
    assert adopted["consumes"] == [f"gpu-{STEM}"]
    assert f"gpu-{STEM}" not in devices  # the whole GPU no longer fits
    # the placements over memory slices 0-1 are not offered; those beside it are
    assert f"mig-{STEM}-3g-40gb-m0" not in devices
    assert f"mig-{STEM}-1g-10gb-m1" not in devices
    assert f"mig-{STEM}-3g-40gb-m4" in devices
    assert f"mig-{STEM}-2g-20gb-m2" in devices
    # nothing was created or destroyed by reading
    assert standin.instances(state, "h100") == [standin.GpuInstance(1, "2g.20gb", 0, 0)]
