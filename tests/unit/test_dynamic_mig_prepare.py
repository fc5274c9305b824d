"""Prepare/unprepare of dynamic MIG placements over a fake NVML that keeps the H100's
placement rules: prepare creates the instance and hands over its device nodes, unprepare
destroys it, and an instance that existed at start is adopted, never destroyed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fabricdra.kubeletplugin.agent import Agent
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceConfig, DeviceInventory, gpu_info
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.kinds.nvidia.claims import NvidiaClaims
from fabricdra.kubeletplugin.kinds.nvidia.dynamicmig import DynamicMig, Instance
from fabricdra.kubeletplugin.kinds.nvidia.mignvml import LiveMigNvml
from fabricdra.kubeletplugin.kinds.nvidia_mig import MIG_CREATE_BUDGET
from fabricdra.kubeletplugin.kubelet import PrepareError
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint
from fabricdra.kubeletplugin.kubelet.driver import KUBELET_DEADLINE, Call, serving
from fabricdra.kubeletplugin.prepare import CDI_KIND, DevicesDriver
from tests.integration.kubelethost import build_host
from tests.nvmlfake.mig import FakeMigGpu, FakeNvml
from tests.unit.agentkit import offline_config
from tests.unit.test_prepare import Claims

MIG_GPU = 7  # /dev/nvidia7; the host has capability nodes for gi1/ci0 (cap1, cap2), gi2/ci0


def _node(
    tmp_path: Path, *, static: tuple[tuple[str, int], ...] = (), journal: bool = True
) -> tuple[DevicesDriver, FakeNvml, Claims, str, list[int]]:
    host = build_host(tmp_path / "host", mig_gpu=MIG_GPU)
    bus = host.hgx.gpus[MIG_GPU]
    gpu = FakeMigGpu.h100_80gb()
    adopted = [gpu.create(profile, start) for profile, start in static]
    nvml = FakeNvml({bus: gpu})
    # NVML's view: the GPU in MIG mode with exactly the instances the fake holds.
    snap = json.loads(host.nvml_snapshot.read_text())
    snap[bus]["migDevices"] = [
        {
            "uuid": gi.uuid,
            "name": f"NVIDIA H100 80GB HBM3 MIG {gi.profile}",
            "gpuInstanceId": gi.id,
            "computeInstanceId": 0,
            "placementStart": gi.start,
        }
        for gi in adopted
    ]
    host.nvml_snapshot.write_text(json.dumps(snap))
    readings = load_snapshot(host.nvml_snapshot)
    d = discover(SysfsTree(host.root / "sys"), lambda: readings)
    assert d.interfaces is not None
    assert d.accelerators is not None
    inventory: DeviceInventory = build_devices(
        d.interfaces, d.accelerators, DeviceConfig(dynamic_mig=True), gpu_info=gpu_info(readings)
    )
    claims = Claims()
    driver = DevicesDriver(
        node_name="node-a",
        inventory=lambda: inventory,
        claims=claims,
        cdi=CdiWriter(tmp_path / "cdi", CDI_KIND),
        checkpoint=Checkpoint(tmp_path / "state" / "checkpoint.json", boot_id="boot-1"),
        host=host.layout,
        families=(
            NvidiaClaims(
                dynamic_mig=DynamicMig(nvml, tmp_path / "state" / "mig.json") if journal else None
            ),
        ),
    )
    return driver, nvml, claims, bus, [gi.id for gi in adopted]


def mig_of(driver: DevicesDriver) -> DynamicMig | None:
    """The dynamic MIG the driver's NVIDIA family hooks were given."""
    [nvidia] = [f for f in driver.families if isinstance(f, NvidiaClaims)]
    return nvidia.dynamic_mig


def _stem(bus: str) -> str:
    return bus.replace(":", "-").replace(".", "-")


def _nodes(tmp_path: Path, driver: DevicesDriver, uid: str) -> set[str]:
    spec = json.loads(driver.cdi.path_for(uid).read_text())
    return {n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])}


def test_prepare_creates_the_instance_and_unprepare_destroys_it(tmp_path: Path) -> None:
    driver, nvml, claims, bus, _ = _node(tmp_path)
    device = f"mig-{_stem(bus)}-3g-40gb-m4"
    claim = claims.add("mig", [{"request": "mig", "device": device}])
    driver.prepare(claim)
    (gi,) = nvml.gpus[bus].instances.values()
    assert (gi.profile, gi.start) == ("3g.40gb", 4)
    # its own capability nodes (gi1: cap1, ci0: cap2) and the GPU's, nothing of others
    assert {"/dev/nvidia7", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"} <= (
        _nodes(tmp_path, driver, claim.uid)
    )
    assert "/dev/nvidia-caps/nvidia-cap11" not in _nodes(tmp_path, driver, claim.uid)
    driver.prepare(claim)  # repeated: the same instance, not a second one
    assert len(nvml.gpus[bus].instances) == 1
    driver.unprepare(claim)
    assert nvml.gpus[bus].instances == {}


