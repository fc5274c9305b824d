"""What a device kind is: the one place that says how its devices are built, published,
prepared and checked (issue 21; docs/adding-a-device-kind.md).

A kind is a small object satisfying `DeviceKind`. The registry (`kinds/__init__.py`) lists
them in order; `assembly.build_devices`, `resourceslices`, `prepare` and the health stream
iterate it instead of branching on a device's type or vendor.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from fabricdra.api.inventory import Accelerator, Endpoint, Interface, PciTopology

from ..kubelet.cdi import ContainerEdits, DeviceNode

if TYPE_CHECKING:
    from ..devices import Device, DeviceConfig, GpuHealth, GpuInfo, HeldAs
    from ..discovery.sysfs import SysfsTree
    from ..hostdevices import HostLayout
    from .nvidia.dynamicmig import DynamicMig
    from .nvidia.nvidiacdi import ToolkitSpecs


class Version(str):
    """An attribute value published as a semver `version` (CEL: `.compareTo(semver("12.4.0"))`)."""


@dataclass(frozen=True)
class NumaNodes:
    """A device on several NUMA nodes (a Grace GPU: its CPU's node and its HBM's). Published
    as a list (`ints`) where DRAListTypeAttributes is on, else as `scalar` (None: nothing)."""

    nodes: tuple[int, ...]
    scalar: int | None


Value = str | int | bool | NumaNodes | None


@dataclass(frozen=True)
class BuildInputs:
    """One discovery pass's records, as `assembly.build_devices` hands them to every kind."""

    interfaces: Sequence[Interface]
    accelerators: Sequence[Accelerator]
    config: DeviceConfig
    gpu_health: Mapping[str, GpuHealth]
    gpu_info: Mapping[str, GpuInfo]
    lost: Sequence[Accelerator]
    held: Mapping[str, HeldAs]
    created_mig: Collection[str]
    # The sysfs tree of this pass, for a kind that reads its own records (EFA); None where the
    # caller has none (library use): such a kind then offers nothing.
    sysfs: SysfsTree | None = None


@dataclass(frozen=True)
class PrepareContext:
    """What prepare lends a kind to serve one claim's device."""

    claim_uid: str
    host: HostLayout
    # Lent by the NVIDIA family (kinds/nvidia/claims.py `lend`); None: no toolkit specs.
    toolkit: ToolkitSpecs | None = None
    dynamic_mig: DynamicMig | None = None
    config: DeviceConfig | None = None  # the node's offer settings (None: the defaults)
    # Every NIC the claim was granted has a measured rail (docs/scale-out.md): NCCL may then
    # be told to keep each ring on one rail (NCCL_CROSS_NIC=0).
    rail_aligned: bool = False


@dataclass(frozen=True)
class Served:
    """How one granted device reaches the container: its own CDI device's edits, or a CDI id
    another spec already defines (`toolkit_id`: NVIDIA's container toolkit) in its place; and
    the claim-level CDI device it also includes (`group`, None: none)."""

    edits: ContainerEdits = field(default_factory=ContainerEdits)
    toolkit_id: str | None = None
    group: ClaimGroup | None = None


@dataclass(frozen=True)
class CounterUse:
    """What a device draws from a shared counter set: the set's name and whole capacity (the
    set is published once, in its own slice) and this device's share of it."""

    counter_set: str
    capacity: Mapping[str, int]
    consumed: Mapping[str, int]


class ClaimGroup(Protocol):
    """A CDI device made once per claim and included by every grant of the kinds that name it
    (NCCL_IB_HCA for RDMA, NVIDIA_VISIBLE_DEVICES=void for GPUs, the libfabric env for EFA)."""

    def device_name(self, claim_uid: str) -> str:
        """The claim-level CDI device's name (unique per claim, starts with a letter)."""
        ...

    def edits(
        self, ctx: PrepareContext, own_hcas: Sequence[str], hcas: Sequence[str]
    ) -> ContainerEdits:
        """Its edits. `own_hcas`: the claim's NCCL HCA names; `hcas`: the pod's
        (kinds/rdma/ncclenv.py)."""
        ...


