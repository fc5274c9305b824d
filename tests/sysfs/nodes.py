"""Whole nodes, built from the kernel-shaped pieces in builder.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from fabricdra.kubeletplugin.discovery.node import Discovery, Previous, discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree

from .builder import (
    AMAZON,
    AMD,
    CLASS_ACCEL,
    DOWN,
    GEN5_X16,
    INTEL,
    ZERO_COUNTERS,
    Port,
    SysfsBuilder,
)

# An HGX H100 board as a 2-socket x86 server lays it out: eight host bridges, each with a root
# port, a PCIe switch, and one GPU and one NIC on two of the switch's downstream ports.
HGX_BUSES = [0x15, 0x37, 0x48, 0x59, 0x97, 0xA8, 0xB9, 0xCA]
SOCKET_CPUS = {0: "0-55,112-167", 1: "56-111,168-223"}
# The far end of each of an HGX H100 GPU's 18 NVLink links: the four NVSwitch chips on the
# baseboard (DGX H100 User Guide / BasePOD RA: 4 NVSwitch chips, research/hardware-facts.md),
# 5, 4, 4 and 5 links to them (NVIDIA H100 Tensor Core GPU Architecture whitepaper, "DGX
# H100"). The switches' PCI functions sit on the host's bus like the GPUs'.
HGX_NVSWITCHES = ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
HGX_NVLINK_SWITCHES = [
    sw for sw, n in zip(HGX_NVSWITCHES, (5, 4, 4, 5), strict=True) for _ in range(n)
]


@dataclass
class Hgx:
    gpus: list[str] = field(default_factory=list)  # bus ids
    nics: list[str] = field(default_factory=list)  # PF bus ids
    netdevs: list[str] = field(default_factory=list)
    rdma: list[str] = field(default_factory=list)
    vfs: dict[str, list[str]] = field(default_factory=dict)  # PF bus id -> VF bus ids


def vf_bdf(pf: str, i: int) -> str:
    domain, bus, _ = pf.split(":")
    devfn = 2 + i
    return f"{domain}:{bus}:{devfn // 8:02x}.{devfn % 8}"


def hgx_h100(
    b: SysfsBuilder,
    *,
    vf_nics: tuple[int, ...] = (),
    vfs_per_nic: int = 4,
    broken_nics: tuple[int, ...] = (),
    numa: bool = True,
    pf_rdma: bool = True,
) -> Hgx:
    out = Hgx()
    for i, bus in enumerate(HGX_BUSES):
        socket = 0 if i < 4 else 1
        node = socket if numa else -1
        cpus = SOCKET_CPUS[socket] if numa else None
        rb = b.root_bus(f"pci0000:{bus:02x}")
        rp = b.bridge(rb, f"0000:{bus:02x}:01.0", node)
        dsp = b.switch(
            rp,
            f"0000:{bus + 1:02x}:00.0",
            [f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 2:02x}:01.0"],
            node,
        )
        gpu = f"0000:{bus + 3:02x}:00.0"
        b.gpu(dsp[0], gpu, numa=node, cpus=cpus)
        nic = f"0000:{bus + 4:02x}:00.0"
        netdev = f"enp{bus + 4}s0np0"
        pf = b.nic(dsp[1], nic, netdev, numa=node, cpus=cpus, total_vfs=64 if i in vf_nics else 8)
        ibdev = f"mlx5_{i}"
        port = DOWN if i in broken_nics else Port()
        if pf_rdma:
            b.rdma(pf, ibdev, [Port(port.state, port.phys_state, "Ethernet", netdev)])
        if i in vf_nics:
            bdfs = [vf_bdf(nic, k) for k in range(vfs_per_nic)]
            names = [f"{netdev}v{k}" for k in range(vfs_per_nic)]
            paths = b.vfs(pf, bdfs, names, numa=node)
            for k, path in enumerate(paths):
                b.rdma(path, f"mlx5_{i}v{k}", [Port(netdev=names[k])])
            out.vfs[nic] = bdfs
        out.gpus.append(gpu)
        out.nics.append(nic)
        out.netdevs.append(netdev)
        out.rdma.append(ibdev)
    # Management NIC on the chipset, no RDMA; loopback and a container bridge.
    rb0 = b.root_bus("pci0000:00")
    rp0 = b.bridge(rb0, "0000:00:1c.0", 0 if numa else -1)
    b.nic(
        rp0,
        "0000:01:00.0",
        "eno1",
        vendor=INTEL,
        device="0x1572",
        driver="i40e",
        numa=0 if numa else -1,
        mtu=1500,
    )
    b.loopback()
    b.netdev("docker0", None, operstate="down", flags=0x1003)
    return out


NDR = "400 Gb/sec (4X NDR)"


def dgx_h100(
    b: SysfsBuilder,
    *,
    product: str = "DGXH100",
    board: str | None = "DGXH100",
    missing_gpus: tuple[int, ...] = (),
    missing_hcas: tuple[int, ...] = (),
    rates: dict[int, str] | None = None,
    counters: dict[int, tuple[tuple[str, int], ...]] | None = None,
    ib_identity: bool = False,
) -> Hgx:
    """A DGX H100 as its user guide lays it out: 8 H100 SXM GPUs, each under a PCIe switch
    with one single-port ConnectX-7 compute HCA (InfiniBand NDR, IPoIB netdev), and two
    dual-port ConnectX-7 storage NICs (Ethernet) on root ports of their own. Every bridge shows
    Gen5 x16 link files. DMI says `product` / `board`. `missing_*`: slots whose device is gone
    (fell off the bus); `rates`: HCA index -> its port's rate; `counters`: HCA index -> its
    port's error counters; `ib_identity`: the HCA ports show GID 0, LID and SM LID."""
    out = Hgx()
    for i, bus in enumerate(HGX_BUSES):
        socket = 0 if i < 4 else 1
        cpus = SOCKET_CPUS[socket]
        rb = b.root_bus(f"pci0000:{bus:02x}")
        rp = b.bridge(rb, f"0000:{bus:02x}:01.0", socket, GEN5_X16)
        dsp = b.switch(
            rp,
            f"0000:{bus + 1:02x}:00.0",
            [f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 2:02x}:01.0"],
            socket,
            GEN5_X16,
        )
        if i not in missing_gpus:
            gpu = f"0000:{bus + 3:02x}:00.0"
            b.gpu(dsp[0], gpu, numa=socket, cpus=cpus)
            out.gpus.append(gpu)
        if i in missing_hcas:
            continue
        nic = f"0000:{bus + 4:02x}:00.0"
        netdev = f"ibp{bus + 4}s0"
        pf = b.nic(dsp[1], nic, netdev, numa=socket, cpus=cpus, mtu=4092)
        port = Port(
            link_layer="InfiniBand",
            netdev=netdev,
            rate=(rates or {}).get(i, NDR),
            counters=(counters or {}).get(i, ZERO_COUNTERS),
            # `ib_identity`: the port's GID 0 (default subnet prefix fe80::, a ConnectX-7 GUID),
            # its LID from the subnet manager at LID 1.
            gid0=f"fe80:0000:0000:0000:0c42:a103:00{i:02x}:{0x4A00 + i:04x}"
            if ib_identity
            else None,
            lid=0x100 + i if ib_identity else None,
            sm_lid=1 if ib_identity else None,
        )
        b.rdma(pf, f"mlx5_{i}", [port])
        out.nics.append(nic)
        out.netdevs.append(netdev)
        out.rdma.append(f"mlx5_{i}")
    # Storage / in-band: 2 x dual-port ConnectX-7 (Ethernet), straight on CPU root ports.
    for k, bus in enumerate((0x2A, 0xE0)):
        rb = b.root_bus(f"pci0000:{bus:02x}")
        rp = b.bridge(rb, f"0000:{bus:02x}:01.0", k, GEN5_X16)
        for fn in (0, 1):
            bdf = f"0000:{bus + 1:02x}:00.{fn}"
            netdev = f"enp{bus + 1}s0f{fn}np{fn}"
            pf = b.nic(rp, bdf, netdev, numa=k, cpus=SOCKET_CPUS[k], device="0x1021")
            b.rdma(pf, f"mlx5_{8 + 2 * k + fn}", [Port(netdev=netdev)])
    b.dmi(product, board)
    b.loopback()
    return out


