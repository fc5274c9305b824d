"""Every device kind of the registry (kubeletplugin/kinds/) keeps the same promises
(docs/adding-a-device-kind.md): each has a sample built by real discovery over a
kernel-shaped sysfs tree; every attribute and capacity its devices publish, and its `type`,
are documented in docs/attributes.md; prepare refuses what the kind cannot serve (a device of
another kind, a host without its device nodes) with an error naming the device; an Unhealthy
device is tainted, with the kind's value, and a Healthy or Unknown one is not; its devices
carry its own typed payload, which its `payload_of` reads and refuses for another kind's
device (issue 31 point 3).

A new kind fails `test_every_kind_has_a_sample` until it gets a sample here."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import (
    Device,
    DeviceConfig,
    DeviceInventory,
    gpu_info,
)
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.hostdevices import DeviceNodeError, HostLayout
from fabricdra.kubeletplugin.kinds import KINDS, PrepareContext, kind_of
from fabricdra.kubeletplugin.kinds.base import DeviceKind
from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import ToolkitSpecs
from fabricdra.kubeletplugin.kubelet import PrepareError
from fabricdra.kubeletplugin.resourceslices import TAINT_KEY, ApiFeatures, build_slices
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import (
    amd_mi300x,
    aws_efa_node,
    discover_at,
    gaudi_node,
    h100_snapshot,
    hgx_h100,
    rdma_node,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "attributes.md"


def _nvidia(tmp_path: Path) -> list[Device]:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    d = discover_at(b.root, h100_snapshot(hgx.gpus, mig_gpu=1))
    return list(build_devices(d.interfaces or [], d.accelerators or [], gpu_info=gpu_info(d.nvml)))


def _amd(tmp_path: Path) -> list[Device]:
    b = SysfsBuilder(tmp_path / "sys")
    amd_mi300x(b, gpus=2)
    d = discover_at(b.root)
    return list(build_devices(d.interfaces or [], d.accelerators or []))


def _rdma(tmp_path: Path) -> list[Device]:
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [[], []], gpu=False)
    d = discover_at(b.root)
    return list(build_devices(d.interfaces or [], d.accelerators or []))


def _efa(tmp_path: Path) -> list[Device]:
    b = SysfsBuilder(tmp_path / "sys")
    aws_efa_node(b)
    d = discover_at(b.root)
    config = DeviceConfig(efa=True)
    return list(
        build_devices(d.interfaces or [], d.accelerators or [], config, sysfs=SysfsTree(b.root))
    )


def _gaudi(tmp_path: Path) -> list[Device]:
    b = SysfsBuilder(tmp_path / "sys")
    gaudi_node(b)
    d = discover_at(b.root)
    config = DeviceConfig(gaudi=True)
    return list(
        build_devices(d.interfaces or [], d.accelerators or [], config, sysfs=SysfsTree(b.root))
    )


# One node whose discovery yields devices of the kind (and maybe others), per kind name.
SAMPLES: dict[str, Callable[[Path], list[Device]]] = {
    "nvidia-gpu": _nvidia,
    "nvidia-mig": _nvidia,
    "amd-gpu": _amd,
    "rdma": _rdma,
    "efa": _efa,
    "gaudi": _gaudi,
}


_BUILT: dict[Callable[[Path], list[Device]], list[Device]] = {}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[Device]]:
    """A sample node's devices, each node discovered once per module (HGX trees are big)."""

    def get(kind_name: str) -> list[Device]:
        make = SAMPLES[kind_name]
        if make not in _BUILT:
            _BUILT[make] = make(tmp_path_factory.mktemp(kind_name))
        return _BUILT[make]

    return get


def _sample(kind: DeviceKind, built: Callable[[str], list[Device]]) -> Device:
    own = [d for d in built(kind.name) if kind.owns(d)]
    assert own, f"the {kind.name} sample node offers no {kind.name} device"
    return own[0]


def _kinds() -> list[Any]:
    return [pytest.param(k, id=k.name) for k in KINDS]


def test_every_kind_has_a_sample() -> None:
    assert sorted(k.name for k in KINDS) == sorted(SAMPLES)
    assert len({k.name for k in KINDS}) == len(KINDS)


@pytest.mark.parametrize("kind", _kinds())
def test_each_device_belongs_to_exactly_one_kind(kind: DeviceKind, built: Any) -> None:
    for device in built(kind.name):
        assert [k.name for k in KINDS if k.owns(device)] == [kind_of(device).name]
    device = _sample(kind, built)
    assert device.type == kind.device_type


@pytest.mark.parametrize("kind", _kinds())
def test_what_a_device_is_part_of_is_another_devices_name(kind: DeviceKind, built: Any) -> None:
    for device in built(kind.name):
        if not kind.owns(device):
            continue
        part_of = kind.within(device)
        if part_of is not None:  # a MIG instance's GPU, a VF's PF: a device name, not its own
            assert part_of != device.name
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", part_of)


def _documented(section: str) -> set[str]:
    """The backticked names in the first column of a docs/attributes.md section's table."""
    text = DOCS.read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in body.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