class DeviceKind(Protocol):
    """One kind of device this driver offers (docs/adding-a-device-kind.md)."""

    @property
    def name(self) -> str:
        """The kind's registry name (`nvidia-gpu`, `rdma`, ...): logs, docs and tests."""
        ...

    @property
    def device_type(self) -> str:
        """The `type` attribute its devices publish (several kinds may share one: `gpu`)."""
        ...

    def build(self, inputs: BuildInputs) -> list[Device]:
        """Its devices on this node, from one discovery pass (any order)."""
        ...

    def owns(self, device: Device) -> bool:
        """Whether `device` is one of this kind's."""
        ...

    def attributes(self, device: Device) -> list[tuple[str, Value]]:
        """Published attributes besides `type` (None values are left out)."""
        ...

    def taint_value(self, device: Device) -> str:
        """What an Unhealthy device's `fabricdra.io/unhealthy` taint says (a label value)."""
        ...

    def serve(self, device: Device, ctx: PrepareContext) -> Served:
        """Its container edits; raises PrepareError (or DeviceNodeError) for what it cannot
        serve, with a message that names the device."""
        ...

    # Never hand out a device twice (coexistence.py): the group another advertiser would hand
    # this kind's devices out as (`--device-plugin-resource GROUP=...`), and the resource names
    # the ecosystem's device plugins advertise that group by on the Node's capacity. None: no
    # device plugin offers them.
    plugin_group: str | None = None
    device_plugin_resources: tuple[str, ...] = ()

    # Below: what most kinds do not have. A kind that subclasses DeviceKind inherits these
    # defaults (nothing) and overrides what applies; the members above it must define.

    def memory_mib(self, device: Device) -> int | None:
        """The `memory` capacity, MiB; None: none published."""
        return None

    def counts(self, device: Device) -> Mapping[str, int]:
        """Further integer capacities (a MIG instance's engines)."""
        return {}

    def counters(self, device: Device) -> CounterUse | None:
        """The shared counter set it draws on (partitionable devices, 1.36+); None: none."""
        return None

    def consumed(self, device: Device, result: Mapping[str, Any]) -> dict[str, int] | None:
        """What the allocation result of a share of `device` consumes of its capacities
        (`consumedCapacity`; prepare checks it against what the shares already prepared left:
        exclusivity.py); None: not offered with consumable capacity. PrepareError for what
        cannot be read."""
        return None

    def needs_partitionable(self, device: Device) -> bool:
        """Offered only where the API has partitionable devices (a dynamic MIG placement not
        created yet, the dynamic whole GPU): left out of the basic model's slices."""
        return False

    def nccl_hca(self, device: Device) -> str | None:
        """The HCA name NCCL_IB_HCA lists for this device; None: not an NCCL HCA."""
        return None

    def within(self, device: Device) -> str | None:
        """The name of the device this one is part of (a MIG instance's GPU, a VF's PF), so
        prepare's in-use check keeps the two apart (exclusivity.py); None: none."""
        return None

    def adapter(self, device: Device) -> Endpoint | None:
        """The device's own record where the NodeDevices record's interfaces and accelerators
        do not hold it (an EFA function has no netdev): recorded under `spec.adapters`, so
        every published device is in the record; None: they hold it."""
        return None

    def netdev(self, device: Device) -> str | None:
        """The network interface a grant's ResourceClaim status reports (networkstatus.py);
        None: none."""
        return None

    def holders(self, device: Device) -> bool:
        """Offered to `DeviceInventory.shared_holders` claims at once (a shared RDMA endpoint):
        published with a `holders` capacity, or as that many holder devices where the API has
        no consumable capacity."""
        return False

    def shareable(self, device: Device) -> bool:
        """Whether several claims may hold it at once (by holders, or a GPU offered with
        consumable capacity): prepare's in-use check lets them (exclusivity.py)."""
        return self.holders(device)

    def gone(self, device: Device) -> bool:
        """Kept published from its last record after leaving the node (a GPU that fell off
        the PCI bus): prepare refuses it."""
        return False

    def application_xids(self, device: Device) -> Sequence[int]:
        """Faults an application caused that the device reports (NVIDIA's application Xids):
        published as an informative taint."""
        return ()

    def trouble_since(self, device: Device) -> datetime | None:
        """When its fault was first seen (a failed link's time): the taint's `timeAdded`;
        None: the API server stamps the first write."""
        return None

    def port(self, device: Device) -> Interface | None:
        """The NIC port its traffic leaves by (a VF: its PF), which carries the port's
        scale-out record (rail, switch); None: not a NIC of the inventory's interfaces."""
        return None


STANDARD = "resource.kubernetes.io/"  # the standard attributes' domain


def numa_value(numa: int | None, memory: Sequence[int] = ()) -> Value:
    """`numa` (the kernel's node of the PCI function), or every node where the device's own
    memory adds others (`NumaNodes`)."""
    nodes = tuple(sorted({*memory, *(() if numa is None else (numa,))}))
    if len(nodes) <= 1 and (numa is not None or not nodes):
        return numa
    return NumaNodes(nodes, numa)


def pci_values(topology: PciTopology, bus_id: str | None, numa: Value) -> list[tuple[str, Value]]:
    """The PCI placement attributes every PCI device publishes (`numa`: an int, or
    `numa_value`'s list)."""
    # pciSwitch/pciRoot only where the root complex is known too: that is when discovery's
    # distance rules can speak (a missing pcieRoot is UNK), so an equal value keeps its promise.
    known = topology.pcieRoot is not None
    return [
        (STANDARD + "pcieRoot", topology.pcieRoot),
        (STANDARD + "pciBusID", bus_id),
        (STANDARD + "numaNode", numa),
        ("pciSwitch", topology.pciSwitches[0] if known and topology.pciSwitches else None),
        ("pciRoot", topology.pciRootId if known else None),
    ]


MAX_LABEL_VALUE = 63  # a taint's value is a label value


def causes_value(prefix: str, bare: str, causes: Sequence[str]) -> str:
    """`<prefix>-<cause>.<cause>...` within a label value's 63 characters (causes that would
    pass it are left to the health reason); `bare` when no cause is known."""
    if not causes:
        return bare
    value, sep = prefix, "-"
    for cause in causes:
        if len(value) + len(sep) + len(cause) > MAX_LABEL_VALUE:
            break
        value, sep = value + sep + cause, "."
    return value


def device_nodes(nodes: Sequence[DeviceNode]) -> ContainerEdits:
    return ContainerEdits(device_nodes=tuple(nodes))


_Payload = TypeVar("_Payload")


def payload_as(device: Device, payload_type: type[_Payload], what: str) -> _Payload:
    """`device`'s payload where it is a `payload_type` (each kind's `payload_of`); TypeError
    naming the device where another kind built it (`what`: what the caller expected)."""
    if not isinstance(device.payload, payload_type):
        raise TypeError(f"device {device.name} (type {device.type}) is not {what}")
    return device.payload