H100_IDENTITY: dict[str, Any] = {
    "driverVersion": "550.54.15",
    "cudaDriverVersion": 12040,
    "cudaComputeCapability": "9.0",
    "architecture": "Hopper",
    "brand": "Nvidia",
    "addressingMode": "HMM",
}


def h100_snapshot(
    gpus: list[str], *, fabric: dict[str, Any] | None = None, mig_gpu: int | None = None
) -> dict[str, Any]:
    """NVML's answers for the GPUs at `gpus`, as `fabricdra nvml-snapshot` records them."""
    out: dict[str, Any] = {}
    for i, bus in enumerate(gpus):
        entry: dict[str, Any] = {
            "uuid": f"GPU-{i:08x}-5b0e-4c1a-9f3e-{0xA1B2C3D4E5F0 + i:012x}",
            "name": "NVIDIA H100 80GB HBM3",
            "memoryTotalMiB": 81559,
            "migMode": i == mig_gpu,
            "fabric": fabric
            or {
                "clusterUuid": "00000000-0000-0000-0000-000000000000",
                "cliqueId": 0,
                "state": "not_supported",
                "status": "success",
            },
            # Identity NVML reports for an H100 SXM on driver 550.54.15 (CUDA 12.4); HMM:
            # x86 hosts with the open kernel modules (r535+) and Linux 6.1.24+ (NVIDIA's HMM
            # announcement, developer.nvidia.com/blog/simplifying-gpu-application-development-
            # with-heterogeneous-memory-management).
            **H100_IDENTITY,
            "eccUncorrectable": 0,
            "thermalViolation": False,
            # H100 SXM: 18 NVLink 4 links, all up (the verification probe's expected count),
            # each to one of the baseboard's four NVSwitch chips.
            "nvlinks": [
                {"link": k, "active": True, "remoteBusId": sw, "remoteType": "switch"}
                for k, sw in enumerate(HGX_NVLINK_SWITCHES)
            ],
        }
        if i == mig_gpu:
            entry["migDevices"] = [
                {
                    "uuid": f"MIG-{i:08x}-{g:04x}-4d2e-8f00-0000000000{g:02x}",
                    "name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                    "memoryTotalMiB": 40192,
                    "gpuInstanceId": g,
                    "computeInstanceId": 0,
                }
                for g in (1, 2)
            ]
        out[bus] = entry
    return out


