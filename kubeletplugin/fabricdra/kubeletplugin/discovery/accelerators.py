"""Accelerators: found by PCI vendor and class, placed by the shared PCI walk, and described by
their vendor's own source through the backend registry (backends/: NVML for NVIDIA, the amdgpu
driver's files and KFD for AMD)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fabricdra.api.deviceclasses import DeviceClassTable, mig_profile
from fabricdra.api.inventory import Accelerator, AcceleratorTopology, MigDevice

from .backends import AMD as AMD
from .backends import NVIDIA as NVIDIA
from .backends import (
    Function,
    GpuFacts,
    Registry,
    VendorPass,
    run,
)
from .backends import canonical_cluster_uuid as canonical_cluster_uuid
from .pci import read_function
from .sysfs import Absent, SysfsTree, Unreadable
from .vendors import ACCELERATOR_VENDORS

PCI_DEVICES = "bus/pci/devices"

VENDORS = ACCELERATOR_VENDORS
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


def read_vendors(
    tree: SysfsTree, candidates: list[Candidate], backends: Registry
) -> dict[str, VendorPass[Any]]:
    """Ask each vendor's backend once, about that vendor's functions only, and only where the
    node has some (a node without NVIDIA GPUs never loads NVML)."""
    out: dict[str, VendorPass[Any]] = {}
    for vendor_id, backend in backends.items():
        functions = [
            Function(bus_id=c.bus_id, device_id=c.device_id)
            for c in candidates
            if c.vendor_id == vendor_id
        ]
        if functions:
            out[vendor_id] = run(backend, tree, functions)
    return out


def describe_accelerators(
    tree: SysfsTree,
    candidates: list[Candidate],
    vendors: Mapping[str, VendorPass[Any]],
    classes: DeviceClassTable,
) -> list[Accelerator]:
    """The record of each accelerator: what the PCI walk gives, then its vendor backend's facts
    (`vendors`, from `read_vendors`); a vendor without a backend is classed by its PCI id."""
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
        vendor = vendors.get(c.vendor_id)
        found.append(with_facts(acc, vendor.facts(acc.pciBusId) if vendor else None, classes))
    return sorted(found, key=lambda a: a.pciBusId)


def with_facts(acc: Accelerator, facts: GpuFacts | None, classes: DeviceClassTable) -> Accelerator:
    """`acc` with what its vendor said; each fact the vendor did not answer stays unset."""
    if facts is None:
        return _with_class(acc, classes)
    cls = classes.classify(facts.product, acc.vendorId, acc.deviceId)
    if cls is None and facts.product and not facts.product_decides_class:
        cls = classes.classify(None, acc.vendorId, acc.deviceId)
    update: dict[str, object] = {
        "productName": facts.product or (cls.label if cls else acc.productName),
        "deviceClass": cls.name if cls else None,
    }
    if facts.uuid is not None:
        update["uuid"] = facts.uuid
    if facts.memory_mib is not None:
        update["memoryMiB"] = facts.memory_mib
    if facts.mig_mode is not None:
        update["migMode"] = facts.mig_mode
        update["migDevices"] = [
            MigDevice(
                uuid=m.uuid,
                name=m.name,
                profile=mig_profile(m.name) if m.name else None,
                deviceClass=classes.mig_class(cls, m.name),
                memoryMiB=m.memory_mib,
                gpuInstanceId=m.gpu_instance_id,
                computeInstanceId=m.compute_instance_id,
            )
            for m in facts.mig_devices
        ]
    if facts.registration is not None:
        update["fabricRegistration"] = facts.registration
    if facts.fabric is not None:
        update["topology"] = acc.topology.model_copy(update={"fabric": facts.fabric})
    return acc.model_copy(update=update)


def _with_class(acc: Accelerator, classes: DeviceClassTable) -> Accelerator:
    cls = classes.classify(acc.productName, acc.vendorId, acc.deviceId)
    if cls is None:
        return acc
    update: dict[str, object] = {"deviceClass": cls.name}
    if acc.productName is None:
        update["productName"] = cls.label
    return acc.model_copy(update=update)
