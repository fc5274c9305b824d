"""Accelerators: found by PCI vendor and class, placed by the shared PCI walk, and described by
their vendor's own source (NVML for NVIDIA, the KFD topology for AMD)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fabricdra.api.deviceclasses import DeviceClassTable, mig_profile
from fabricdra.api.inventory import (
    Accelerator,
    AcceleratorTopology,
    Fabric,
    FabricRegistration,
    MigDevice,
)

from .amd import KfdReadings
from .nvml import NvmlReadings, SnapshotGpu, SnapshotMigDevice
from .pci import read_function
from .sysfs import Absent, SysfsTree, Unreadable

PCI_DEVICES = "bus/pci/devices"

VENDORS = {
    "0x10de": "nvidia",
    "0x1002": "amd",
    "0x8086": "intel",
    "0x1da3": "habana",
    "0x19e5": "huawei",
    "0x1e52": "tenstorrent",
}
NVIDIA = "0x10de"
AMD = "0x1002"
GPU_VENDORS = {NVIDIA, AMD}
# PCI class (top 16 bits): display controllers count for GPU vendors only (a BMC's VGA is not an
# accelerator); "processing accelerators" (0x12xx) count for every vendor.
DISPLAY_CLASSES = {0x0300, 0x0302, 0x0380}
PROCESSING_ACCELERATOR = 0x12


class EnumerationError(Exception):
    """The PCI device list could not be read."""


def _is_accelerator(vendor: str, pci_class: int) -> bool:
    base_sub = pci_class >> 8
    if pci_class >> 16 == PROCESSING_ACCELERATOR:
        return True
    return vendor in GPU_VENDORS and base_sub in DISPLAY_CLASSES


@dataclass(frozen=True, slots=True)
class Candidate:
    """A PCI function that is an accelerator by vendor and class, before vendor details."""

    bus_id: str
    vendor_id: str
    device_id: str | None
    path: str


@dataclass(frozen=True, slots=True)
class PciScan:
    candidates: list[Candidate]
    # PCI functions whose vendor or class could not be read: any of them may be an accelerator,
    # so the node-level answers that need every accelerator (fabric, distance) are unknown.
    unreadable: list[str]


def find_accelerators(tree: SysfsTree) -> PciScan:
    """Scan bus/pci/devices once. Raises EnumerationError when the list cannot be read."""
    entries = tree.listdir(PCI_DEVICES)
    if isinstance(entries, Absent | Unreadable):
        raise EnumerationError(str(entries))
    found: list[Candidate] = []
    unreadable: list[str] = []
    for bus_id in entries:
        base = f"{PCI_DEVICES}/{bus_id}"
        vendor = tree.read(f"{base}/vendor")
        pci_class = tree.read_int(f"{base}/class", 16)
        if isinstance(vendor, Unreadable) or isinstance(pci_class, Unreadable):
            unreadable.append(bus_id)
            continue
        if isinstance(vendor, Absent) or isinstance(pci_class, Absent):
            continue
        if not _is_accelerator(vendor.lower(), pci_class):
            continue
        if tree.exists(f"{base}/physfn"):
            continue  # an SR-IOV VF of a GPU (vGPU): its parent is the accelerator
        path = tree.resolve(base)
        if isinstance(path, Absent | Unreadable):
            continue
        device = tree.read(f"{base}/device")
        found.append(
            Candidate(
                bus_id=bus_id,
                vendor_id=vendor.lower(),
                device_id=device.lower() if isinstance(device, str) else None,
                path=path,
            )
        )
    return PciScan(candidates=found, unreadable=unreadable)


def describe_accelerators(
    tree: SysfsTree,
    candidates: list[Candidate],
    nvml: NvmlReadings | None,
    kfd: KfdReadings | None,
    classes: DeviceClassTable,
) -> list[Accelerator]:
    found: list[Accelerator] = []
    for c in candidates:
        fn = read_function(tree, c.path)
        if fn is None:
            continue
        acc = Accelerator(
            vendor=VENDORS.get(c.vendor_id, f"pci-{c.vendor_id[2:]}"),
            vendorId=c.vendor_id,
            deviceId=c.device_id,
            pciBusId=fn.bus_id,
            numaNode=fn.numa_node,
            cpuAffinity=fn.cpu_affinity,
            driver=fn.driver,
            topology=AcceleratorTopology(**fn.topology.model_dump()),
        )
        if c.vendor_id == NVIDIA:
            acc = _with_nvml(acc, nvml, classes)
        elif c.vendor_id == AMD:
            acc = _with_kfd(acc, kfd, classes)
        else:
            acc = _with_class(acc, classes)
        found.append(acc)
    return sorted(found, key=lambda a: a.pciBusId)


def _with_class(acc: Accelerator, classes: DeviceClassTable) -> Accelerator:
    cls = classes.classify(acc.productName, acc.vendorId, acc.deviceId)
    if cls is None:
        return acc
    update: dict[str, object] = {"deviceClass": cls.name}
    if acc.productName is None:
        update["productName"] = cls.label
    return acc.model_copy(update=update)


def _with_nvml(
    acc: Accelerator, nvml: NvmlReadings | None, classes: DeviceClassTable
) -> Accelerator:
    gpu = nvml.gpus.get(acc.pciBusId) if nvml and nvml.available else None
    if gpu is None:
        return _with_class(acc, classes)
    cls = classes.classify(gpu.name, acc.vendorId, acc.deviceId)
    migs = [
        MigDevice(
            uuid=m.uuid,
            name=m.name,
            profile=_profile(m.name),
            deviceClass=classes.mig_class(cls, m.name),
            memoryMiB=m.memoryTotalMiB,
            gpuInstanceId=m.gpuInstanceId,
            computeInstanceId=m.computeInstanceId,
        )
        for m in sorted(gpu.migDevices, key=_mig_order)
    ]
    registration, fabric = _nvlink(gpu)
    return acc.model_copy(
        update={
            "productName": gpu.name,
            "deviceClass": cls.name if cls else None,
            "uuid": gpu.uuid,
            "memoryMiB": gpu.memoryTotalMiB,
            "migMode": gpu.migMode,
            "migDevices": migs,
            "fabricRegistration": registration,
            "topology": acc.topology.model_copy(update={"fabric": fabric}),
        }
    )


def _mig_order(m: SnapshotMigDevice) -> tuple[int, int, str]:
    return (m.gpuInstanceId or 0, m.computeInstanceId or 0, m.uuid)


def _profile(name: str | None) -> str | None:
    return mig_profile(name) if name else None


_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def canonical_cluster_uuid(value: str | None) -> str | None:
    """Any UUID spelling -> 32 lowercase hex; None when it is not a UUID."""
    if value is None:
        return None
    h = value.strip().lower().replace("-", "")
    if h.startswith("0x"):
        h = h[2:]
    return h if _HEX32.match(h) else None


def _nvlink(gpu: SnapshotGpu) -> tuple[FabricRegistration | None, Fabric | None]:
    """The fabric record appears only once registration completed without error and named a
    non-zero cluster: an ordinary card answers `not_supported` with zeros, and publishing that
    would put every such machine in one shared domain."""
    f = gpu.fabric
    if f is None:
        return None, None
    cluster = canonical_cluster_uuid(f.clusterUuid)
    registration = FabricRegistration(
        state=f.state, status=f.status, clusterUuid=cluster, cliqueId=f.cliqueId
    )
    ok = f.state == "completed" and f.status.lower() in ("success", "nvml_success")
    if not ok or cluster is None or int(cluster, 16) == 0:
        return registration, None
    clique = f.cliqueId
    domain = f"nvlink-{cluster}" if clique is None else f"nvlink-{cluster}-{clique}"
    return registration, Fabric(kind="nvlink", id=cluster, cliqueId=clique, domain=domain)


def _with_kfd(acc: Accelerator, kfd: KfdReadings | None, classes: DeviceClassTable) -> Accelerator:
    acc = _with_class(acc, classes)
    reading = kfd.by_bus_id.get(acc.pciBusId) if kfd and kfd.available else None
    if reading is None or reading.hive_id == 0:
        return acc
    hive = format(reading.hive_id, "x")
    members = None if reading.peers is None else reading.peers + 1
    fabric = Fabric(kind="xgmi", id=hive, memberCount=members, domain=f"xgmi-{hive}")
    return acc.model_copy(update={"topology": acc.topology.model_copy(update={"fabric": fabric})})