def nvlink_bridges(
    snapshot: dict[str, Any], pairs: list[tuple[str, str]], *, links: int = 4
) -> dict[str, Any]:
    """`snapshot` with PCIe cards' NVLink instead of NVSwitches: each pair of GPUs joined by
    `links` active links over a bridge (remote type GPU), every other GPU with no NVLink at
    all (NVML reports no link: `nvlinks` absent)."""
    peer = dict(pairs) | {b: a for a, b in pairs}
    for bus, gpu in snapshot.items():
        if bus in peer:
            gpu["nvlinks"] = [
                {"link": k, "active": True, "remoteBusId": peer[bus], "remoteType": "gpu"}
                for k in range(links)
            ]
        else:
            gpu.pop("nvlinks", None)
    return snapshot


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


# -- smaller nodes, one shape each -----------------------------------------------------------


@dataclass
class Small:
    gpus: list[str] = field(default_factory=list)
    nics: list[str] = field(default_factory=list)
    netdevs: list[str] = field(default_factory=list)
    rdma: list[str] = field(default_factory=list)


def rdma_node(
    b: SysfsBuilder,
    nic_ports: list[list[Port] | None],
    *,
    gpu: bool = True,
    numa: int | None = 0,
    rdma_numa: list[int | None] | None = None,
) -> Small:
    """One PCIe switch holding (optionally) a GPU and one NIC per entry of `nic_ports`; each
    NIC's RDMA device has those ports (None: the NIC has no RDMA device). `rdma_numa` gives
    each NIC its own NUMA node (default: `numa`)."""
    out = Small()
    rb = b.root_bus("pci0000:10")
    rp = b.bridge(rb, "0000:10:01.0", numa)
    ports = b.switch(rp, "0000:11:00.0", [f"0000:12:{i:02x}.0" for i in range(len(nic_ports) + 1)])
    if gpu:
        out.gpus.append("0000:20:00.0")
        b.gpu(ports[0], "0000:20:00.0", numa=numa)
    for i, nic_port in enumerate(nic_ports):
        bdf = f"0000:{0x30 + i:02x}:00.0"
        netdev = f"ens{i}np0"
        node = numa if rdma_numa is None else rdma_numa[i]
        pf = b.nic(ports[i + 1], bdf, netdev, numa=node)
        if nic_port is not None:
            named = [
                Port(p.state, p.phys_state, p.link_layer, p.netdev or netdev) for p in nic_port
            ]
            b.rdma(pf, f"mlx5_{i}", named)
            out.rdma.append(f"mlx5_{i}")
        out.nics.append(bdf)
        out.netdevs.append(netdev)
    b.loopback()
    return out


