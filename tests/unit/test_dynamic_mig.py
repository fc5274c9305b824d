"""Dynamic MIG (issue 20 point 2): the H100/H200 profile table, the devices and counters
published for a MIG-mode GPU, and what the flag being off or the API being 1.34/1.35 leaves."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceConfig, gpu_info
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.kinds.nvidia import migprofiles
from fabricdra.kubeletplugin.resourceslices import ApiFeatures, build_slices
from tests.nvmlfake.mig import FakeMigGpu
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import h100_snapshot, hgx_h100, write_json

NODE = "node-a"
MIG_BUS = "0000:1b:00.0"  # set below from the fixture


def _slices(
    tmp_path: Path,
    *,
    dynamic: bool,
    instances: list[tuple[int, int]] | None = None,
    model: str = "current",
    name: str | None = None,
    created: int = 0,
) -> tuple[list[dict[str, Any]], str, list[str]]:
    """The HGX node with GPU 1 in MIG mode holding `instances` (GPU instance id, placement
    start) of 3g.40gb, the first `created` of them made by dynamic MIG for claims; its slices,
    the MIG GPU's bus id and the dropped device names."""
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    snap = h100_snapshot(hgx.gpus, mig_gpu=1)
    gpu = snap[hgx.gpus[1]]
    if name is not None:  # another model: an H100 NVL has 94 GB and its own layout
        gpu["name"], gpu["memoryTotalMiB"] = name, 95830
    gpu["migDevices"] = [
        {**m, "placementStart": start}
        for m, (_, start) in zip(gpu["migDevices"], instances or [], strict=False)
    ]
    readings = load_snapshot(write_json(tmp_path / "nvml.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    assert d.interfaces is not None
    assert d.accelerators is not None
    inv = build_devices(
        d.interfaces,
        d.accelerators,
        DeviceConfig(dynamic_mig=dynamic),
        gpu_info=gpu_info(readings),
        created_mig=[m["uuid"] for m in gpu["migDevices"][:created]],
    )
    plan = build_slices(inv, NODE, features=ApiFeatures(model))  # type: ignore[arg-type]
    return plan.slices, hgx.gpus[1], plan.dropped_dynamic_mig


def _devices(slices: list[dict[str, Any]], bus: str) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d
        for s in slices
        for d in s["spec"].get("devices", [])
        if d["attributes"].get("resource.kubernetes.io/pciBusID", {}).get("string") == bus
    }


def _counter_sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    return {
        cs["name"]: {k: int(v["value"]) for k, v in cs["counters"].items()}
        for s in slices
        for cs in s["spec"].get("sharedCounters", [])
    }


def _consumed(device: dict[str, Any]) -> dict[str, int]:
    (c,) = device["consumesCounters"]
    return {k: int(v["value"]) for k, v in c["counters"].items()}


def _fits(set_: dict[str, int], devices: list[dict[str, Any]]) -> bool:
    """The scheduler's counter arithmetic: the sum of what the devices consume stays within
    the set."""
    total: dict[str, int] = {}
    for d in devices:
        for k, v in _consumed(d).items():
            total[k] = total.get(k, 0) + v
    return all(v <= set_[k] for k, v in total.items())


# --- the table ---------------------------------------------------------------------------


def test_h100_table_is_nvidias_placements() -> None:
    # (profile, compute slices, memory slices, starts): NVIDIA's MIG user guide, H100 80GB.
    assert [(p.name, p.compute, p.size, p.starts) for p in migprofiles.H100_80GB.profiles] == [
        ("1g.10gb", 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.20gb", 1, 2, (0, 2, 4, 6)),
        ("2g.20gb", 2, 2, (0, 2, 4)),
        ("3g.40gb", 3, 4, (0, 4)),
        ("4g.40gb", 4, 4, (0,)),
        ("7g.80gb", 7, 8, (0,)),
    ]
    assert [p.name for p in migprofiles.H200_141GB.profiles] == [
        "1g.18gb",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ]


@pytest.mark.parametrize(
    ("fake", "model"),
    [
        (FakeMigGpu.h100_80gb, migprofiles.H100_80GB),
        (FakeMigGpu.h200_141gb, migprofiles.H200_141GB),
    ],
)
def test_table_agrees_with_the_fake_nvml_on_every_placement(
    fake: Any, model: migprofiles.Model
) -> None:
    """Every (profile, start) the fake accepts on an empty GPU is in the table, and nothing
    else is: the fake reads the GPU's own -lgipp answer, not the table."""
    fake = fake()
    accepted = {
        (name, start)
        for name in fake.profiles
        if not name.endswith("+me")
        for start in range(8)
        if fake.accepts(name, start)
    }
    table = {(p.profile.name, p.start) for p in model.placements()}
    assert accepted == table


def test_counter_math_matches_the_fake_for_every_pair() -> None:
    """Two placements fit together in the counters exactly when the fake creates both."""
    placements = migprofiles.H100_80GB.placements()
    for a, b in itertools.product(placements, repeat=2):
        fake = FakeMigGpu.h100_80gb()
        fake.create(a.profile.name, a.start)
        assert migprofiles.fits([a, b]) == fake.accepts(b.profile.name, b.start), (a, b)


def test_model_for() -> None:
    assert migprofiles.model_for("NVIDIA H100 80GB HBM3", 81559) is migprofiles.H100_80GB
    assert migprofiles.model_for("NVIDIA H200", 143771) is migprofiles.H200_141GB
    assert migprofiles.model_for("NVIDIA H100 NVL", 95830) is None  # other layout: static
    assert migprofiles.model_for("NVIDIA A100-SXM4-80GB", 81920) is None


# --- published devices and counters --------------------------------------------------------


def test_every_placement_is_published_consuming_exactly_its_slices(tmp_path: Path) -> None:
    slices, bus, _ = _slices(tmp_path, dynamic=True)
    devices = _devices(slices, bus)
    gpu = "gpu-" + bus.replace(":", "-").replace(".", "-")
    assert _counter_sets(slices) == {
        gpu: {**{f"memory-slice-{i}": 1 for i in range(8)}, "compute-slices": 7}
    }
    placements = migprofiles.H100_80GB.placements()
    names = {f"mig-{gpu[4:]}-{p.profile.name.replace('.', '-')}-m{p.start}" for p in placements}
    assert set(devices) == names | {gpu}
    for p in placements:
        d = devices[f"mig-{gpu[4:]}-{p.profile.name.replace('.', '-')}-m{p.start}"]
        assert d["consumesCounters"][0]["counterSet"] == gpu
        want = {f"memory-slice-{i}": 1 for i in range(p.start, p.start + p.profile.size)}
        assert _consumed(d) == {**want, "compute-slices": p.profile.compute}
        assert d["attributes"]["migProfile"] == {"string": p.profile.name}
        assert d["attributes"]["migPlacementStart"] == {"int": p.start}
        assert d["attributes"]["type"] == {"string": "mig"}
    assert _consumed(devices[gpu]) == _counter_sets(slices)[gpu]


def test_counter_set_is_in_its_own_slice(tmp_path: Path) -> None:
    slices, _, _ = _slices(tmp_path, dynamic=True)
    counters = [s for s in slices if "sharedCounters" in s["spec"]]
    assert len(counters) == 1
    assert "devices" not in counters[0]["spec"]
    assert all(s["spec"]["pool"]["resourceSliceCount"] == len(slices) for s in slices)


def test_overlapping_placements_cannot_both_fit(tmp_path: Path) -> None:
    slices, bus, _ = _slices(tmp_path, dynamic=True)
    set_ = next(iter(_counter_sets(slices).values()))
    devices = [d for d in _devices(slices, bus).values() if "migPlacementStart" in d["attributes"]]
    for a, b in itertools.combinations(devices, 2):
        sa, sb = (d["attributes"]["migPlacementStart"]["int"] for d in (a, b))
        pa = migprofiles.Placement(
            migprofiles.H100_80GB.profile(a["attributes"]["migProfile"]["string"]),  # type: ignore[arg-type]
            sa,
        )
        pb = migprofiles.Placement(
            migprofiles.H100_80GB.profile(b["attributes"]["migProfile"]["string"]),  # type: ignore[arg-type]
            sb,
        )
        assert _fits(set_, [a, b]) == (not pa.overlaps(pb)), (a["name"], b["name"])


def test_3g_and_4g_fill_the_gpu_and_the_whole_gpu_fits_alone(tmp_path: Path) -> None:
    slices, bus, _ = _slices(tmp_path, dynamic=True)
    set_ = next(iter(_counter_sets(slices).values()))
    devices = _devices(slices, bus)
    g = bus.replace(":", "-").replace(".", "-")
    three, four = devices[f"mig-{g}-3g-40gb-m4"], devices[f"mig-{g}-4g-40gb-m0"]
    assert _fits(set_, [three, four])
    assert not any(
        _fits(set_, [three, four, d]) for n, d in devices.items() if n.startswith(f"mig-{g}-1g")
    )
    assert _fits(set_, [devices[f"gpu-{g}"]])
    assert not _fits(set_, [devices[f"gpu-{g}"], devices[f"mig-{g}-1g-10gb-m6"]])


def test_placements_are_ordered_from_the_top_slice_down(tmp_path: Path) -> None:
    """The allocator takes the first placement that fits: packing from the top leaves slice 0
    for 4g/7g, so a 3g.40gb claim takes m4."""
    slices, bus, _ = _slices(tmp_path, dynamic=True)
    order = [
        d["name"]
        for s in slices
        for d in s["spec"].get("devices", [])
        if d["attributes"].get("resource.kubernetes.io/pciBusID", {}).get("string") == bus
    ]
    threes = [n for n in order if "-3g-" in n]
    assert threes[0].endswith("-m4")


def test_existing_instances_are_adopted_and_block_their_slices(tmp_path: Path) -> None:
    slices, bus, _ = _slices(tmp_path, dynamic=True, instances=[(1, 4)])
    devices = _devices(slices, bus)
    g = bus.replace(":", "-").replace(".", "-")
    adopted = devices[f"mig-{g}-gi1-ci0"]  # its static name: claims keep resolving
    assert _consumed(adopted)["memory-slice-4"] == 1
    assert "uuid" in adopted["attributes"]
    assert f"gpu-{g}" not in devices  # the whole GPU cannot be had while an instance exists
    for d in devices.values():
        if d is not adopted:
            assert not {f"memory-slice-{i}" for i in range(4, 8)} & set(_consumed(d)), d["name"]
    assert f"mig-{g}-4g-40gb-m0" in devices


def test_placement_not_created_has_no_uuid_and_the_mig_class_of_its_profile(
    tmp_path: Path,
) -> None:
    """A placement is not the GPU: it carries no UUID until its instance exists (the GPU's is
    its `parentUuid`, as for an instance), the MIG class of its profile, the class the
    instance will have, never the whole GPU's (a selector on the GPU's UUID or class would
    otherwise match every placement too), and no NVLink group (an instance has no NVLink peer
    access). Found through the NVML stand-in in the cluster: the placements published the
    GPU's UUID, class and NVLink group."""
    slices, bus, _ = _slices(tmp_path, dynamic=True, instances=[(1, 4)])
    devices = _devices(slices, bus)
    g = bus.replace(":", "-").replace(".", "-")
    adopted = devices[f"mig-{g}-gi1-ci0"]["attributes"]
    placement = devices[f"mig-{g}-3g-40gb-m0"]["attributes"]
    assert "uuid" not in placement
    assert placement["parentUuid"] == {"string": adopted["parentUuid"]["string"]}
    assert placement["deviceClass"] == {"string": "h100-mig-3g-40gb"}
    assert "nvlinkGroup" not in placement
    assert adopted["deviceClass"] == placement["deviceClass"]  # the same profile's class
    assert devices[f"mig-{g}-1g-10gb-m0"]["attributes"]["deviceClass"] == {
        "string": "h100-mig-1g-10gb"
    }
    whole = _devices(_slices(tmp_path / "w", dynamic=True)[0], bus)[f"gpu-{g}"]["attributes"]
    assert whole["uuid"] == adopted["parentUuid"]
    assert whole["deviceClass"] == {"string": "h100-80gb-sxm"}
    assert "parentUuid" not in whole


def test_instance_dynamic_mig_created_keeps_its_placement_name(tmp_path: Path) -> None:
    """The instance prepare created for a claim is still the device the claim was allocated
    (`-3g-40gb-m4`), not re-adopted under a static name; it blocks its slices the same way."""
    slices, bus, _ = _slices(tmp_path, dynamic=True, instances=[(1, 4)], created=1)
    devices = _devices(slices, bus)
    g = bus.replace(":", "-").replace(".", "-")
    assert f"mig-{g}-gi1-ci0" not in devices
    mine = devices[f"mig-{g}-3g-40gb-m4"]
    assert "uuid" in mine["attributes"]
    assert _consumed(mine)["memory-slice-4"] == 1
    assert f"gpu-{g}" not in devices
    assert f"mig-{g}-4g-40gb-m0" in devices


def test_instance_without_a_known_placement_keeps_the_gpu_static(tmp_path: Path) -> None:
    # h100_snapshot's two 3g.40gb instances, without placementStart: static MIG as before
    b = SysfsBuilder(tmp_path / "s2")
    hgx = hgx_h100(b)
    snap = h100_snapshot(hgx.gpus, mig_gpu=1)
    readings = load_snapshot(write_json(tmp_path / "n2.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    assert d.interfaces is not None
    assert d.accelerators is not None
    on = build_devices(
        d.interfaces, d.accelerators, DeviceConfig(dynamic_mig=True), gpu_info=gpu_info(readings)
    )
    off = build_devices(d.interfaces, d.accelerators, gpu_info=gpu_info(readings))
    assert build_slices(on, NODE).slices == build_slices(off, NODE).slices


def test_unknown_model_stays_static(tmp_path: Path) -> None:
    on, _bus, _ = _slices(tmp_path / "a", dynamic=True, name="NVIDIA H100 NVL")
    off, _, _ = _slices(tmp_path / "b", dynamic=False, name="NVIDIA H100 NVL")
    assert on == off
    assert not _counter_sets(on)


def test_flag_off_publishes_no_counters(tmp_path: Path) -> None:
    slices, bus, _ = _slices(tmp_path, dynamic=False)
    assert not _counter_sets(slices)
    assert _devices(slices, bus) == {}  # MIG on, no instances: nothing, as before


@pytest.mark.parametrize("instances", [[], [(1, 4)]])
def test_basic_model_falls_back_to_static_mig(
    tmp_path: Path, instances: list[tuple[int, int]]
) -> None:
    """1.34/1.35: no partitionable devices, so only instances that exist are offered."""
    on, bus, dropped = _slices(tmp_path / "a", dynamic=True, model="basic", instances=instances)
    off, _, none = _slices(tmp_path / "b", dynamic=False, model="basic", instances=instances)
    strip = [
        {
            **d,
            "attributes": {k: v for k, v in d["attributes"].items() if k != "migPlacementStart"},
        }
        for d in _devices(on, bus).values()
    ]
    assert strip == list(_devices(off, bus).values())
    assert not _counter_sets(on)
    assert dropped
    assert not none


def test_hardware_check_compares_placements() -> None:
    """e2e/gpu/dynamic_mig_check.py: the table agrees with itself, and a changed placement or
    a missing profile is reported; profiles we do not publish are ignored."""
    from e2e.gpu.dynamic_mig_check import compare, expected

    table = expected(migprofiles.H100_80GB)
    assert compare(migprofiles.H100_80GB, {**table, "1g.10gb+me": {(0, 1)}}) == []
    bad = {**table, "3g.40gb": {(0, 4)}}
    del bad["7g.80gb"]
    assert compare(migprofiles.H100_80GB, bad) == [
        "3g.40gb: table [(0, 4), (4, 4)], NVML [(0, 4)]",
        "7g.80gb: in our table, not reported by NVML",
    ]
