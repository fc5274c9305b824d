"""Whole nodes, built from the kernel-shaped pieces in builder.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .builder import DOWN, INTEL, Port, SysfsBuilder

# An HGX H100 board as a 2-socket x86 server lays it out: eight host bridges, each with a root
# port, a PCIe switch, and one GPU and one NIC on two of the switch's downstream ports.
HGX_BUSES = [0x15, 0x37, 0x48, 0x59, 0x97, 0xA8, 0xB9, 0xCA]
SOCKET_CPUS = {0: "0-55,112-167", 1: "56-111,168-223"}


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
        rp0, "0000:01:00.0", "eno1", vendor=INTEL, device="0x1572", numa=0 if numa else -1, mtu=1500
    )
    b.loopback()
    b.netdev("docker0", None, operstate="down", flags=0x1003)
    return out


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
            "eccUncorrectable": 0,
            "thermalViolation": False,
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


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path
