"""Intel Gaudi (`type: gaudi`), off unless `--gaudi` (chart `gaudi.enabled`): Habana Labs'
AI accelerators, driven by `habanalabs` (drivers/accel/habanalabs), PCI vendor 0x1da3
(`PCI_VENDOR_ID_HABANALABS`; discovery/vendors.py). Off by default: Gaudi nodes run Habana's
own device plugin (`habana.ai/gaudi`), and two advertisers would hand one chip out twice.

Built from discovery's accelerator records of that vendor bound to `habanalabs` that have an
accel device (sysfs.py): one device per chip, exclusive, named after its PCI address
(`gaudi-0000-33-00-0`). Published: its PCI placement (so a claim can pair it with a NIC under
the same root), `model` from its PCI device id where upstream names it, and `scaleOutPorts`,
the RDMA ports on its own chip. Health is Unknown: no health source reads Gaudi yet (so
only the informative, effect-None taint). Served as exactly its own two accel nodes
(`/dev/accel/accel<N>`, `/dev/accel/accel_controlD<N>`), by CDI.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricdra.api.inventory import Accelerator

from ...devices import Device, dns_label
from ...discovery.vendors import HABANA
from ...hostdevices import DeviceNodeError
from ...kubelet import PrepareError
from ..base import (
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
from .sysfs import GaudiRecord, read_records

DRIVER = "habanalabs"
# PCI device id → model: the ids habanalabs_drv.c's `ids` table binds (PCI_IDS_GAUDI,
# PCI_IDS_GAUDI_SEC, PCI_IDS_GAUDI2: https://github.com/torvalds/linux/blob/master/drivers/
# accel/habanalabs/common/habanalabs_drv.c; hl-thunk's include/specs/common/pci_ids.h). Others
# (later chips, bound by Intel's out-of-tree driver) publish no `model`.
NODES = ("accel", "accel_controlD")  # /dev/accel/<node><N>: what hl-thunk opens
MODELS = {"0x1000": "gaudi", "0x1010": "gaudi", "0x1020": "gaudi2"}


@dataclass(frozen=True)
class GaudiPayload:
    """A Gaudi's own record: discovery's accelerator record and its accel device (sysfs.py)."""

    accelerator: Accelerator
    record: GaudiRecord


def payload_of(device: Device) -> GaudiPayload:
    """A Gaudi's payload; TypeError for a device of another kind."""
    return payload_as(device, GaudiPayload, "a Gaudi")


class Gaudi(DeviceKind):
    name = "gaudi"
    device_type = "gaudi"
    plugin_group = "gaudi"
    # Intel's Gaudi device plugin (habana-k8s-device-plugin): https://docs.habana.ai/en/latest/
    # Orchestration/Gaudi_Kubernetes/Habana_Device_Plugin_for_Kubernetes.html
    device_plugin_resources = ("habana.ai/gaudi",)

    def build(self, inputs: BuildInputs) -> list[Device]:
        if not inputs.config.gaudi or inputs.sysfs is None:
            return []
        mine = [a for a in inputs.accelerators if a.vendorId == HABANA and a.driver == DRIVER]
        records = read_records(inputs.sysfs, [a.pciBusId for a in mine])
        return [
            Device(
                name=dns_label("gaudi", acc.pciBusId),
                type="gaudi",
                health="Unknown",
                health_reason=None,
                payload=GaudiPayload(acc, records[acc.pciBusId]),
            )
            for acc in mine
            if acc.pciBusId in records  # no accel device: nothing to hand a container
        ]

    def owns(self, device: Device) -> bool:
        return device.type == "gaudi"

    def attributes(self, device: Device) -> list[tuple[str, Value]]:
        p = payload_of(device)
        acc, record = p.accelerator, p.record
        return [
            *pci_values(acc.topology, acc.pciBusId, acc.numaNode),
            ("vendor", acc.vendor),
            ("model", MODELS.get((acc.deviceId or "").lower())),
            ("scaleOutPorts", len(record.ports)),
        ]

    def taint_value(self, device: Device) -> str:
        """`gaudi-<cause>`; `gaudi` when no cause is known (no health source reads one yet)."""
        return causes_value("gaudi", "gaudi", device.health_causes)

    def serve(self, device: Device, ctx: PrepareContext) -> Served:
        if not self.owns(device) or not isinstance(device.payload, GaudiPayload):
            raise PrepareError(f"device {device.name} is not a Gaudi")
        n = device.payload.record.accel_index
        try:
            nodes = [ctx.host.char_device(f"/dev/accel/{node}{n}") for node in NODES]
        except DeviceNodeError as e:
            raise DeviceNodeError(f"Gaudi {device.name}: {e}") from None
        return Served(device_nodes(nodes))


KIND = Gaudi()
