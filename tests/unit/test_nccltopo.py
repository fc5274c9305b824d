"""NCCL's XML topology for a container (issue 27 point 6): the file NCCL_TOPO_FILE names, built
from a DGX H100 laid out as the kernel does (tests/sysfs/nodes.py `dgx_h100`) and its recorded
/proc/cpuinfo. The format is NCCL's (src/graph/xml.cc, topo.cc: see kinds/rdma/nccltopo.py)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fabricdra.kubeletplugin import kinds
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceInventory, gpu_info
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.kinds import rdma
from fabricdra.kubeletplugin.kinds.rdma.nccltopo import (
    CpuFacts,
    PciFacts,
    TopoDevice,
    TopologyError,
    cpulist_mask,
    nccl_chain,
    render,
)
from fabricdra.kubeletplugin.kinds.rdma.nccltopofiles import cpu_facts, pci_facts, topo_device
from tests.integration.kubelethost import Host, build_host

# DGX H100: GPU i at bus+3, its rail HCA mlx5_i at bus+4, both under one PCIe switch whose
# upstream port is bus+1 (root port bus:01.0, downstream ports bus+2:00.0 / bus+2:01.0).
GPU0, GPU1, GPU4 = "0000:18:00.0", "0000:3a:00.0", "0000:9a:00.0"
NIC0, NIC1 = "0000:19:00.0", "0000:3b:00.0"
SWITCH0, SWITCH1 = "0000:16:00.0", "0000:38:00.0"  # the switches' upstream ports
SOCKET0_MASK = cpulist_mask("0-55,112-167")


@pytest.fixture(scope="module")
def dgx(tmp_path_factory: pytest.TempPathFactory) -> Host:
    return build_host(tmp_path_factory.mktemp("dgx"), dgx=True)


def entries(inventory: DeviceInventory, bus_ids: set[str]) -> list[TopoDevice]:
    out = []
    for d in inventory:
        t = topo_device(d, kinds.kind_of(d).nccl_hca(d))
        if t is not None and t.bus_id in bus_ids:
            out.append(t)
    return out


def inventory(dgx: Host) -> DeviceInventory:
    """As the agent builds it: with NVML's facts about each GPU (its compute capability)."""
    d = dgx.discovery
    return build_devices(d.interfaces or [], d.accelerators or [], gpu_info=gpu_info(d.nvml))


def topology(dgx: Host, bus_ids: set[str]) -> str:
    devices = entries(inventory(dgx), bus_ids)
    tree = SysfsTree(dgx.layout.sysfs_root)
    try:
        facts = pci_facts(tree, devices)
    finally:
        tree.close()
    return render(devices, facts, cpu_facts(dgx.layout.proc_root, machine="x86_64"))


def pcis(root: ET.Element) -> dict[str, ET.Element]:
    return {p.attrib["busid"]: p for p in root.iter("pci")}


def test_two_gpus_and_their_rail_nics_exactly(dgx: Host) -> None:
    text = topology(dgx, {GPU0, GPU1, NIC0, NIC1})
    root = ET.fromstring(text)
    assert root.tag == "system"
    assert root.attrib == {"version": "1"}
    by_bus = pcis(root)
    # Exactly those devices and the switch above each: no other GPU, HCA, storage NIC, and no
    # downstream or root port (NCCL draws a switch as its upstream port).
    assert set(by_bus) == {GPU0, GPU1, NIC0, NIC1, SWITCH0, SWITCH1}
    gpus = {p.attrib["busid"] for p in root.iter("pci") if p.find("gpu") is not None}
    assert gpus == {GPU0, GPU1}
    nets = {n.attrib["name"]: n.attrib for n in root.iter("net")}
    assert nets == {
        "mlx5_0": {"name": "mlx5_0", "rail": "0"},
        "mlx5_1": {"name": "mlx5_1", "rail": "1"},
    }
    # GPU i and HCA i are one switch apart (NCCL: PIX), under the same upstream port.
    for switch, gpu, nic in ((SWITCH0, GPU0, NIC0), (SWITCH1, GPU1, NIC1)):
        assert [c.attrib["busid"] for c in by_bus[switch].findall("pci")] == [gpu, nic]
    # A NIC's branch is complete (NCCL reads nothing more for a net it finds by name).
    for bus in (NIC0, NIC1, SWITCH0, SWITCH1):
        a = by_bus[bus].attrib
        assert (a["link_speed"], a["link_width"]) == ("32.0 GT/s PCIe", "16")
    assert by_bus[NIC0].attrib["class"] == "0x020000"
    assert by_bus[SWITCH0].attrib["class"] == "0x060400"
    # The process's own facts are NCCL's: no rank, CUDA index, GDR or link of a GPU.
    gpu = by_bus[GPU0].find("gpu")
    assert gpu is not None
    assert gpu.attrib == {"sm": "90"}
    assert "link_speed" not in by_bus[GPU0].attrib
    assert by_bus[GPU0].attrib["class"] == "0x030200"
    (cpu,) = root.findall("cpu")
    assert cpu.attrib == {
        "numaid": "0",
        "affinity": SOCKET0_MASK,
        "arch": "x86_64",
        "vendor": "GenuineIntel",
        "familyid": "6",
        "modelid": "143",
    }


