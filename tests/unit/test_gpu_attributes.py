"""GPU attributes users of NVIDIA's DRA driver select on, MIG compute capacities, the health
attribute of the basic model, and EFA endpoints (never plain RDMA): ResourceSlices built from
real discovery over kernel-shaped sysfs trees and recorded NVML answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceConfig, GpuHealth, gpu_info, semver
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.resourceslices import ApiFeatures, build_slices
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import H100_IDENTITY, h100_snapshot, hgx_h100, rdma_node, write_json

IDENTITY = {
    "driverVersion": "550.54.15",
    "cudaDriverVersion": 12040,
    "cudaComputeCapability": "9.0",
    "architecture": "Hopper",
    "brand": "Nvidia",
}
ENGINES = {
    "multiprocessors": 60,
    "copyEngines": 3,
    "decoders": 3,
    "encoders": 0,
    "jpegEngines": 3,
    "ofaEngines": 0,
}


def _slices(tmp_path: Path, model: str = "current", **snap_extra: Any) -> dict[str, Any]:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    snap = h100_snapshot(hgx.gpus, mig_gpu=1)
    for entry in snap.values():
        entry.update(IDENTITY, **snap_extra)
        for mig in entry.get("migDevices", []):
            mig.update(ENGINES)
    readings = load_snapshot(write_json(tmp_path / "nvml.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    health = {hgx.gpus[2]: GpuHealth(False, "uncorrectable ECC errors: 1")}
    inventory = build_devices(
        d.interfaces or [], d.accelerators or [], gpu_health=health, gpu_info=gpu_info(d.nvml)
    )
    plan = build_slices(inventory, "n", features=ApiFeatures(model))  # type: ignore[arg-type]
    return {x["name"]: x for s in plan.slices for x in s["spec"].get("devices", [])}


def test_gpus_carry_nvidias_attribute_names_and_types(tmp_path: Path) -> None:
    devs = _slices(tmp_path)
    gpu = devs["gpu-0000-18-00-0"]["attributes"]
    assert gpu["driverVersion"] == {"version": "550.54.15"}
    assert gpu["cudaDriverVersion"] == {"version": "12.4.0"}
    assert gpu["cudaComputeCapability"] == {"version": "9.0.0"}
    assert gpu["architecture"] == {"string": "Hopper"}
    assert gpu["brand"] == {"string": "Nvidia"}
    mig = devs["mig-0000-3a-00-0-gi1-ci0"]
    assert mig["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    # a MIG instance's compute capacities beside its memory
    assert mig["capacity"] == {
        "memory": {"value": "40192Mi"},
        **{k: {"value": str(v)} for k, v in ENGINES.items()},
    }


def test_facts_nvml_did_not_give_are_absent(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    snap = h100_snapshot(hgx.gpus)
    for entry in snap.values():  # a driver that answers none of the identity calls
        for key in H100_IDENTITY:
            entry.pop(key)
    readings = load_snapshot(write_json(tmp_path / "nvml.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    inventory = build_devices(d.interfaces or [], d.accelerators or [], gpu_info=gpu_info(d.nvml))
    devs = {x["name"]: x for s in build_slices(inventory, "n").slices for x in s["spec"]["devices"]}
    attrs = devs["gpu-0000-18-00-0"]["attributes"]
    assert not {*H100_IDENTITY, "cudaComputeCapability"} & set(attrs)


def test_addressing_mode_is_published_as_nvml_reports_it(tmp_path: Path) -> None:
    """Issue 32 point 7: NVIDIA's `addressingMode`, from nvmlDeviceGetAddressingMode, on
    whole GPUs and MIG instances alike; absent where NVML did not answer."""
    devs = _slices(tmp_path / "hmm")
    assert devs["gpu-0000-18-00-0"]["attributes"]["addressingMode"] == {"string": "HMM"}
    assert devs["mig-0000-3a-00-0-gi1-ci0"]["attributes"]["addressingMode"] == {"string": "HMM"}
    ats = _slices(tmp_path / "ats", addressingMode="ATS")
    assert ats["gpu-0000-18-00-0"]["attributes"]["addressingMode"] == {"string": "ATS"}
    none = _slices(tmp_path / "none", addressingMode=None)
    assert "addressingMode" not in none["gpu-0000-18-00-0"]["attributes"]


def test_the_recorded_h100_answers_what_users_select_on(tmp_path: Path) -> None:
    """Issue 32 point 7: the snapshot every test and the harness's installed node use records
    the identity NVML reports, so selectors on it are proven wherever it is replayed."""
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    readings = load_snapshot(write_json(tmp_path / "nvml.json", h100_snapshot(hgx.gpus)))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    inventory = build_devices(d.interfaces or [], d.accelerators or [], gpu_info=gpu_info(d.nvml))
    devs = {x["name"]: x for s in build_slices(inventory, "n").slices for x in s["spec"]["devices"]}
    attrs = devs["gpu-0000-18-00-0"]["attributes"]
    assert attrs["driverVersion"] == {"version": "550.54.15"}
    assert attrs["cudaDriverVersion"] == {"version": "12.4.0"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["architecture"] == {"string": "Hopper"}
    assert attrs["brand"] == {"string": "Nvidia"}
    assert attrs["addressingMode"] == {"string": "HMM"}


def test_versions_are_semver() -> None:
    assert semver("9.0") == "9.0.0"
    assert semver("535.104.05") == "535.104.5"
    assert semver("550.54.15") == "550.54.15"
    assert semver("r550") is None
    assert semver(None) is None


def test_the_basic_model_publishes_health_as_an_attribute(tmp_path: Path) -> None:
    basic = _slices(tmp_path / "b", "basic")
    assert basic["gpu-0000-4b-00-0"]["attributes"]["health"] == {"string": "Unhealthy"}
    assert basic["gpu-0000-18-00-0"]["attributes"]["health"] == {"string": "Unknown"}
    assert "taints" not in basic["gpu-0000-4b-00-0"]
    current = _slices(tmp_path / "c", "current")
    assert "health" not in current["gpu-0000-4b-00-0"]["attributes"]  # the taint says it
    assert current["gpu-0000-4b-00-0"]["taints"][0]["key"] == "fabricdra.io/unhealthy"


def test_efa_endpoints_are_never_offered_as_rdma(tmp_path: Path) -> None:
    # An RDMA endpoint bound to `efa` is the efa kind's (tests/unit/test_efa.py), found from
    # sysfs by its PCI ids: with or without --efa the RDMA kind leaves it alone.
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [None], gpu=False)
    rp = b.bridge(b.root_bus("pci0000:40"), "0000:40:01.0")
    efa = b.nic(rp, "0000:41:00.0", "efa0", driver="efa")
    b.rdma(efa, "rdmap64s0")
    d = discover(SysfsTree(str(b.root)))
    default = build_devices(d.interfaces or [], d.accelerators or [])
    assert [x.name for x in default if x.type == "rdma"] == []
    enabled = build_devices(d.interfaces or [], d.accelerators or [], DeviceConfig(efa=True))
    assert [x.name for x in enabled if x.type == "rdma"] == []
