"""An Unhealthy device's taint says why (ECC, Xid 79, row remapping, link down), not only
`gpu`: from recorded NVML answers and kernel-shaped sysfs, through health, devices and the
slice builder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceInventory, GpuHealth, gpu_info
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.health import gpu_health
from fabricdra.kubeletplugin.resourceslices import TAINT_KEY, build_slices
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import h100_snapshot, hgx_h100, write_json

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def judged_inventory(
    tmp_path: Path,
    edit: dict[int, dict[str, Any]],
    *,
    mig_gpu: int | None = None,
    broken_nics: tuple[int, ...] = (),
    health: dict[int, GpuHealth] | None = None,
) -> DeviceInventory:
    """The HGX fixture's devices, judged as the agent judges them, from NVML answers edited
    per GPU index (`edit`) and health given outright (`health`)."""
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b, broken_nics=broken_nics)
    snap = h100_snapshot(hgx.gpus, mig_gpu=mig_gpu)
    for i, fields in edit.items():
        snap[hgx.gpus[i]].update(fields)
    readings = load_snapshot(write_json(tmp_path / "nvml.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    judged = gpu_health(d.nvml, None)
    judged.update({hgx.gpus[i]: h for i, h in (health or {}).items()})
    return build_devices(
        d.interfaces or [], d.accelerators or [], gpu_health=judged, gpu_info=gpu_info(d.nvml)
    )


def _taints(
    tmp_path: Path,
    edit: dict[int, dict[str, Any]],
    *,
    mig_gpu: int | None = None,
    broken_nics: tuple[int, ...] = (),
    health: dict[int, GpuHealth] | None = None,
) -> dict[str, str]:
    """Device name -> its unhealthy taint's value, for the devices that carry one."""
    inventory = judged_inventory(
        tmp_path, edit, mig_gpu=mig_gpu, broken_nics=broken_nics, health=health
    )
    out = {}
    for s in build_slices(inventory, "n").slices:
        for dev in s["spec"].get("devices", []):
            for t in dev.get("taints", []):
                if t["key"] == TAINT_KEY:
                    out[dev["name"]] = t["value"]
    return out


def test_each_gpu_fault_names_itself_in_the_taint(tmp_path: Path) -> None:
    taints = _taints(
        tmp_path,
        {
            0: {"eccUncorrectable": 2},
            1: {"xidErrors": [79]},
            2: {"rowRemapFailure": True},
            3: {"rowRemapPending": True},
            4: {"eccUncorrectable": 1, "xidErrors": [79, 48, 13]},  # 13: the application's
        },
    )
    assert taints == {
        "gpu-0000-18-00-0": "gpu-ecc",
        "gpu-0000-3a-00-0": "gpu-xid-79",
        "gpu-0000-4b-00-0": "gpu-row-remap-failed",
        "gpu-0000-5c-00-0": "gpu-row-remap-pending",
        "gpu-0000-9a-00-0": "gpu-ecc.xid-48.xid-79",
    }


def test_a_down_link_names_itself_in_the_taint(tmp_path: Path) -> None:
    assert _taints(tmp_path, {}, broken_nics=(3,)) == {"rdma-0000-5d-00-0": "rdma-link-down"}


def test_mig_instances_carry_their_gpus_cause(tmp_path: Path) -> None:
    taints = _taints(tmp_path, {1: {"xidErrors": [79]}}, mig_gpu=1)
    assert taints == {
        "mig-0000-3a-00-0-gi1-ci0": "gpu-xid-79",
        "mig-0000-3a-00-0-gi2-ci0": "gpu-xid-79",
    }


def test_many_causes_stop_at_a_whole_cause_within_a_label_value(tmp_path: Path) -> None:
    storm = list(range(60, 80))  # twenty critical Xids
    (value,) = _taints(tmp_path, {0: {"eccUncorrectable": 1, "xidErrors": storm}}).values()
    assert len(value) <= 63
    assert LABEL_VALUE.match(value)
    assert value.startswith("gpu-ecc.xid-60.xid-61.")
    assert value.split(".")[-1] in {f"xid-{x}" for x in storm}  # never half a cause


def test_a_fault_without_a_known_cause_keeps_the_plain_value(tmp_path: Path) -> None:
    taints = _taints(tmp_path, {}, health={0: GpuHealth(False, "something")})
    assert taints == {"gpu-0000-18-00-0": "gpu"}