def cpu_node(b: SysfsBuilder) -> Small:
    """No accelerator at all: two RDMA NICs on two sockets and a management NIC."""
    out = Small()
    for socket, bus in enumerate((0x17, 0x85)):
        rb = b.root_bus(f"pci0000:{bus:02x}")
        rp = b.bridge(rb, f"0000:{bus:02x}:02.0", socket)
        bdf = f"0000:{bus + 1:02x}:00.0"
        netdev = f"ens{socket}f0np0"
        pf = b.nic(rp, bdf, netdev, numa=socket, cpus=SOCKET_CPUS[socket])
        b.rdma(pf, f"mlx5_{socket}", [Port(netdev=netdev)])
        out.nics.append(bdf)
        out.netdevs.append(netdev)
        out.rdma.append(f"mlx5_{socket}")
    b.nic(
        b.bridge(b.root_bus("pci0000:00"), "0000:00:1c.0", 0),
        "0000:01:00.0",
        "eno1",
        vendor=INTEL,
        device="0x1572",
        driver="i40e",
        mtu=1500,
    )
    b.loopback()
    return out


def gaudi_node(b: SysfsBuilder, gaudis: int = 2, *, ports: int = 3) -> Small:
    """Intel Gaudi2 accelerators behind one PCIe switch (an HLS-Gaudi2 board has 8), each its
    accel devices and `ports` on-chip scale-out RDMA ports (Gaudi2 has 24 100GbE RoCE ports, 3
    of them for scale-out on the HLS-Gaudi2: https://www.intel.com/content/www/us/en/content-
    details/817486/intel-gaudi-2-ai-accelerator-white-paper.html). `gpus` are their bus ids,
    `rdma` their ports' RDMA devices."""
    out = Small()
    rp = b.bridge(b.root_bus("pci0000:30"), "0000:30:01.0", 0)
    downstream = [f"0000:32:{i:02x}.0" for i in range(gaudis)]
    for i, port in enumerate(b.switch(rp, "0000:31:00.0", downstream)):
        bdf = f"0000:{0x33 + i:02x}:00.0"
        b.gaudi(port, bdf, i, ports=ports)
        out.gpus.append(bdf)
        out.rdma.extend(f"hbl_{i * ports + k}" for k in range(ports))
    b.loopback()
    return out


def aux_rdma_node(b: SysfsBuilder) -> Small:
    """A GPU whose RDMA-capable port is not a PCI function: the interface and its RDMA device
    hang off a device on the auxiliary bus (as on accelerator platforms with on-package NICs)."""
    out = Small()
    rb = b.root_bus("pci0000:40")
    rp = b.bridge(rb, "0000:40:01.0", 0)
    b.gpu(rp, "0000:41:00.0", numa=0)
    out.gpus.append("0000:41:00.0")
    aux = b.bus_device(f"{rb}/0000:40:01.0/0000:41:00.0", "accel_eth.0", "auxiliary")
    b.netdev("hbl0", aux, mtu=8192)
    b.rdma(aux, "hbl_0", [Port(netdev="hbl0")])
    out.netdevs.append("hbl0")
    out.rdma.append("hbl_0")
    b.loopback()
    return out


MI300X_HIVE = 0x5F3C2A1B00D7E9C1
# The AMD Instinct MI300X Platform: 8 MI300X OAM GPUs, each linked to the 7 others by Infinity
# Fabric (XGMI), 192 GB HBM3 per GPU, 1.5 TB in all (AMD, "AMD Instinct MI300X Platform",
# https://www.amd.com/en/products/accelerators/instinct/mi300/platform.html, and the MI300X data
# sheet, https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/
# amd-instinct-mi300x-data-sheet.pdf). The driver's `mem_info_vram_total` on one is
# 206141652992 bytes (196592 MiB: what `rocm-smi --showmeminfo vram` prints on an MI300X).
MI300X_GPUS = 8
MI300X_VRAM_BYTES = 206141652992
MI300X_PRODUCT = "AMD Instinct MI300X OAM"
MI300X_RAS_BLOCKS = ("umc", "gfx", "sdma", "xgmi_wafl")


def mi300x_unique_id(i: int) -> int:
    """GPU i's serial (a fixture value: the driver's 64-bit unique_id)."""
    return 0x6E5D4C3B2A190000 + i


