"""One discovery pass over a node: inventory, link verdicts, accelerators and labels.

Pure: a sysfs tree (and NVML readings) in, typed records out. The callers — the `inventory`
command and the kubelet plugin — log, write and publish; nothing here does I/O beyond reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fabricdra.api.deviceclasses import DeviceClassTable, load_device_classes
from fabricdra.api.inventory import Accelerator, Endpoint, Interface, LinkRecord

from . import accelerators as accel
from . import interfaces as ifaces
from .amd import KfdReadings
from .backends import AmdReadings, VendorPass, registry
from .backends import NvmlSource as NvmlSource  # callers name it here
from .labels import NodeLabels, compute_labels
from .nvml import NvmlReadings
from .rdma import merge_first_seen, read_rdma_index
from .scaleout.annotate import ScaleOutInputs, annotate
from .sysfs import SysfsTree


@dataclass(frozen=True, slots=True)
class Previous:
    """What the last pass recorded (None lists: that part was never recorded)."""

    interfaces: list[Interface] | None = None
    accelerators: list[Accelerator] | None = None


@dataclass(frozen=True, slots=True)
class Discovery:
    interfaces: list[Interface] | None
    accelerators: list[Accelerator] | None
    labels: NodeLabels
    # Enumeration failures, by part ("interfaces", "accelerators"): the part above is the
    # previous record kept as it was (or None when there was none), never an empty list.
    failures: dict[str, str] = field(default_factory=dict)
    # Each vendor backend's readings this pass (health and publishing read them); None where
    # the node has none of that vendor's GPUs, or no source was given.
    nvml: NvmlReadings | None = None
    kfd: KfdReadings | None = None
    amd: AmdReadings | None = None  # the amdgpu driver's files (+ `kfd`), for AMD health

    def record_equals(self, other: Discovery | None) -> bool:
        """Whether the published record would change: the cheap check before any write."""
        return (
            other is not None
            and self.interfaces == other.interfaces
            and self.accelerators == other.accelerators
            and self.labels == other.labels
        )


def discover(
    tree: SysfsTree,
    nvml_source: NvmlSource | None = None,
    previous: Previous | None = None,
    now: datetime | None = None,
    classes: DeviceClassTable | None = None,
    scaleout: ScaleOutInputs | None = None,
) -> Discovery:
    now = now or datetime.now(UTC).replace(microsecond=0)
    previous = previous or Previous()
    classes = classes or load_device_classes()
    failures: dict[str, str] = {}

    interfaces: list[Interface] | None
    try:
        interfaces = ifaces.read_interfaces(tree, read_rdma_index(tree, now))
        interfaces = _merge_link_history(interfaces, previous.interfaces)
    except ifaces.EnumerationError as e:
        failures["interfaces"] = f"cannot enumerate network interfaces: {e}"
        interfaces = previous.interfaces

    accelerators: list[Accelerator] | None
    vendors: dict[str, VendorPass[Any]] = {}
    fabric_readable, members_readable = True, True
    complete = True  # every PCI function's vendor and class could be read
    try:
        scan = accel.find_accelerators(tree)
        candidates = scan.candidates
        complete = not scan.unreadable
        vendors = accel.read_vendors(tree, candidates, registry(nvml_source))
        accelerators = accel.describe_accelerators(tree, candidates, vendors, classes)
        fabric_readable, members_readable = _fabric_readable(accelerators, vendors)
    except accel.EnumerationError as e:
        failures["accelerators"] = f"cannot enumerate PCI devices: {e}"
        accelerators = previous.accelerators
        fabric_readable = False

    if "interfaces" not in failures and interfaces is not None:
        # Rails are "the NIC beside GPU i": said against the accelerator record this pass
        # publishes (the previous one where PCI enumeration failed, so a transient failure
        # does not flap every rail), never against a scan that left functions unread.
        known = accelerators if complete else None
        interfaces = annotate(tree, interfaces, known, scaleout or ScaleOutInputs())

    labels = compute_labels(
        None if "interfaces" in failures else interfaces,
        # An unread PCI function may be an accelerator: the answers about "every accelerator"
        # and "the closest pair" are then unknown, though the ones read are recorded.
        None if "accelerators" in failures or not complete else accelerators,
        fabric_readable=fabric_readable,
        members_readable=members_readable,
    )
    nvidia = vendors.get(accel.NVIDIA)
    amd = vendors.get(accel.AMD)
    nvml = nvidia.readings if nvidia is not None else None
    amd_readings = amd.readings if amd is not None else None
    return Discovery(
        interfaces=interfaces,
        accelerators=accelerators,
        labels=labels,
        failures=failures,
        nvml=nvml if isinstance(nvml, NvmlReadings) else None,
        kfd=amd_readings.kfd if isinstance(amd_readings, AmdReadings) else None,
        amd=amd_readings if isinstance(amd_readings, AmdReadings) else None,
    )


def _fabric_readable(
    accelerators: list[Accelerator], vendors: dict[str, VendorPass[Any]]
) -> tuple[bool, bool]:
    """(domain readable, member count readable): a fabric nobody could ask about is unknown,
    not absent, and so is a hive size whose links could not all be read. Each vendor's backend
    says for its own GPUs; a vendor without one has no fabric to ask about."""
    domain, members = True, True
    for a in accelerators:
        vendor = vendors.get(a.vendorId)
        if vendor is None:
            continue
        d, m = vendor.fabric_known(a.pciBusId)
        domain, members = domain and d, members and m
    return domain, domain and members


def _endpoint_key(ep: Endpoint) -> tuple[str | None, str | None]:
    return (ep.pciBusId or ep.name, ep.rdmaDevice)


def _merge_link_history(
    current: list[Interface], previous: list[Interface] | None
) -> list[Interface]:
    if not previous:
        return current
    before: dict[tuple[str | None, str | None], LinkRecord] = {}
    for iface in previous:
        for ep in iface.endpoints():
            if ep.link is not None and ep.link.verdict == "Failed":
                before[_endpoint_key(ep)] = ep.link
    if not before:
        return current

    def merged(ep: Endpoint) -> LinkRecord | None:
        if ep.link is None:
            return None
        return merge_first_seen(ep.link, before.get(_endpoint_key(ep)))

    out: list[Interface] = []
    for iface in current:
        vfs = [vf.model_copy(update={"link": merged(vf)}) for vf in iface.virtualFunctions]
        out.append(iface.model_copy(update={"link": merged(iface), "virtualFunctions": vfs}))
    return out