def test_the_text_is_what_nccls_parser_reads(dgx: Host) -> None:
    """xml.cc xmlGetNode: no declaration, spaces only, one space between attributes, every
    value double-quoted and under 256 characters."""
    text = topology(dgx, {GPU0, NIC0})
    assert text.startswith('<system version="1">\n')
    tag = re.compile(r'^ *(</[a-z]+>|<[a-z]+( [a-z_]+="[^"<>&]{0,254}")*/?>)$')
    for line in text.splitlines():
        assert tag.match(line), line


def test_gpus_on_two_sockets_sit_under_two_cpus(dgx: Host) -> None:
    root = ET.fromstring(topology(dgx, {GPU0, GPU4}))
    assert [c.attrib["numaid"] for c in root.findall("cpu")] == ["0", "1"]
    assert root.findall("cpu")[1].attrib["affinity"] == cpulist_mask("56-111,168-223")


def test_a_nic_whose_link_is_unknown_gets_no_file() -> None:
    nic = TopoDevice(NIC0, ("0000:15:01.0", SWITCH0, "0000:17:01.0"), 0, None, net="mlx5_0")
    facts = {SWITCH0: PciFacts("0x060400", link_speed="32.0 GT/s PCIe", link_width=16)}
    facts[NIC0] = PciFacts("0x020000")  # no max_link_* readable: NCCL would fail, not guess
    with pytest.raises(TopologyError, match=f"{NIC0}: PCIe link speed or width unknown"):
        render([nic], facts, CpuFacts("arm64"))


def test_cpu_facts_ncclc_requires() -> None:
    gpu = TopoDevice(GPU0, (), 0, None, gpu=True)
    with pytest.raises(TopologyError, match="family/model"):
        render([gpu], {GPU0: PciFacts("0x030200")}, CpuFacts("x86_64", "GenuineIntel"))
    with pytest.raises(TopologyError, match="vendor"):
        render([gpu], {GPU0: PciFacts("0x030200")}, CpuFacts("x86_64"))
    with pytest.raises(TopologyError, match="riscv64"):
        render([gpu], {GPU0: PciFacts("0x030200")}, CpuFacts("riscv64"))
    # AMD needs no family/model (topo.cc asks it of Intel and Zhaoxin only); arm64 no vendor.
    assert 'vendor="AuthenticAMD">' in render([gpu], {}, CpuFacts("x86_64", "AuthenticAMD"))
    assert '<cpu numaid="0" arch="arm64">' in render([gpu], {}, CpuFacts("arm64"))


def test_a_value_ncclc_parser_cannot_read_is_refused() -> None:
    nic = TopoDevice(NIC0, (), 0, None, net='mlx5_0"')
    with pytest.raises(TopologyError, match="name="):
        render(
            [nic],
            {NIC0: PciFacts("0x020000", link_speed="8.0 GT/s PCIe", link_width=8)},
            CpuFacts("arm64"),
        )


@pytest.mark.parametrize(
    ("upstream", "drawn"),
    [
        ((), []),  # on the root bus
        (("0000:15:01.0",), []),  # on a root port: NCCL goes straight to the CPU
        (("0000:15:01.0", "0000:16:00.0", "0000:17:00.0"), ["0000:16:00.0"]),  # one switch
        # Intel VMD: a five-digit domain is no BDF to NCCL (checkBDFFormat), which stops there
        (("10000:e0:01.0", "10000:e1:00.0", "10000:e2:00.0"), []),
        (
            ("0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0", "0000:19:00.0"),
            ["0000:16:00.0", "0000:18:00.0"],  # two switches, one under the other
        ),
    ],
)
def test_switches_are_drawn_as_ncclc_walk_draws_them(
    upstream: tuple[str, ...], drawn: list[str]
) -> None:
    assert nccl_chain(upstream) == drawn


def test_cpulist_mask_is_the_kernels_cpumask_form() -> None:
    assert cpulist_mask("0-31") == "ffffffff"
    assert cpulist_mask("32") == "00000001,00000000"
    assert cpulist_mask("0-55,112-167") == "000000ff,ffffffff,ffff0000,00000000,00ffffff,ffffffff"
    with pytest.raises(ValueError, match="bad CPU range"):
        cpulist_mask("5-2")


def test_cpuinfo_without_a_file_is_unknown_not_invented(tmp_path: Path) -> None:
    assert cpu_facts(tmp_path, machine="aarch64") == CpuFacts("arm64")


def test_only_a_measured_rail_is_written(dgx: Host) -> None:
    """NCCL confines a ring to one rail by `rail` (with NCCL_CROSS_NIC=0): a declared or
    disputed rail stays out, the rule of NCCL_CROSS_NIC=0 itself."""
    import dataclasses

    nics = [d for d in inventory(dgx) if d.type == "rdma"]
    (nic,) = [d for d in nics if rdma.payload_of(d).endpoint.rdmaDevice == "mlx5_0"]
    payload = rdma.payload_of(nic)
    assert payload.interface.scaleOut is not None
    declared = dataclasses.replace(payload.interface.scaleOut, railSource="declared")
    iface = dataclasses.replace(payload.interface, scaleOut=declared)
    moved = dataclasses.replace(payload, interface=iface, endpoint=iface)
    entry = topo_device(dataclasses.replace(nic, payload=moved), "mlx5_0")
    assert entry is not None
    assert entry.rail is None
    measured = topo_device(nic, "mlx5_0")
    assert measured is not None
    assert measured.rail == 0