def test_adopted_instance_is_never_destroyed(tmp_path: Path) -> None:
    driver, nvml, claims, bus, adopted = _node(tmp_path, static=(("3g.40gb", 4),))
    static = claims.add("static", [{"request": "mig", "device": f"mig-{_stem(bus)}-gi1-ci0"}])
    driver.prepare(static)
    mine = claims.add("mine", [{"request": "mig", "device": f"mig-{_stem(bus)}-4g-40gb-m0"}])
    driver.prepare(mine)
    assert sorted(gi.profile for gi in nvml.gpus[bus].instances.values()) == [
        "3g.40gb",
        "4g.40gb",
    ]
    driver.unprepare(mine)
    driver.unprepare(static)
    assert list(nvml.gpus[bus].instances) == adopted


def test_placement_nvml_refuses_fails_prepare_and_leaves_nothing(tmp_path: Path) -> None:
    driver, nvml, claims, bus, _ = _node(tmp_path)
    nvml.gpus[bus].create("1g.10gb", 0)  # appeared behind our back: the 4g cannot be made
    claim = claims.add("c", [{"request": "mig", "device": f"mig-{_stem(bus)}-4g-40gb-m0"}])
    with pytest.raises(PrepareError, match="cannot create the MIG instance"):
        driver.prepare(claim)
    assert mig_of(driver) is not None
    assert mig_of(driver).records() == []


def test_without_dynamic_mig_a_placement_is_refused(tmp_path: Path) -> None:
    driver, nvml, claims, bus, _ = _node(tmp_path, journal=False)
    claim = claims.add("c", [{"request": "mig", "device": f"mig-{_stem(bus)}-3g-40gb-m4"}])
    with pytest.raises(PrepareError, match="dynamic MIG is off"):
        driver.prepare(claim)
    assert nvml.gpus[bus].instances == {}


def test_a_refused_second_placement_undoes_the_first(tmp_path: Path) -> None:
    """Nothing half-made: a claim of two placements whose second NVML refuses leaves neither
    instance (nor a journal record); kubelet's retry starts afresh."""
    driver, nvml, claims, bus, _ = _node(tmp_path)
    nvml.gpus[bus].create("1g.10gb", 0)  # appeared behind our back: the 4g cannot be made
    claim = claims.add(
        "two",
        [
            {"request": "a", "device": f"mig-{_stem(bus)}-3g-40gb-m4"},
            {"request": "b", "device": f"mig-{_stem(bus)}-4g-40gb-m0"},
        ],
    )
    with pytest.raises(PrepareError, match="4g-40gb-m0: cannot create the MIG instance"):
        driver.prepare(claim)
    assert [gi.profile for gi in nvml.gpus[bus].instances.values()] == ["1g.10gb"]
    assert mig_of(driver) is not None
    assert mig_of(driver).records() == []
    assert driver.checkpoint.get(claim.uid) is None


def test_missing_capability_nodes_undo_the_instance(tmp_path: Path) -> None:
    """The instance NVML made has no capability files the host shows (here: the host has
    them for gi1 and gi2 only, two static instances hold those): prepare fails, clearly, and
    destroys it."""
    driver, nvml, claims, bus, adopted = _node(tmp_path, static=(("1g.10gb", 0), ("1g.10gb", 1)))
    claim = claims.add("c", [{"request": "mig", "device": f"mig-{_stem(bus)}-3g-40gb-m4"}])
    with pytest.raises(PrepareError, match="no DeviceFileMinor"):
        driver.prepare(claim)
    assert list(nvml.gpus[bus].instances) == adopted
    assert mig_of(driver) is not None
    assert mig_of(driver).records() == []


def test_creation_is_not_started_late_in_kubelets_deadline(tmp_path: Path) -> None:
    """Kubelet gives a prepare 45 s; a creation started with under MIG_CREATE_BUDGET left
    could answer after kubelet gave up: refused before NVML is asked (kubelet retries)."""
    driver, nvml, claims, bus, _ = _node(tmp_path)
    claim = claims.add("c", [{"request": "mig", "device": f"mig-{_stem(bus)}-3g-40gb-m4"}])
    late = MIG_CREATE_BUDGET - 3  # still enough to read the claim
    with (
        serving(Call(time.monotonic() + late, lambda: True)),
        pytest.raises(PrepareError, match="too little time left"),
    ):
        driver.prepare(claim)
    assert nvml.gpus[bus].instances == {}
    with serving(Call(time.monotonic() + KUBELET_DEADLINE, lambda: True)):
        driver.prepare(claim)
    assert len(nvml.gpus[bus].instances) == 1


class _NoPublisher:
    def sync(self, *args: object, **kwargs: object) -> None:
        return None


def _agent(tmp_path: Path, *, dynamic_mig: bool, snapshot: bool) -> Agent:
    (tmp_path / "sys").mkdir(parents=True)
    config = offline_config(
        tmp_path,
        tmp_path / "sys",
        nvml_snapshot=tmp_path / "nvml.json" if snapshot else None,
        devices=DeviceConfig(dynamic_mig=dynamic_mig),
    )
    return Agent(config, None, publisher=_NoPublisher())


