"""The interface inventory from class/net: bus, PCI fields, virtual, SR-IOV facts, VFs nested
under their PF, non-PCI interfaces, sorting, and a failed enumeration."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fabricdra.api.inventory import Interface, PciTopology
from fabricdra.kubeletplugin.discovery.interfaces import EnumerationError, read_interfaces
from fabricdra.kubeletplugin.discovery.rdma import read_rdma_index
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from tests.sysfs.builder import VIRTIO, SysfsBuilder
from tests.sysfs.nodes import aux_rdma_node, discover_at, hgx_h100, rdma_node, vf_bdf

NOW_ = datetime(2026, 12, 3, tzinfo=UTC)


def by_name(interfaces: list[Interface] | None) -> dict[str, Interface]:
    assert interfaces is not None
    return {i.name: i for i in interfaces}


@pytest.fixture
def hgx_vfs(tmp_path: Path) -> tuple[dict[str, Interface], list[str]]:
    hgx = hgx_h100(SysfsBuilder(tmp_path / "sys"), vf_nics=(6, 7), vfs_per_nic=4)
    return by_name(discover_at(tmp_path / "sys").interfaces), hgx.netdevs


def test_the_list_is_sorted_and_vfs_are_never_top_level(
    hgx_vfs: tuple[dict[str, Interface], list[str]],
) -> None:
    ifaces, netdevs = hgx_vfs
    names = list(ifaces)
    assert names == sorted(names)
    assert set(names) == {*netdevs, "eno1", "lo", "docker0"}
    assert not any("v" in n[len("enp") :] for n in names if n.startswith("enp"))


def test_vfs_nested_under_their_pf(hgx_vfs: tuple[dict[str, Interface], list[str]]) -> None:
    ifaces, netdevs = hgx_vfs
    pf = ifaces[netdevs[6]]
    assert [vf.index for vf in pf.virtualFunctions] == [0, 1, 2, 3]
    assert [vf.name for vf in pf.virtualFunctions] == [f"{netdevs[6]}v{k}" for k in range(4)]
    assert [vf.pciBusId for vf in pf.virtualFunctions] == [
        vf_bdf(pf.pciBusId or "", k) for k in range(4)
    ]
    assert all(vf.rdma and vf.rdmaDevice == f"mlx5_6v{vf.index}" for vf in pf.virtualFunctions)
    assert ifaces[netdevs[0]].virtualFunctions == []


def test_pf_and_vfs_configured_are_two_facts(
    hgx_vfs: tuple[dict[str, Interface], list[str]],
) -> None:
    ifaces, netdevs = hgx_vfs
    with_vfs, capable_only, plain = ifaces[netdevs[6]], ifaces[netdevs[0]], ifaces["eno1"]
    assert (with_vfs.sriovPhysicalFunction, with_vfs.sriovVfsConfigured) == (True, True)
    assert (capable_only.sriovPhysicalFunction, capable_only.sriovVfsConfigured) == (True, False)
    assert (plain.sriovPhysicalFunction, plain.sriovVfsConfigured) == (False, None)


def test_pci_interface_fields(hgx_vfs: tuple[dict[str, Interface], list[str]]) -> None:
    ifaces, netdevs = hgx_vfs
    i = ifaces[netdevs[5]]  # socket 1
    assert i.bus == "pci"
    assert i.virtual is False
    assert i.pciBusId == "0000:ac:00.0"
    assert i.numaNode == 1
    assert i.cpuAffinity == "56-111,168-223"
    assert i.driver == "mlx5_core"
    assert i.mtu == 9000
    assert i.up is True
    assert i.topology.pcieRoot == "pci0000:a8"


def test_virtual_interfaces(hgx_vfs: tuple[dict[str, Interface], list[str]]) -> None:
    ifaces, _ = hgx_vfs
    lo, docker = ifaces["lo"], ifaces["docker0"]
    for v in (lo, docker):
        assert v.virtual is True
        assert v.bus == ""
        assert v.pciBusId is None
        assert v.numaNode is None
        assert v.topology == PciTopology()
        assert v.rdma is False
        assert v.link is None
    assert lo.up is True  # operstate `unknown` with IFF_UP is how lo passes traffic
    assert lo.mtu == 65536
    assert docker.up is False


def test_an_interface_not_on_the_pci_bus(tmp_path: Path) -> None:
    """It reports its own bus and leaves every PCI field empty, RDMA device and all."""
    aux_rdma_node(SysfsBuilder(tmp_path / "sys"))
    i = by_name(discover_at(tmp_path / "sys").interfaces)["hbl0"]
    assert i.bus == "auxiliary"
    assert i.virtual is False
    assert i.pciBusId is None
    assert i.numaNode is None
    assert i.cpuAffinity is None
    assert i.driver is None
    assert i.topology == PciTopology()
    assert i.sriovPhysicalFunction is None
    assert i.sriovVfsConfigured is None
    assert i.rdma is True
    assert i.rdmaDevice == "hbl_0"
    assert i.link is not None
    assert i.link.verdict == "OK"


def test_a_virtio_nic_reports_bus_virtio(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    fn = b.pci(b.root_bus(), "0000:00:03.0", vendor=VIRTIO, pci_class=0x020000, numa=None)
    b.netdev("eth0", b.bus_device(fn, "virtio2", "virtio"))
    i = by_name(discover_at(tmp_path / "sys").interfaces)["eth0"]
    assert (i.bus, i.virtual, i.pciBusId, i.topology) == ("virtio", False, None, PciTopology())


@pytest.mark.parametrize(
    ("operstate", "flags", "up"),
    [("up", 0x1003, True), ("down", 0x1003, False), ("up", 0x1002, False), ("unknown", 0x9, True)],
)
def test_up_is_admin_up_and_not_operationally_down(
    tmp_path: Path, operstate: str, flags: int, up: bool
) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    b.netdev("x0", None, operstate=operstate, flags=flags)
    assert by_name(discover_at(tmp_path / "sys").interfaces)["x0"].up is up


def test_unreadable_facts_are_null_not_invented(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    base = b.netdev("x0", None)
    b.make_unreadable(f"{base}/mtu", "oversize")
    b.make_unreadable(f"{base}/operstate", "directory")
    i = by_name(discover_at(tmp_path / "sys").interfaces)["x0"]
    assert i.mtu is None
    assert i.up is None


def test_numa_minus_one_is_absent(tmp_path: Path) -> None:
    hgx_h100(SysfsBuilder(tmp_path / "sys"), vf_nics=(0,), numa=False)
    ifaces = by_name(discover_at(tmp_path / "sys").interfaces)
    for i in ifaces.values():
        assert i.numaNode is None
        assert all(vf.numaNode is None for vf in i.virtualFunctions)


def test_a_pass_that_found_nothing_is_an_empty_list(tmp_path: Path) -> None:
    tree = SysfsTree(SysfsBuilder(tmp_path / "sys").root)
    assert read_interfaces(tree, read_rdma_index(tree, NOW_)) == []


@pytest.mark.parametrize("how", ["escape", "missing"])
def test_an_unreadable_interface_list_is_an_error_not_empty(tmp_path: Path, how: str) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [None])
    if how == "escape":
        b.escape("class/net")
    else:
        shutil.rmtree(b.root / "class/net")
    tree = SysfsTree(b.root)
    with pytest.raises(EnumerationError):
        read_interfaces(tree, read_rdma_index(tree, NOW_))


def test_one_unreadable_interface_does_not_fail_the_rest(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [None, None])
    b.escape("class/net/ens1np0")
    ifaces = by_name(discover_at(tmp_path / "sys").interfaces)
    assert ifaces["ens0np0"].pciBusId == "0000:30:00.0"
    broken = ifaces["ens1np0"]
    assert broken.bus == ""
    assert broken.mtu is None
    assert broken.pciBusId is None


def test_a_vf_without_a_netdev_is_still_listed(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rp = b.bridge(b.root_bus("pci0000:15"), "0000:15:01.0", 0)
    pf = b.nic(rp, "0000:16:00.0", "ens1np0", total_vfs=8)
    (vf,) = b.vfs(pf, ["0000:16:00.2"], [None])
    b.rdma(vf, "mlx5_1")
    (iface,) = [i for i in discover_at(tmp_path / "sys").interfaces or [] if i.name == "ens1np0"]
    (v,) = iface.virtualFunctions
    assert v.name is None
    assert v.pciBusId == "0000:16:00.2"
    assert v.rdma is True
    assert v.rdmaDevice == "mlx5_1"


@pytest.mark.parametrize("how", ["directory", "oversize"])
def test_unreadable_sriov_capability_is_unknown_and_vfs_are_kept(tmp_path: Path, how: str) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b, vf_nics=(2,), vfs_per_nic=2, pf_rdma=False)
    pf = (b.root / f"bus/pci/devices/{hgx.nics[2]}").resolve().relative_to(b.root.resolve())
    b.make_unreadable(f"{pf}/sriov_totalvfs", how)
    d = discover_at(b.root)
    iface = by_name(d.interfaces)[hgx.netdevs[2]]
    assert iface.sriovPhysicalFunction is None  # unknown, not "no"
    assert iface.sriovVfsConfigured is True
    assert [vf.rdmaDevice for vf in iface.virtualFunctions] == ["mlx5_2v0", "mlx5_2v1"]