def amd_mi300x(
    b: SysfsBuilder,
    *,
    hive_id: int = MI300X_HIVE,
    gpus: int = MI300X_GPUS,
    amdgpu: bool = False,
) -> Small:
    """An AMD MI300X node: each GPU behind its own switch with a NIC, all GPUs in one XGMI hive
    (KFD nodes 0-1 are the CPUs, 2.. the GPUs, each GPU's io_links naming every other GPU).
    `amdgpu`: also the files the amdgpu driver writes per GPU (`SysfsBuilder.amdgpu`: serial,
    VRAM size, FRU product name, RAS error counts all zero) and each KFD node's `unique_id`."""
    out = Small()
    paths: list[str] = []
    for i, bus in enumerate(HGX_BUSES[:gpus]):
        socket = 0 if i < gpus // 2 else 1
        rb = b.root_bus(f"pci0000:{bus:02x}")
        rp = b.bridge(rb, f"0000:{bus:02x}:01.0", socket)
        dsp = b.switch(
            rp,
            f"0000:{bus + 1:02x}:00.0",
            [f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 2:02x}:01.0"],
            socket,
        )
        gpu = f"0000:{bus + 3:02x}:00.0"
        paths.append(
            b.gpu(dsp[0], gpu, vendor=AMD, device="0x74a1", pci_class=CLASS_ACCEL, numa=socket)
        )
        nic = f"0000:{bus + 4:02x}:00.0"
        netdev = f"enp{bus + 4}s0np0"
        pf = b.nic(dsp[1], nic, netdev, numa=socket)
        b.rdma(pf, f"mlx5_{i}", [Port(netdev=netdev)])
        out.gpus.append(gpu)
        out.nics.append(nic)
        out.netdevs.append(netdev)
    b.kfd_cpu(0)
    b.kfd_cpu(1)
    nodes = list(range(2, 2 + gpus))
    for i, (node, gpu) in enumerate(zip(nodes, out.gpus, strict=True)):
        peers = [n for n in nodes if n != node] if hive_id else []
        serial = mi300x_unique_id(i) if amdgpu else None
        b.kfd_gpu(node, gpu, hive_id, peers, unique_id=serial)
        if amdgpu:
            b.amdgpu(
                paths[i],
                unique_id=f"{mi300x_unique_id(i):016x}",
                vram_bytes=MI300X_VRAM_BYTES,
                product_name=MI300X_PRODUCT,
                ras={
                    block: "ue: 0\nce: 0\nde: 0\n" if block == "umc" else "ue: 0\nce: 0\n"
                    for block in MI300X_RAS_BLOCKS
                },
            )
    b.loopback()
    return out


def nvml_fabric(
    state: str, status: str = "success", cluster: str | None = None, clique: int | None = 1
) -> dict[str, Any]:
    """One `fabric` answer as NVML gives it (see h100_snapshot's `fabric=`)."""
    return {
        "clusterUuid": cluster if cluster is not None else "5b0e1122-3344-5566-7788-99aabbccddef",
        "cliqueId": clique,
        "state": state,
        "status": status,
    }


def discover_at(
    root: Path,
    snapshot: dict[str, Any] | None = None,
    *,
    previous: Previous | None = None,
    now: datetime | None = None,
) -> Discovery:
    """One discovery pass over the tree at `root`, with `snapshot` (if any) as NVML's answers,
    read through the same loader `--nvml-snapshot` uses."""
    source = None
    if snapshot is not None:
        readings = load_snapshot(write_json(root.parent / f"{root.name}-nvml.json", snapshot))
        source = lambda: readings  # noqa: E731
    tree = SysfsTree(root)
    try:
        return discover(tree, nvml_source=source, previous=previous, now=now)
    finally:
        close = getattr(tree, "close", None)
        if close is not None:
            close()


def aws_efa_node(b: SysfsBuilder, efas: int = 2, *, down: tuple[int, ...] = ()) -> Small:
    """An AWS GPU node's slice as its kernel lays it out (a p5 has 4 EFA functions per GPU,
    8 GPUs): one PCIe switch holding a GPU and `efas` EFA functions (`efa_<i>`, none with a
    netdev), and the ENA function that carries the node's IP traffic (vendor 0x1d0f too,
    device 0xec20, driver `ena`, netdev `ens32`; no RDMA device). `down`: EFA ports that are
    down. `nics` are the EFA bus ids, `rdma` their RDMA device names."""
    out = Small()
    rp = b.bridge(b.root_bus("pci0000:40"), "0000:40:01.0", 0)
    ports = b.switch(rp, "0000:41:00.0", [f"0000:42:{i:02x}.0" for i in range(efas + 1)])
    out.gpus.append("0000:50:00.0")
    b.gpu(ports[0], "0000:50:00.0", numa=0)
    for i in range(efas):
        bdf = f"0000:{0x51 + i:02x}:00.0"
        port = replace(DOWN, link_layer="Unknown") if i in down else None
        b.efa(ports[i + 1], bdf, f"efa_{i}", port=port)
        out.nics.append(bdf)
        out.rdma.append(f"efa_{i}")
    ena_rp = b.bridge(b.root_bus("pci0000:00"), "0000:00:05.0", 0)
    b.nic(ena_rp, "0000:01:00.0", "ens32", vendor=AMAZON, device="0xec20", driver="ena")
    out.netdevs.append("ens32")
    b.loopback()
    return out