def test_the_agent_creates_through_nvml_only_with_the_flag_on_a_real_gpu(tmp_path: Path) -> None:
    """--dynamic-mig on a GPU node: the live NVML creator, its journal in the state folder
    (it outlives the pod); off, or with recorded NVML answers (no GPU to create on): none,
    so prepare refuses a placement."""
    on = mig_of(_agent(tmp_path / "on", dynamic_mig=True, snapshot=False).driver)
    assert on is not None
    assert isinstance(on.nvml, LiveMigNvml)
    assert on.path == tmp_path / "on" / "state" / "dynamic-mig.json"
    off = _agent(tmp_path / "off", dynamic_mig=False, snapshot=False)
    assert mig_of(off.driver) is None
    recorded = _agent(tmp_path / "rec", dynamic_mig=True, snapshot=True)
    assert mig_of(recorded.driver) is None


def _next_pass(tmp_path: Path, driver: DevicesDriver, nvml: FakeNvml, bus: str) -> None:
    """What the agent's next discovery pass makes of the node: NVML lists the fake's
    instances, the journal's are published under their placement names."""
    snapshot = tmp_path / "host" / "nvml.json"
    snap = json.loads(snapshot.read_text())
    snap[bus]["migDevices"] = [
        {
            "uuid": gi.uuid,
            "name": f"NVIDIA H100 80GB HBM3 MIG {gi.profile}",
            "gpuInstanceId": gi.id,
            "computeInstanceId": 0,
            "placementStart": gi.start,
        }
        for gi in nvml.gpus[bus].instances.values()
    ]
    snapshot.write_text(json.dumps(snap))
    readings = load_snapshot(snapshot)
    d = discover(SysfsTree(tmp_path / "host" / "sys"), lambda: readings)
    assert d.interfaces is not None
    assert d.accelerators is not None
    assert mig_of(driver) is not None
    inventory = build_devices(
        d.interfaces,
        d.accelerators,
        DeviceConfig(dynamic_mig=True),
        gpu_info=gpu_info(readings),
        created_mig=mig_of(driver).created(),
    )
    driver.inventory = lambda: inventory


def test_a_placement_freed_before_the_next_pass_is_created_again(tmp_path: Path) -> None:
    """The inventory still shows the instance claim A had (published under the placement's
    name) after A's unprepare destroyed it: claim B, allocated the same placement before the
    next pass, gets a new instance, never the ids of the destroyed one."""
    driver, nvml, claims, bus, _ = _node(tmp_path)
    placement = f"mig-{_stem(bus)}-3g-40gb-m4"
    a = claims.add("a", [{"request": "mig", "device": placement}])
    driver.prepare(a)
    _next_pass(tmp_path, driver, nvml, bus)
    assert driver.inventory().get(placement) is not None
    driver.prepare(a)  # repeated after the pass: the same instance
    assert len(nvml.gpus[bus].instances) == 1
    driver.unprepare(a)
    assert nvml.gpus[bus].instances == {}
    b = claims.add("b", [{"request": "mig", "device": placement}])
    driver.prepare(b)
    (gi,) = nvml.gpus[bus].instances.values()
    assert (gi.profile, gi.start) == ("3g.40gb", 4)
    assert mig_of(driver) is not None
    assert [(r.claim, r.created) for r in mig_of(driver).records()] == [
        (b.uid, Instance(gi.id, 0, gi.uuid, "3g.40gb", 4))
    ]


def test_a_late_repeat_of_a_created_instance_still_answers(tmp_path: Path) -> None:
    """The deadline budget holds a *creation* back; a repeated prepare of an instance the
    journal already has asks NVML nothing, so it answers however late it comes."""
    driver, nvml, claims, bus, _ = _node(tmp_path)
    claim = claims.add("c", [{"request": "mig", "device": f"mig-{_stem(bus)}-3g-40gb-m4"}])
    driver.prepare(claim)
    driver.cdi.path_for(claim.uid).unlink()  # the spec lost: prepared afresh, not from the record
    with serving(Call(time.monotonic() + MIG_CREATE_BUDGET - 3, lambda: True)):
        driver.prepare(claim)
    assert len(nvml.gpus[bus].instances) == 1
    assert driver.cdi.path_for(claim.uid).exists()


def test_an_unreadable_journal_fails_only_placement_claims(tmp_path: Path) -> None:
    driver, nvml, claims, bus, _ = _node(tmp_path)
    (tmp_path / "state" / "mig.json").write_text("{torn")
    gpu = claims.add("gpu", [{"request": "gpu", "device": "gpu-0000-18-00-0"}])
    driver.prepare(gpu)  # no placement: the journal is not read
    mig = claims.add("mig", [{"request": "mig", "device": f"mig-{_stem(bus)}-3g-40gb-m4"}])
    with pytest.raises(Exception, match="cannot be read"):
        driver.prepare(mig)
    assert nvml.gpus[bus].instances == {}
    driver.unprepare(gpu)  # it held no MIG device: unprepared all the same
    assert driver.checkpoint.get(gpu.uid) is None
