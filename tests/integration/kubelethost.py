"""A node for the kubelet-plugin tests: an 8-GPU HGX sysfs tree, recorded NVML answers, and
the host files prepare reads — real character devices (mknod) in a "dev root" and the NVIDIA
driver's /proc files in a "proc root" — plus ResourceClaims in the real API server.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceConfig, DeviceInventory
from fabricdra.kubeletplugin.discovery.node import Discovery, discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.hostdevices import HostLayout
from fabricdra.kubeletplugin.kinds import rdma
from tests.sysfs.builder import UP, SysfsBuilder
from tests.sysfs.nodes import Hgx, dgx_h100, h100_snapshot, hgx_h100, rdma_node

DRIVER = "devices.fabricdra.io"
NVIDIA_MAJOR, UVERBS_MAJOR, MISC_MAJOR, UVM_MAJOR, CAPS_MAJOR = 195, 231, 10, 510, 511


# The first processor of a DGX H100's /proc/cpuinfo (2 x Intel Xeon Platinum 8480C, DGX H100
# User Guide, https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html;
# Sapphire Rapids is family 6 model 143 = 0x8F, the model NCCL's topo.cc tests for).
DGX_H100_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480C
stepping\t: 8
physical id\t: 0
cpu cores\t: 56

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
"""


@dataclass
class Host:
    root: Path
    hgx: Hgx
    discovery: Discovery
    layout: HostLayout
    nvml_snapshot: Path

    def inventory(self, config: DeviceConfig | None = None) -> DeviceInventory:
        d = self.discovery
        return build_devices(d.interfaces or [], d.accelerators or [], config or DeviceConfig())


def mknod(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))


def build_host(
    root: Path,
    *,
    vf_nics: tuple[int, ...] = (6, 7),
    broken_nics: tuple[int, ...] = (),
    mig_gpu: int | None = None,
    rdma_cm: bool = True,
    dgx: bool = False,
) -> Host:
    """`dgx`: a DGX H100 (tests/sysfs/nodes.py `dgx_h100`: InfiniBand rail HCAs, link files on
    every bridge, its CPUs in /proc/cpuinfo) instead of the plain HGX board."""
    b = SysfsBuilder(root / "sys")
    if dgx:
        hgx = dgx_h100(b)
    else:
        hgx = hgx_h100(b, vf_nics=vf_nics, vfs_per_nic=2, broken_nics=broken_nics)
    snapshot = root / "nvml.json"
    snapshot.write_text(json.dumps(h100_snapshot(hgx.gpus, mig_gpu=mig_gpu)))
    discovery = discover(SysfsTree(root / "sys"), lambda: load_snapshot(snapshot))
    dev, proc = root / "dev", root / "proc"
    if dgx:
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "cpuinfo").write_text(DGX_H100_CPUINFO)
    for i, bus in enumerate(hgx.gpus):
        info = proc / "driver" / "nvidia" / "gpus" / bus / "information"
        info.parent.mkdir(parents=True)
        info.write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nBus Location: \t {bus}\nDevice Minor: \t {i}\n"
        )
        mknod(dev / f"nvidia{i}", NVIDIA_MAJOR, i)
    mknod(dev / "nvidiactl", NVIDIA_MAJOR, 255)
    mknod(dev / "nvidia-uvm", UVM_MAJOR, 0)
    if mig_gpu is not None:  # the MIG access capabilities of gi1/ci0 and gi2/ci0
        caps = proc / "driver" / "nvidia" / "capabilities" / f"gpu{mig_gpu}" / "mig"
        for n, gi in enumerate((1, 2)):
            for rel, minor in ((f"gi{gi}/access", 10 * n + 1), (f"gi{gi}/ci0/access", 10 * n + 2)):
                (caps / rel).parent.mkdir(parents=True, exist_ok=True)
                (caps / rel).write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\n")
                mknod(dev / "nvidia-caps" / f"nvidia-cap{minor}", CAPS_MAJOR, minor)
    for iface in discovery.interfaces or []:
        for ep in iface.endpoints():
            if ep.verbsDevice:
                mknod(
                    dev / "infiniband" / ep.verbsDevice, UVERBS_MAJOR, 192 + int(ep.verbsDevice[6:])
                )
    if rdma_cm:
        mknod(dev / "infiniband" / "rdma_cm", MISC_MAJOR, 58)
    return Host(root, hgx, discovery, HostLayout(dev, proc, root / "sys"), snapshot)


@dataclass
class RdmaHost:
    """A node with many RDMA NICs (mlx5_0 ... mlx5_<n-1>) on one PCIe switch, no GPU."""

    root: Path
    rdma: list[str]
    discovery: Discovery
    layout: HostLayout

    def inventory(self, config: DeviceConfig | None = None) -> DeviceInventory:
        d = self.discovery
        return build_devices(d.interfaces or [], d.accelerators or [], config or DeviceConfig())

    def device(self, rdma_device: str) -> str:
        """The inventory name of the endpoint bound to `rdma_device`."""
        for d in self.inventory():
            if d.type == "rdma" and rdma.payload_of(d).endpoint.rdmaDevice == rdma_device:
                return d.name
        raise KeyError(rdma_device)


def build_rdma_host(root: Path, hcas: int = 16) -> RdmaHost:
    """`hcas` NICs, so RDMA device names share prefixes (mlx5_1, mlx5_10 ... mlx5_15)."""
    b = SysfsBuilder(root / "sys")
    node = rdma_node(b, [[UP] for _ in range(hcas)], gpu=False)
    discovery = discover(SysfsTree(root / "sys"))
    dev = root / "dev"
    for iface in discovery.interfaces or []:
        for ep in iface.endpoints():
            if ep.verbsDevice:
                mknod(
                    dev / "infiniband" / ep.verbsDevice, UVERBS_MAJOR, 192 + int(ep.verbsDevice[6:])
                )
    mknod(dev / "infiniband" / "rdma_cm", MISC_MAJOR, 58)
    return RdmaHost(root, node.rdma, discovery, HostLayout(dev, root / "proc", root / "sys"))


def create_claim(
    api: Any,
    namespace: str,
    name: str,
    results: list[dict[str, Any]],
    *,
    requests: tuple[str, ...] | None = None,
    config: list[dict[str, Any]] | None = None,
) -> str:
    """A ResourceClaim whose allocation is written through the status subresource (as the
    scheduler does); returns its UID. `results` are allocation results (driver and pool
    default to ours; `pool` must be given)."""
    from kubernetes import client

    resource = client.ResourceV1Api(api)
    names = requests or tuple(dict.fromkeys(r["request"].split("/")[0] for r in results))
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": n, "exactly": {"deviceClassName": "fabricdra-test"}} for n in names
                ]
            }
        },
    }
    created = resource.create_namespaced_resource_claim(namespace, body)
    allocation: dict[str, Any] = {
        "devices": {"results": [{"driver": DRIVER, **r} for r in results]}
    }
    if config:  # the allocation's copy of the claim's and classes' configuration
        allocation["devices"]["config"] = config
    resource.patch_namespaced_resource_claim_status(
        name, namespace, {"status": {"allocation": allocation}}
    )
    return str(created.metadata.uid)
