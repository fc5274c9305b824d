"""The `nvlinkGroup` attribute: which GPUs of a node reach each other over NVLink, from NVML's
recorded answers about each link's far end (NVSwitch baseboards, bridged PCIe pairs, none)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import gpu_info
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvlink import nvlink_groups
from fabricdra.kubeletplugin.discovery.nvml import dump_snapshot, load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.resourceslices import build_slices
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import (
    HGX_NVSWITCHES,
    h100_snapshot,
    hgx_h100,
    nvlink_bridges,
    write_json,
)


def _hgx(tmp_path: Path) -> tuple[SysfsBuilder, list[str]]:
    b = SysfsBuilder(tmp_path / "sys")
    return b, hgx_h100(b).gpus


def _groups(tmp_path: Path, snap: dict[str, Any]) -> dict[str, str]:
    return nvlink_groups(load_snapshot(write_json(tmp_path / "nvml.json", snap)))


def _published(tmp_path: Path, b: SysfsBuilder, snap: dict[str, Any]) -> dict[str, Any]:
    readings = load_snapshot(write_json(tmp_path / "nvml.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    inventory = build_devices(d.interfaces or [], d.accelerators or [], gpu_info=gpu_info(d.nvml))
    return {
        x["name"]: x["attributes"]
        for s in build_slices(inventory, "n").slices
        for x in s["spec"].get("devices", [])
    }


def test_an_nvswitch_baseboard_is_one_group(tmp_path: Path) -> None:
    _, gpus = _hgx(tmp_path)
    groups = _groups(tmp_path, h100_snapshot(gpus))
    assert groups == dict.fromkeys(gpus, min(gpus))


def test_bridged_pairs_are_groups_of_two_and_unlinked_gpus_have_none(tmp_path: Path) -> None:
    _, gpus = _hgx(tmp_path)
    snap = nvlink_bridges(h100_snapshot(gpus), [(gpus[1], gpus[3]), (gpus[2], gpus[4])])
    groups = _groups(tmp_path, snap)
    assert groups == {
        gpus[1]: gpus[1],
        gpus[3]: gpus[1],
        gpus[2]: gpus[2],
        gpus[4]: gpus[2],
    }


def test_only_measured_active_links_join(tmp_path: Path) -> None:
    _, gpus = _hgx(tmp_path)
    snap = nvlink_bridges(h100_snapshot(gpus), [(gpus[0], gpus[1]), (gpus[2], gpus[3])])
    # Pair 0-1: every link down. Pair 2-3: the far end unnamed, zero, or of unknown type.
    for bus in gpus[:2]:
        for link in snap[bus]["nvlinks"]:
            link["active"] = False
    for bus in gpus[2:4]:
        links = snap[bus]["nvlinks"]
        del links[0]["remoteBusId"]
        links[1]["remoteBusId"] = "00000000:00:00.0"
        links[2]["remoteType"] = "unknown"
        del links[3]["remoteType"]
    # GPU 4 links to a GPU NVML does not report on this node; 5 and 6 to one switch, but
    # only 5's link is active.
    snap[gpus[4]]["nvlinks"] = [
        {"link": 0, "active": True, "remoteBusId": "0000:ee:00.0", "remoteType": "gpu"}
    ]
    snap[gpus[5]]["nvlinks"] = [
        {"link": 0, "active": True, "remoteBusId": HGX_NVSWITCHES[0], "remoteType": "switch"}
    ]
    snap[gpus[6]]["nvlinks"] = [
        {"link": 0, "active": False, "remoteBusId": HGX_NVSWITCHES[0], "remoteType": "switch"}
    ]
    assert _groups(tmp_path, snap) == {}


def test_a_switch_joins_gpus_whatever_form_nvml_gives_its_bus_id(tmp_path: Path) -> None:
    _, gpus = _hgx(tmp_path)
    snap = nvlink_bridges(h100_snapshot(gpus), [])
    for bus, remote in ((gpus[6], "00000000:05:00.0"), (gpus[7], "0000:05:00.0")):
        snap[bus]["nvlinks"] = [
            {"link": 0, "active": True, "remoteBusId": remote, "remoteType": "switch"}
        ]
    assert _groups(tmp_path, snap) == {gpus[6]: gpus[6], gpus[7]: gpus[6]}


def test_whole_gpus_publish_their_group_and_mig_instances_do_not(tmp_path: Path) -> None:
    b, gpus = _hgx(tmp_path)
    devs = _published(tmp_path, b, h100_snapshot(gpus, mig_gpu=1))
    whole = {n: a for n, a in devs.items() if a["type"]["string"] == "gpu"}
    assert len(whole) == 7
    assert all(a["nvlinkGroup"] == {"string": "0000:18:00.0"} for a in whole.values())
    migs = [a for a in devs.values() if a["type"]["string"] == "mig"]
    assert migs
    assert all("nvlinkGroup" not in a for a in migs)


def test_a_gpu_without_nvlink_publishes_no_group(tmp_path: Path) -> None:
    b, gpus = _hgx(tmp_path)
    devs = _published(tmp_path, b, nvlink_bridges(h100_snapshot(gpus), [(gpus[1], gpus[3])]))
    assert "nvlinkGroup" not in devs["gpu-0000-18-00-0"]
    assert devs["gpu-0000-3a-00-0"]["nvlinkGroup"] == {"string": gpus[1]}
    assert devs["gpu-0000-5c-00-0"]["nvlinkGroup"] == {"string": gpus[1]}


def test_the_far_end_survives_a_snapshot_round_trip(tmp_path: Path) -> None:
    _, gpus = _hgx(tmp_path)
    readings = load_snapshot(write_json(tmp_path / "nvml.json", h100_snapshot(gpus)))
    again = json.loads(dump_snapshot(readings))
    link = again[gpus[0]]["nvlinks"][17]
    assert (link["remoteBusId"], link["remoteType"]) == (HGX_NVSWITCHES[3], "switch")
