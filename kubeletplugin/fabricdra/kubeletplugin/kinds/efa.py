"""AWS Elastic Fabric Adapter (`type: efa`), off unless `--efa` (chart `efa.enabled`): AWS
nodes advertise EFA through their own device plugin, and two advertisers would hand one
function out twice.

Discovered from sysfs as the kernel lays an EFA function out, not from the netdev inventory
(an EFA function has no netdev; the ENA function beside it carries IP): every RDMA device under
class/infiniband whose PCI function is Amazon's (vendor 0x1d0f) with an EFA device id, 0xefa0
to 0xefa3 (Linux drivers/infiniband/hw/efa/efa_main.c `efa_pci_tbl`; rdma-core
providers/efa/efa.c `efa_table`), whatever udev renamed it to (the kernel registers `efa_%d`).
One device per function, exclusive; health is the port's link verdict, as for RDMA.

Served as its own verbs character device (`/dev/infiniband/uverbsN`) and, once per claim,
libfabric's environment (fi_efa(7)): `FI_PROVIDER=efa`, and `FI_EFA_USE_DEVICE_RDMA=1` where
the node says its EFA devices do RDMA read (`--efa-device-rdma`, chart `efa.deviceRdma`: p4d,
p5; AWS's NCCL guide sets it there; elsewhere libfabric refuses to start with it). No
NCCL_IB_HCA (NCCL reaches EFA through the aws-ofi-nccl plugin, not its IB transport) and no
rdma_cm (EFA's SRD does not use it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from fabricdra.api.inventory import Endpoint

from ..devices import Device, dns_label
from ..discovery.pci import read_function
from ..discovery.rdma import read_rdma_index
from ..discovery.sysfs import Absent, SysfsTree, Unreadable
from ..discovery.vendors import AMAZON
from ..kubelet import PrepareError
from ..kubelet.cdi import ContainerEdits
from .base import (
    BuildInputs,
    DeviceKind,
    PrepareContext,
    Served,
    Value,
    causes_value,
    device_nodes,
    payload_as,
    pci_values,
)
from .rdma import link_device

EFA_DEVICE_IDS = frozenset({"0xefa0", "0xefa1", "0xefa2", "0xefa3"})


class LibfabricGroup:
    """The claim's EFA CDI device: libfabric's environment, once per claim."""

    def device_name(self, claim_uid: str) -> str:
        return f"efa-{claim_uid}"

    def edits(
        self, ctx: PrepareContext, own_hcas: Sequence[str], hcas: Sequence[str]
    ) -> ContainerEdits:
        env = ["FI_PROVIDER=efa"]
        if ctx.config is not None and ctx.config.efa_device_rdma:
            env.append("FI_EFA_USE_DEVICE_RDMA=1")
        return ContainerEdits(env=tuple(env))


LIBFABRIC = LibfabricGroup()


@dataclass(frozen=True)
class EfaPayload:
    """An EFA device's own record: its function (no netdev: not among the interfaces)."""

    endpoint: Endpoint


def payload_of(device: Device) -> EfaPayload:
    """An EFA device's payload; TypeError for a device of another kind."""
    return payload_as(device, EfaPayload, "an EFA function")


class Efa(DeviceKind):
    name = "efa"
    device_type = "efa"
    plugin_group = "efa"
    device_plugin_resources = ("vpc.amazonaws.com/efa",)  # AWS's EFA device plugin

    def build(self, inputs: BuildInputs) -> list[Device]:
        if not inputs.config.efa or inputs.sysfs is None:
            return []
        return read_efa(inputs.sysfs)

    def owns(self, device: Device) -> bool:
        return device.type == "efa"

    def attributes(self, device: Device) -> list[tuple[str, Value]]:
        ep = payload_of(device).endpoint
        return [
            *pci_values(ep.topology, ep.pciBusId, ep.numaNode),
            ("rdmaDevice", ep.rdmaDevice),
            ("linkVerdict", ep.link.verdict if ep.link else None),
        ]

    def adapter(self, device: Device) -> Endpoint | None:
        return payload_of(device).endpoint  # no netdev: discovery's interfaces do not list it

    def trouble_since(self, device: Device) -> datetime | None:
        link = payload_of(device).endpoint.link
        return link.since if link is not None else None

    def taint_value(self, device: Device) -> str:
        """`efa-link-down`; `efa-link` when no cause is known."""
        return causes_value("efa", "efa-link", device.health_causes)

    def serve(self, device: Device, ctx: PrepareContext) -> Served:
        ep = device.payload.endpoint if isinstance(device.payload, EfaPayload) else None
        if not self.owns(device) or ep is None or not ep.rdmaDevice:
            raise PrepareError(f"device {device.name} is not an EFA function")
        node = ctx.host.verbs_device(ep.rdmaDevice, ep.verbsDevice)
        return Served(device_nodes([node]), group=LIBFABRIC)


def read_efa(tree: SysfsTree) -> list[Device]:
    """Every EFA function's device, from the RDMA devices sysfs lists (none where it lists
    none or cannot be read)."""
    out = []
    for rdma in read_rdma_index(tree, datetime.now(UTC)).devices:
        if rdma.device_path is None or not _is_efa(tree, rdma.device_path):
            continue
        fn = read_function(tree, rdma.device_path)
        if fn is None:
            continue
        # No first-seen time: it would be this pass's, so the taint's timeAdded would move on
        # every pass; without it the API server stamps the first write and it stays.
        link = rdma.link.model_copy(update={"since": None})
        ep = Endpoint(
            name=None,
            pciBusId=fn.bus_id,
            numaNode=fn.numa_node,
            cpuAffinity=fn.cpu_affinity,
            driver=fn.driver,
            rdma=True,
            rdmaDevice=rdma.name,
            verbsDevice=rdma.verbs,
            linkLayer=rdma.link_layer,
            link=link,
            topology=fn.topology,
        )
        out.append(link_device(dns_label("efa", fn.bus_id), "efa", ep, EfaPayload(ep)))
    return out


def _is_efa(tree: SysfsTree, device_path: str) -> bool:
    vendor, device = tree.read(f"{device_path}/vendor"), tree.read(f"{device_path}/device")
    if isinstance(vendor, Absent | Unreadable) or isinstance(device, Absent | Unreadable):
        return False
    return vendor.lower() == AMAZON and device.lower() in EFA_DEVICE_IDS


KIND = Efa()
