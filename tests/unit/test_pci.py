"""The one PCI walk: pciRootId is the outermost bridge (not the root complex), pciSwitches the
whole upstream path innermost first, pcieRoot the root complex; NUMA -1 is no answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricdra.api.inventory import PciTopology
from fabricdra.kubeletplugin.discovery.pci import (
    is_bdf,
    read_function,
    read_numa_node,
    topology_from_path,
)
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import discover_at, hgx_h100

HGX_GPU0 = (
    "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"  # rp/usp/dsp/gpu
)


def test_coordinates_of_a_device_behind_a_switch() -> None:
    topo = topology_from_path(HGX_GPU0)
    assert topo == PciTopology(
        pciRootId="0000:15:01.0",  # the root port, the outermost bridge
        pciSwitches=["0000:17:00.0", "0000:16:00.0", "0000:15:01.0"],  # innermost first
        pcieRoot="pci0000:15",  # the root complex, recorded separately
    )


def test_pci_root_id_is_never_the_root_complex() -> None:
    topo = topology_from_path(HGX_GPU0)
    assert topo is not None
    assert topo.pciRootId != topo.pcieRoot
    assert topo.pciRootId is not None
    assert is_bdf(topo.pciRootId)


def test_a_device_on_the_root_bus_has_no_bridge() -> None:
    topo = topology_from_path("devices/pci0000:00/0000:00:03.0")
    assert topo == PciTopology(pciRootId=None, pciSwitches=[], pcieRoot="pci0000:00")


def test_wide_domains_are_pci_too() -> None:
    # Intel VMD puts devices in domain 10000.
    topo = topology_from_path("devices/pci10000:00/10000:00:02.0/10000:01:00.0")
    assert topo == PciTopology(
        pciRootId="10000:00:02.0", pciSwitches=["10000:00:02.0"], pcieRoot="pci10000:00"
    )


@pytest.mark.parametrize(
    "path",
    [
        "devices/pci0000:00/0000:00:03.0/virtio2",  # a virtio device on a PCI function
        "devices/virtual/net/lo",
        "devices/platform/soc/1000000.ethernet",
        "class/net/eth0",
    ],
)
def test_a_path_that_is_not_a_pci_function_has_no_coordinates(path: str) -> None:
    assert topology_from_path(path) is None


def test_read_function(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path)
    rp = b.bridge(b.root_bus("pci0000:15"), "0000:15:01.0", 0)
    gpu = b.gpu(rp, "0000:16:00.0", numa=1, cpus="56-111")
    fn = read_function(SysfsTree(tmp_path), gpu)
    assert fn is not None
    assert fn.bus_id == "0000:16:00.0"
    assert fn.numa_node == 1
    assert fn.cpu_affinity == "56-111"
    assert fn.driver == "nvidia"
    assert fn.topology.pciRootId == "0000:15:01.0"


@pytest.mark.parametrize(("content", "expected"), [("1", 1), ("0", 0), ("-1", None)])
def test_numa_node(tmp_path: Path, content: str, expected: int | None) -> None:
    b = SysfsBuilder(tmp_path)
    dev = b.gpu(b.root_bus(), "0000:00:05.0", numa=None)
    b.write(f"{dev}/numa_node", content)
    assert read_numa_node(SysfsTree(tmp_path), dev) == expected


@pytest.mark.parametrize("how", ["missing", "directory", "escaping-link", "oversize"])
def test_numa_node_that_cannot_be_read_is_none_not_zero(tmp_path: Path, how: str) -> None:
    b = SysfsBuilder(tmp_path)
    dev = b.gpu(b.root_bus(), "0000:00:05.0", numa=None)
    if how != "missing":
        b.make_unreadable(f"{dev}/numa_node", how)
    assert read_numa_node(SysfsTree(tmp_path), dev) is None


def test_interfaces_and_accelerators_share_one_walk(tmp_path: Path) -> None:
    """A GPU and the NIC on the next port of its switch: their coordinates compare equal
    wherever they share the path, because both come from the same function."""
    hgx = hgx_h100(SysfsBuilder(tmp_path / "sys"))
    d = discover_at(tmp_path / "sys")
    assert d.interfaces is not None
    assert d.accelerators is not None
    nics = {i.pciBusId: i for i in d.interfaces}
    for gpu_bdf, nic_bdf in zip(hgx.gpus, hgx.nics, strict=True):
        gpu = next(a for a in d.accelerators if a.pciBusId == gpu_bdf)
        nic = nics[nic_bdf]
        assert gpu.topology.pciRootId == nic.topology.pciRootId
        assert gpu.topology.pcieRoot == nic.topology.pcieRoot
        # Same switch (upstream port and root port), different downstream ports.
        assert gpu.topology.pciSwitches[1:] == nic.topology.pciSwitches[1:]
        assert gpu.topology.pciSwitches[0] != nic.topology.pciSwitches[0]
        assert len(gpu.topology.pciSwitches) == 3


def test_a_vf_shares_its_parents_path_and_keeps_its_own_numa(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rp = b.bridge(b.root_bus("pci0000:15"), "0000:15:01.0", 0)
    pf = b.nic(rp, "0000:16:00.0", "ens1np0", numa=0, total_vfs=8)
    b.vfs(pf, ["0000:16:00.2", "0000:16:00.3"], ["ens1v0", None], numa=1)
    b.write(f"{rp}/0000:16:00.3/numa_node", "-1")
    d = discover_at(tmp_path / "sys")
    assert d.interfaces is not None
    (iface,) = d.interfaces
    assert [vf.pciBusId for vf in iface.virtualFunctions] == ["0000:16:00.2", "0000:16:00.3"]
    for vf in iface.virtualFunctions:
        assert vf.topology == iface.topology
        assert vf.pciBusId != iface.pciBusId  # its own function, its own address
    assert iface.numaNode == 0
    assert [vf.numaNode for vf in iface.virtualFunctions] == [1, None]  # its own, even blank
