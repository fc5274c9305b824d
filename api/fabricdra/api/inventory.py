"""The node inventory record: what discovery found, in the shape every other part reads.

One schema serves the `fabricdra inventory` command, the `NodeDevices` custom resource and the
ResourceSlice builder, so a fact means the same thing wherever it is read. Field names are the
wire names (camelCase); an unknown fact is `None` (null on the wire), never a stand-in value.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

# Records are stdlib dataclasses that pydantic validates and describes (api/records.py): the
# inventory command makes and prints them without importing pydantic (issue 21 point 7).
from .records import Field, Record

LinkVerdict = Literal["OK", "Unverified", "Failed"]


class PciTopology(Record):
    """Where a PCI function sits. Every field comes from one walk of the device's sysfs path,
    shared by interfaces and accelerators so the coordinates compare equal across the two."""

    pciRootId: str | None = Field(
        default=None,
        description="The outermost PCI bridge above the device (the root port), not the root "
        "complex. None for a function directly on the root bus.",
    )
    pciSwitches: list[str] = Field(
        default_factory=list,
        description="The full upstream bridge path, innermost first.",
    )
    pcieRoot: str | None = Field(
        default=None,
        description="The PCIe root complex (host bridge) as `pci<domain>:<bus>`, the meaning of "
        "Kubernetes' resource.kubernetes.io/pcieRoot attribute.",
    )


class PortReading(Record):
    """One RDMA port's two state files, verbatim (`4: ACTIVE`, `5: LinkUp`). None = unreadable."""

    port: int
    state: str | None = None
    physState: str | None = None


class LinkRecord(Record):
    """The RDMA link verdict of one RDMA device, from its ports' state files."""

    verdict: LinkVerdict
    ports: list[PortReading] = Field(default_factory=list)
    since: datetime | None = Field(
        default=None,
        description="Failed only: when the failure was first seen; stable while it persists.",
    )
    reason: str | None = Field(default=None, description="Why the verdict is not OK.")


class Endpoint(Record):
    """Facts shared by an interface and a virtual function: one PCI function and its RDMA side."""

    name: str | None = Field(description="Kernel interface name; None for a VF with no netdev.")
    pciBusId: str | None = None
    numaNode: int | None = None
    cpuAffinity: str | None = Field(default=None, description="The kernel's local_cpulist.")
    driver: str | None = None
    mtu: int | None = None
    up: bool | None = None
    rdma: bool = Field(default=False, description="An RDMA device is bound (not: the link works).")
    rdmaDevice: str | None = None
    verbsDevice: str | None = Field(default=None, description="e.g. uverbs3 (/dev/infiniband/…).")
    linkLayer: str | None = None
    link: LinkRecord | None = None
    topology: PciTopology = Field(default_factory=PciTopology)


ScaleOutSource = Literal["measured", "declared"]
NetRole = Literal["compute", "storage", "frontend"]


class Neighbour(Record):
    """The switch port a NIC is cabled to (issue 27): measured (an InfiniBand directed-route
    SMP query of the peer, or the LLDPDUs the switch sends) or declared (the topology file)."""

    switch: str = Field(
        description="The switch's id: its InfiniBand node GUID (0x…) or LLDP chassis id; "
        "declared: the name the topology file gives it."
    )
    port: str | None = Field(
        default=None, description="The switch port (IB port number, LLDP port id)."
    )
    name: str | None = Field(
        default=None, description="IB NodeDescription or LLDP system name, verbatim."
    )
    source: ScaleOutSource
    via: str = Field(description="How it was read: smp, lldp, lldpd or topology-file.")


class ScaleOut(Record):
    """One RDMA physical function's place in the scale-out fabric. Unknown = None; a reading
    that failed sets `error` and is never published as "no neighbour"."""

    portGuid: str | None = None
    subnetPrefix: str | None = Field(default=None, description="From the port's GID table (IB).")
    lid: int | None = None
    smLid: int | None = None
    rateGbps: float | None = None
    neighbour: Neighbour | None = Field(
        default=None, description="The measured neighbour, else the declared one."
    )
    declaredNeighbour: Neighbour | None = Field(
        default=None, description="The topology file's, kept when it disagrees with `neighbour`."
    )
    disagreement: str | None = Field(
        default=None, description="Where the topology file and a measurement disagree, and how."
    )
    rail: int | None = None
    railSource: ScaleOutSource | None = None
    role: NetRole | None = None
    roleSource: str | None = Field(
        default=None, description="gpu-distance, selector or topology-file."
    )
    error: str | None = Field(default=None, description="Why a reading failed (never absence).")


class VirtualFunction(Endpoint):
    """An SR-IOV VF, nested under its physical function. It shares the parent's upstream bridge
    path; its NUMA node is its own."""

    index: int = Field(description="N of the parent's virtfnN link.")


class Interface(Endpoint):
    """One kernel network interface from /sys/class/net."""

    name: str
    bus: str = Field(
        description="Subsystem of the device the interface hangs off (pci, auxiliary, virtio, …); "
        "empty for a virtual interface."
    )
    virtual: bool
    sriovPhysicalFunction: bool | None = None
    sriovVfsConfigured: bool | None = None
    virtualFunctions: list[VirtualFunction] = Field(default_factory=list)
    scaleOut: ScaleOut | None = Field(
        default=None, description="RDMA physical functions: scale-out coordinates (issue 27)."
    )

    def endpoints(self) -> list[Endpoint]:
        """This interface and its virtual functions, the units the RDMA rules count."""
        return [self, *self.virtualFunctions]


class Fabric(Record):
    """Membership of an accelerator in a scale-up fabric domain, present only when established."""

    kind: Literal["nvlink", "xgmi"]
    id: str = Field(description="NVLink cluster UUID (32 lowercase hex) or XGMI hive id (hex).")
    cliqueId: int | None = None
    memberCount: int | None = Field(default=None, description="Domain size, when reported.")
    domain: str = Field(description="The comparable domain name, as in fabricdra.io/fabric.domain.")


class FabricRegistration(Record):
    """NVIDIA's raw fabric registration reading, kept even when it establishes no membership."""

    state: str
    status: str
    clusterUuid: str | None = None
    cliqueId: int | None = None


class AcceleratorTopology(PciTopology):
    fabric: Fabric | None = None


class MigDevice(Record):
    uuid: str
    name: str | None = None
    profile: str | None = None
    deviceClass: str | None = None
    memoryMiB: int | None = None
    gpuInstanceId: int | None = None
    computeInstanceId: int | None = None


class Accelerator(Record):
    vendor: str
    vendorId: str
    deviceId: str | None = None
    pciBusId: str
    numaNode: int | None = None
    cpuAffinity: str | None = None
    driver: str | None = None
    productName: str | None = None
    deviceClass: str | None = None
    uuid: str | None = None
    memoryMiB: int | None = None
    migMode: bool | None = None
    migDevices: list[MigDevice] = Field(default_factory=list)
    fabricRegistration: FabricRegistration | None = None
    topology: AcceleratorTopology = Field(default_factory=AcceleratorTopology)


class AcceleratorGroup(Record):
    """The accelerators of one vendor (the unit a per-vendor detector owns)."""

    vendor: str
    accelerators: list[Accelerator]


def group_accelerators(accelerators: list[Accelerator]) -> list[AcceleratorGroup]:
    vendors = sorted({a.vendor for a in accelerators})
    return [
        AcceleratorGroup(vendor=v, accelerators=[a for a in accelerators if a.vendor == v])
        for v in vendors
    ]