@pytest.mark.parametrize("kind", _kinds())
@pytest.mark.parametrize("model", ["current", "basic"])
def test_published_attributes_are_documented(kind: DeviceKind, model: str, built: Any) -> None:
    device = _sample(kind, built)
    plan = build_slices(
        build_devices_of(device),
        "n",
        features=ApiFeatures(model),  # type: ignore[arg-type]
    )
    published = [d for s in plan.slices for d in s["spec"].get("devices", [])]
    assert published
    attributes, capacities = _documented("Attributes"), _documented("Capacity")
    for d in published:
        assert d["attributes"]["type"] == {"string": kind.device_type}
        missing = set(d["attributes"]) - attributes
        assert not missing, f"{kind.name}: attributes not in docs/attributes.md: {missing}"
        missing = set(d.get("capacity", {})) - capacities
        assert not missing, f"{kind.name}: capacities not in docs/attributes.md: {missing}"
    assert kind.device_type in _documented("Devices")


def build_devices_of(device: Device) -> DeviceInventory:
    return DeviceInventory((device,))


@pytest.mark.parametrize("kind", _kinds())
def test_prepare_refuses_a_device_of_another_kind(
    kind: DeviceKind, built: Any, tmp_path: Path
) -> None:
    ctx = PrepareContext("uid-1", HostLayout(tmp_path, tmp_path, tmp_path), ToolkitSpecs())
    for other in KINDS:
        if other.name == kind.name:
            continue
        device = _sample(other, built)
        if kind.owns(device):
            continue
        with pytest.raises(PrepareError, match=re.escape(device.name)):
            kind.serve(device, ctx)


@pytest.mark.parametrize("kind", _kinds())
def test_prepare_refuses_without_the_device_nodes(
    kind: DeviceKind, built: Any, tmp_path: Path
) -> None:
    device = _sample(kind, built)
    bare = tmp_path / "bare"  # a host with no /dev, /proc or sysfs entries at all
    ctx = PrepareContext(
        "uid-1", HostLayout(bare / "dev", bare / "proc", bare / "sys"), ToolkitSpecs()
    )
    with pytest.raises((PrepareError, DeviceNodeError)) as e:
        kind.serve(device, ctx)
    names = {device.name}
    acc = getattr(device.payload, "accelerator", None)  # any kind's: GPU, Gaudi
    if acc is not None:
        names.add(acc.pciBusId)
    ep = getattr(device.payload, "endpoint", None)  # any NIC kind's: RDMA, EFA
    if ep is not None and ep.rdmaDevice:
        names.add(ep.rdmaDevice)
    assert any(n in str(e.value) for n in names), f"{kind.name}: {e.value} names no device"


@pytest.mark.parametrize("kind", _kinds())
def test_health_maps_to_a_taint(kind: DeviceKind, built: Any) -> None:
    device = _sample(kind, built)
    sick = replace(device, health="Unhealthy", health_reason="broken", health_causes=("cause",))
    for d, tainted in ((sick, True), (replace(device, health="Healthy"), False)):
        d = replace(d, health_causes=d.health_causes if tainted else ())
        plan = build_slices(build_devices_of(d), "n")
        published = [x for s in plan.slices for x in s["spec"].get("devices", [])]
        taints = [t for x in published for t in x.get("taints", [])]
        if not tainted:
            assert taints == []
            continue
        assert taints, f"{kind.name}: an Unhealthy device carries no taint"
        for t in taints:
            assert t["key"] == TAINT_KEY
            assert t["effect"] == "NoSchedule"
            assert t["value"] == kind.taint_value(sick)
            assert t["value"].endswith("-cause")
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?", t["value"])
    # Unknown informs and blocks nothing (issue 32 point 3): effect None, its own key.
    unknown = replace(device, health="Unknown", health_causes=())
    plan = build_slices(build_devices_of(unknown), "n")
    informs = [
        t for s in plan.slices for x in s["spec"].get("devices", []) for t in x.get("taints", [])
    ]
    assert informs
    for t in informs:
        assert (t["key"], t["effect"]) == ("fabricdra.io/health-unknown", "None")
        assert t["value"] == kind.taint_value(unknown)
    basic = build_slices(build_devices_of(sick), "n", features=ApiFeatures("basic"))
    for s in basic.slices:
        for x in s["spec"].get("devices", []):
            assert x["attributes"]["health"] == {"string": "Unhealthy"}
            assert "taints" not in x


def test_a_tree_without_devices_offers_none(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    b.loopback()
    d = discover_at(b.root)
    assert (
        len(build_devices(d.interfaces or [], d.accelerators or [], sysfs=SysfsTree(b.root))) == 0
    )


def _payload_of(kind: DeviceKind) -> Callable[[Device], object]:
    """The kind module's typed payload reader (`payload_of`): every kind defines one."""
    reader = getattr(sys.modules[type(kind).__module__], "payload_of", None)
    assert callable(reader), f"{kind.name}: its module defines no payload_of"
    return reader  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", _kinds())
def test_a_kind_reads_its_own_typed_payload_and_refuses_another_kinds(
    kind: DeviceKind, built: Any
) -> None:
    read = _payload_of(kind)
    own = [d for d in built(kind.name) if kind.owns(d)]
    payload_type = type(own[0].payload)
    assert payload_type.__module__.startswith("fabricdra.kubeletplugin.kinds"), payload_type
    for device in own:
        assert type(device.payload) is payload_type
        assert read(device) is device.payload
    for other in KINDS:
        device = _sample(other, built)
        if isinstance(device.payload, payload_type):
            continue  # a kind sharing the payload (NVIDIA and AMD GPUs, MIG instances)
        with pytest.raises(TypeError, match=re.escape(device.name)):
            read(device)
