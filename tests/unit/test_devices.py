"""The device inventory built from real discovery over kernel-shaped sysfs trees."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fabricdra.api.inventory import Interface, LinkRecord, VirtualFunction
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import (
    DeviceConfig,
    DeviceInventory,
    GpuHealth,
    HeldAs,
    RdmaOverride,
    dns_label,
    parse_override,
    parse_rdma_mode,
)
from fabricdra.kubeletplugin.discovery.node import Discovery, discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.kinds.accelerator import gpu_payload
from fabricdra.kubeletplugin.kinds.accelerator import payload_of as gpu_of
from fabricdra.kubeletplugin.kinds.rdma import payload_of as rdma_of
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import Hgx, amd_mi300x, h100_snapshot, hgx_h100, write_json


def _discover(
    tmp_path: Path, snapshot: dict[str, object] | None = None, **kw: object
) -> tuple[Discovery, Hgx]:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b, **kw)  # type: ignore[arg-type]
    snap = write_json(tmp_path / "nvml.json", snapshot or h100_snapshot(hgx.gpus))
    readings = load_snapshot(snap)
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    assert d.interfaces is not None
    assert d.accelerators is not None
    return d, hgx


def _build(d: Discovery, **kw: object) -> DeviceInventory:
    assert d.interfaces is not None
    assert d.accelerators is not None
    return build_devices(d.interfaces, d.accelerators, **kw)  # type: ignore[arg-type]


def test_hgx_offers_every_gpu_and_every_rdma_nic_exclusive(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path)
    inv = _build(d)
    gpus = [x for x in inv.devices if x.type == "gpu"]
    rdma = [x for x in inv.devices if x.type == "rdma"]
    assert sorted(gpu_of(g).accelerator.pciBusId for g in gpus) == sorted(hgx.gpus)
    assert sorted(rdma_of(r).endpoint.pciBusId for r in rdma) == sorted(hgx.nics)
    assert {rdma_of(r).mode for r in rdma} == {"exclusive"}
    # The management NIC (no RDMA device), loopback and docker0 are in no mode.
    assert len(inv) == 16
    assert inv.get("gpu-0000-18-00-0") is not None
    assert inv.get("rdma-0000-19-00-0") is not None
    assert rdma_of(inv.get("rdma-0000-19-00-0")).interface.name == "enp25s0np0"  # type: ignore[arg-type]
    assert [x.name for x in inv.devices] == sorted(x.name for x in inv.devices)


def test_names_are_stable_dns_labels_from_bus_ids(tmp_path: Path) -> None:
    d, _ = _discover(tmp_path)
    a = _build(d)
    # Enumeration order must not matter: reversed inputs give the same names.
    assert d.interfaces is not None
    assert d.accelerators is not None
    b = build_devices(list(reversed(d.interfaces)), list(reversed(d.accelerators)))
    assert [x.name for x in a.devices] == [x.name for x in b.devices]
    for x in a.devices:
        assert len(x.name) <= 63
        assert x.name == dns_label(x.name)


def test_shared_mode_offers_whole_functions_shared(tmp_path: Path) -> None:
    d, _ = _discover(tmp_path)
    inv = _build(d, config=DeviceConfig(rdma_mode="shared"))
    assert {rdma_of(x).mode for x in inv.devices if x.type == "rdma"} == {"shared"}
    assert len([x for x in inv.devices if x.type == "rdma"]) == 8


def test_pf_with_vfs_offers_only_its_vfs(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path, vf_nics=(0, 1), vfs_per_nic=3)
    inv = _build(d, config=DeviceConfig(rdma_mode="shared"))
    pf0 = hgx.nics[0]
    assert inv.get(dns_label("rdma", pf0)) is None
    vfs = [x for x in inv.devices if x.type == "rdma" and rdma_of(x).mode == "vf"]
    assert sorted(rdma_of(v).endpoint.pciBusId for v in vfs) == sorted(
        hgx.vfs[hgx.nics[0]] + hgx.vfs[hgx.nics[1]]
    )
    for v in vfs:
        assert rdma_of(v).interface.pciBusId in (hgx.nics[0], hgx.nics[1])
        assert rdma_of(v).endpoint is not rdma_of(v).interface
    # The other six PFs stay whole-function, in the node's mode.
    assert len([x for x in inv.devices if x.type == "rdma" and rdma_of(x).mode == "shared"]) == 6


def test_vfs_configured_flag_alone_sends_pf_to_vf_mode() -> None:
    pf = Interface(
        name="ens1",
        bus="pci",
        virtual=False,
        pciBusId="0000:05:00.0",
        rdma=True,
        rdmaDevice="mlx5_0",
        sriovPhysicalFunction=True,
        sriovVfsConfigured=True,
    )
    assert len(build_devices([pf], [])) == 0
    whole = pf.model_copy(update={"sriovVfsConfigured": False})
    assert [rdma_of(x).mode for x in build_devices([whole], [])] == ["exclusive"]


def test_endpoint_without_rdma_device_is_in_no_mode(tmp_path: Path) -> None:
    d, _ = _discover(tmp_path, pf_rdma=False)
    inv = _build(d)
    assert [x for x in inv.devices if x.type == "rdma"] == []
    # VFs without a bound RDMA device are not offered either.
    vf_pf = Interface(
        name="ens1",
        bus="pci",
        virtual=False,
        pciBusId="0000:05:00.0",
        sriovVfsConfigured=True,
        virtualFunctions=[VirtualFunction(name="ens1v0", index=0, pciBusId="0000:05:00.2")],
    )
    assert len(build_devices([vf_pf], [])) == 0


def test_failed_link_is_unhealthy_and_kept(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path, broken_nics=(2,))
    inv = _build(d)
    broken = inv.get(dns_label("rdma", hgx.nics[2]))
    assert broken is not None
    assert broken.health == "Unhealthy"
    assert broken.health_reason
    link = rdma_of(broken).endpoint.link
    assert link
    assert broken.health_reason == link.reason
    ok = inv.get(dns_label("rdma", hgx.nics[0]))
    assert ok is not None
    assert ok.health == "Healthy"
    assert ok.health_reason is None


def test_unverified_or_missing_verdict_is_unknown() -> None:
    base = Interface(
        name="ens1",
        bus="pci",
        virtual=False,
        pciBusId="0000:05:00.0",
        rdma=True,
        rdmaDevice="mlx5_0",
    )
    unverified = base.model_copy(
        update={"link": LinkRecord(verdict="Unverified", reason="port 1 state unreadable")}
    )
    (dev,) = build_devices([unverified], []).devices
    assert (dev.health, dev.health_reason) == ("Unknown", "port 1 state unreadable")
    (dev,) = build_devices([base], []).devices
    assert dev.health == "Unknown"


def test_gpu_health_from_readings(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path)
    health = {
        hgx.gpus[0]: GpuHealth(healthy=False, reason="uncorrectable ECC errors: 3"),
        hgx.gpus[1]: GpuHealth(healthy=True),
        hgx.gpus[2]: GpuHealth(healthy=None),
    }
    inv = _build(d, gpu_health=health)
    by_bus = {gpu_of(x).accelerator.pciBusId: x for x in inv.devices if gpu_payload(x)}
    assert by_bus[hgx.gpus[0]].health == "Unhealthy"
    assert by_bus[hgx.gpus[0]].health_reason == "uncorrectable ECC errors: 3"
    assert by_bus[hgx.gpus[1]].health == "Healthy"
    assert by_bus[hgx.gpus[2]].health == "Unknown"
    assert by_bus[hgx.gpus[3]].health == "Unknown"  # no reading at all


def test_mig_gpu_offers_its_instances_not_itself(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    snap = h100_snapshot(hgx.gpus, mig_gpu=1)
    d, _ = _discover(tmp_path / "again", snapshot=snap)
    health = {hgx.gpus[1]: GpuHealth(healthy=False, reason="thermal violation")}
    inv = _build(d, gpu_health=health)
    migs = [x for x in inv.devices if x.type == "mig"]
    assert [m.name for m in migs] == [
        f"mig-{hgx.gpus[1].replace(':', '-').replace('.', '-')}-gi1-ci0",
        f"mig-{hgx.gpus[1].replace(':', '-').replace('.', '-')}-gi2-ci0",
    ]
    assert all(gpu_of(m).accelerator.pciBusId == hgx.gpus[1] for m in migs)
    assert all(gpu_of(m).mig is not None for m in migs)
    assert all(m.health == "Unhealthy" for m in migs)  # the parent's health
    assert inv.get(dns_label("gpu", hgx.gpus[1])) is None
    assert len([x for x in inv.devices if x.type == "gpu"]) == 7


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="holders"):
        DeviceConfig(rdma_mode="shared", rdma_shared_holders=0)
    with pytest.raises(ValueError, match="rdma mode"):
        DeviceConfig(rdma_mode="partitioned")  # type: ignore[arg-type]


def test_dns_label_refuses_what_it_cannot_name() -> None:
    assert dns_label("rdma", "mlx5_4") == "rdma-mlx5-4"
    with pytest.raises(ValueError, match="DNS label"):
        dns_label("x" * 64)
    with pytest.raises(ValueError, match="DNS label"):
        dns_label("__")


def test_holder_names_resolve_to_their_shared_endpoint(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path)
    name = dns_label("rdma", hgx.nics[0])
    shared = _build(d, config=DeviceConfig(rdma_mode="shared", rdma_shared_holders=4))
    assert shared.get(f"{name}-s0") is shared.get(name)
    assert shared.get(f"{name}-s3") is shared.get(name)
    assert shared.get(f"{name}-s4") is None  # beyond the holders offered
    assert shared.get(f"{name}-s01") is None  # not a name we publish
    exclusive = _build(d)
    assert exclusive.get(f"{name}-s0") is None  # exclusive endpoints have no holders


def test_gpus_off_offers_only_rdma_beside_nvidias_driver(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path)
    inv = _build(d, config=DeviceConfig(offer_gpus=False))
    assert {x.type for x in inv.devices} == {"rdma"}
    assert len(inv) == len(hgx.nics)


def test_rdma_off_offers_only_gpus(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path)
    inv = _build(d, config=DeviceConfig(offer_rdma=False))
    assert {x.type for x in inv.devices} == {"gpu"}
    assert len(inv) == len(hgx.gpus)


# --- RDMA mode per node and per NIC (issue 20, point 4) -----------------------------------


def _rdma_modes(inv: DeviceInventory) -> dict[str, str | None]:
    return {x.name: rdma_of(x).mode for x in inv.devices if x.type == "rdma"}


def test_rdma_mode_off_offers_no_rdma_endpoint_and_keeps_the_gpus(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path, vf_nics=(0,), vfs_per_nic=2)
    inv = _build(d, config=DeviceConfig(rdma_mode="off"))
    assert _rdma_modes(inv) == {}
    assert len([x for x in inv.devices if x.type == "gpu"]) == len(hgx.gpus)


def test_a_per_nic_override_by_pci_address_or_netdev_beats_the_node_mode(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path)
    nic0, nic1, nic2 = hgx.nics[0], hgx.nics[1], hgx.nics[2]
    netdev1 = rdma_of(_build(d).get(dns_label("rdma", nic1))).endpoint.name  # type: ignore[arg-type]
    assert netdev1
    config = DeviceConfig(
        rdma_mode="shared",
        rdma_overrides=(
            RdmaOverride(nic0.upper(), "exclusive"),  # PCI addresses compare case-blind
            RdmaOverride(netdev1, "off"),
            RdmaOverride(nic2.removeprefix("0000:"), "exclusive"),  # domain 0000 implied
        ),
    )
    modes = _rdma_modes(_build(d, config=config))
    assert modes[dns_label("rdma", nic0)] == "exclusive"
    assert dns_label("rdma", nic1) not in modes
    assert modes[dns_label("rdma", nic2)] == "exclusive"
    assert {modes[dns_label("rdma", n)] for n in hgx.nics[3:]} == {"shared"}
    # The override also switches a NIC on where the node's mode is off.
    on = DeviceConfig(rdma_mode="off", rdma_overrides=(RdmaOverride(nic0, "shared"),))
    assert _rdma_modes(_build(d, config=on)) == {dns_label("rdma", nic0): "shared"}


def test_vfs_can_be_switched_off_node_wide_per_pf_or_per_vf(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path, vf_nics=(0, 1), vfs_per_nic=2)
    pf0, pf1 = hgx.nics[0], hgx.nics[1]
    vfs0, vfs1 = hgx.vfs[pf0], hgx.vfs[pf1]
    everything = _rdma_modes(_build(d))
    assert {everything[dns_label("rdma", v)] for v in vfs0 + vfs1} == {"vf"}
    # Node-wide: no VF offered, and a PF with VFs configured is still not offered whole
    # (its link is the VFs'); PFs without VFs are unaffected.
    no_vfs = _rdma_modes(_build(d, config=DeviceConfig(rdma_vfs=False)))
    assert not any(m == "vf" for m in no_vfs.values())
    assert dns_label("rdma", pf0) not in no_vfs
    assert {no_vfs[dns_label("rdma", n)] for n in hgx.nics[2:]} == {"exclusive"}
    # A PF's override off switches its VFs off too; a VF's own override only that VF.
    per_nic = DeviceConfig(
        rdma_overrides=(RdmaOverride(pf0, "off"), RdmaOverride(vfs1[0], "off")),
    )
    modes = _rdma_modes(_build(d, config=per_nic))
    assert not any(dns_label("rdma", v) in modes for v in vfs0)
    assert dns_label("rdma", vfs1[0]) not in modes
    assert modes[dns_label("rdma", vfs1[1])] == "vf"


def test_a_held_endpoint_keeps_the_mode_it_was_published_in(tmp_path: Path) -> None:
    """A mode change never moves a prepared device: an endpoint a prepared claim holds is
    offered as it was held (exclusive or shared, a VF as a VF) until it is unprepared."""
    d, hgx = _discover(tmp_path, vf_nics=(0,), vfs_per_nic=2)
    pf0, nic1, nic2, nic3 = hgx.nics[0], hgx.nics[1], hgx.nics[2], hgx.nics[3]
    vf = hgx.vfs[pf0][0]
    held: dict[str, HeldAs] = {
        dns_label("rdma", nic1): "exclusive",
        dns_label("rdma", nic2): "shared",
        dns_label("rdma", nic3): "exclusive",
        dns_label("rdma", vf): "exclusive",  # a VF is held as itself: offered `vf`
    }
    config = DeviceConfig(
        rdma_mode="shared",
        rdma_vfs=False,
        rdma_overrides=(RdmaOverride(nic3, "off"),),
    )
    modes = _rdma_modes(_build(d, config=config, held=held))
    assert modes[dns_label("rdma", nic1)] == "exclusive"  # not flipped to shared
    assert modes[dns_label("rdma", nic2)] == "shared"
    assert modes[dns_label("rdma", nic3)] == "exclusive"  # not switched off while held
    assert modes[dns_label("rdma", vf)] == "vf"  # VFs off, but this one is held
    assert dns_label("rdma", hgx.vfs[pf0][1]) not in modes
    assert {modes[dns_label("rdma", n)] for n in hgx.nics[4:]} == {"shared"}
    off = _rdma_modes(_build(d, config=DeviceConfig(rdma_mode="off"), held=held))
    assert off[dns_label("rdma", nic2)] == "shared"
    assert dns_label("rdma", hgx.nics[4]) not in off


def test_rdma_mode_names_and_overrides_are_parsed_strictly() -> None:
    assert parse_rdma_mode("shared") == "shared"
    assert parse_rdma_mode("off") == "off"
    for bad in ("partitioned", "Shared", "", "vf"):
        with pytest.raises(ValueError, match="exclusive, shared or off"):
            parse_rdma_mode(bad)
    assert parse_override("0000:1c:00.0=shared") == RdmaOverride("0000:1c:00.0", "shared")
    assert parse_override("ens1f0=off") == RdmaOverride("ens1f0", "off")
    for bad in ("ens1f0", "=off", "ens1f0=sometimes"):
        with pytest.raises(ValueError, match="override"):
            parse_override(bad)
    with pytest.raises(ValueError, match="rdma mode"):
        DeviceConfig(rdma_overrides=(RdmaOverride("ens1f0", "vf"),))  # type: ignore[arg-type]


def test_an_accelerator_off_its_vendors_driver_is_kept_in_the_inventory_but_not_offered(
    tmp_path: Path,
) -> None:
    """A GPU bound to vfio-pci (passthrough to a VM) or to no driver has no /proc/driver/nvidia
    entry or device node prepare could hand over: discovery keeps it, no slice offers it."""
    b = SysfsBuilder(tmp_path / "nv" / "sys")
    hgx = hgx_h100(b)
    b.rebind(hgx.gpus[0], "vfio-pci")
    b.rebind(hgx.gpus[1], None)
    snap = load_snapshot(write_json(tmp_path / "nvml.json", h100_snapshot(hgx.gpus)))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: snap)
    assert d.accelerators is not None
    drivers = {a.pciBusId: a.driver for a in d.accelerators}
    assert (drivers[hgx.gpus[0]], drivers[hgx.gpus[1]]) == ("vfio-pci", None)  # kept
    offered = {gpu_of(x).accelerator.pciBusId for x in _build(d).devices if gpu_payload(x)}
    assert offered == set(hgx.gpus[2:])

    a = SysfsBuilder(tmp_path / "amd" / "sys")
    mi300x = amd_mi300x(a)
    a.rebind(mi300x.gpus[0], "vfio-pci")
    d = discover(SysfsTree(str(a.root)))
    offered = {gpu_of(x).accelerator.pciBusId for x in _build(d).devices if gpu_payload(x)}
    assert offered == set(mi300x.gpus[1:])


def test_holder_names_resolve_to_a_shared_endpoint_still_in_the_inventory(tmp_path: Path) -> None:
    """A shared endpoint's holder names resolve to it, an exclusive one's do not; an inventory
    narrowed with `replace` (coexistence's withholding) keeps only its own devices' sets."""
    d, hgx = _discover(tmp_path)
    shared = dns_label("rdma", hgx.nics[0])
    config = DeviceConfig(
        rdma_mode="exclusive", rdma_overrides=(RdmaOverride(hgx.nics[0], "shared"),)
    )
    inv = _build(d, config=config)
    assert inv.holder_sets == {shared}
    assert inv.get(f"{shared}-s3") is inv.get(shared)
    assert inv.get(f"{dns_label('rdma', hgx.nics[1])}-s3") is None
    narrowed = replace(inv, devices=tuple(x for x in inv if x.name != shared))
    assert narrowed.holder_sets == frozenset()
    assert narrowed.get(f"{shared}-s3") is None
