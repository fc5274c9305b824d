"""RDMA endpoint (`type: rdma`): a whole function offered `exclusive` or `shared`, or an
SR-IOV virtual function (`vf`), built from discovery's interface records (the rules are in
devices.py's docstring); health from the link verdict. Served as the endpoint's own verbs
character device, plus a claim-level CDI device with `/dev/infiniband/rdma_cm` (where the
host has it) and `NCCL_IB_HCA==<the pod's HCAs>` (ncclenv). Refused: an endpoint without an
RDMA device name (nothing to resolve to a verbs device)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from fabricdra.api.inventory import Endpoint, Interface
from fabricdra.api.scaleout import (
    NET_ROLE_ATTRIBUTE,
    RAIL_ATTRIBUTE,
    RAIL_SWITCH_ATTRIBUTE,
    SUBNET_ATTRIBUTE,
)

from ...devices import (
    Device,
    DeviceConfig,
    DeviceType,
    EndpointMode,
    Health,
    HeldAs,
    RdmaMode,
    endpoint_name,
)
from ...discovery.scaleout.annotate import rail_switch
from ...kubelet import PrepareError
from ...kubelet.cdi import ContainerEdits, DeviceNode
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
from . import ncclenv


class NcclGroup:
    """The claim's RDMA CDI device: rdma_cm where the host has it, and NCCL_IB_HCA widened to
    every HCA of the pod's claims of this driver (ncclenv), so no order of applying CDI
    devices leaves a container with fewer HCAs than it was given; NCCL_CROSS_NIC=0 where every
    NIC of the claim has a measured rail."""

    def device_name(self, claim_uid: str) -> str:
        return ncclenv.claim_device(claim_uid)

    def edits(
        self, ctx: PrepareContext, own_hcas: Sequence[str], hcas: Sequence[str]
    ) -> ContainerEdits:
        cm: tuple[DeviceNode, ...] = ()
        if ctx.host.has_char_device("/dev/infiniband/rdma_cm"):
            cm = (ctx.host.char_device("/dev/infiniband/rdma_cm"),)
        names = ncclenv.ordered([*own_hcas, *hcas])
        env: tuple[str, ...] = (ncclenv.env(names),)
        if ctx.rail_aligned:
            # Keep each ring/tree on one NIC index across nodes, never crossing rails
            # (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-cross-nic):
            # only where every NIC of the claim has a measured rail (docs/scale-out.md).
            env += (ncclenv.CROSS_NIC_OFF,)
        return ContainerEdits(env=env, device_nodes=cm)


NCCL = NcclGroup()


@dataclass(frozen=True)
class RdmaPayload:
    """An RDMA device's own record: the endpoint it hands over (the whole function, or the
    virtual function), the top-level interface (the PF, for a VF) and the mode offered."""

    endpoint: Endpoint
    interface: Interface
    mode: EndpointMode


def payload_of(device: Device) -> RdmaPayload:
    """An RDMA device's payload; TypeError for a device of another kind."""
    return payload_as(device, RdmaPayload, "an RDMA endpoint")


class Rdma(DeviceKind):
    name = "rdma"
    device_type = "rdma"
    plugin_group = "rdma"
    # The RDMA shared device plugin (Network Operator), resource prefix `rdma`; SR-IOV pools
    # are named by their operator (`--device-plugin-resource rdma=...`).
    device_plugin_resources = ("rdma/*",)

    def build(self, inputs: BuildInputs) -> list[Device]:
        if not inputs.config.offer_rdma:
            return []
        out: list[Device] = []
        for iface in inputs.interfaces:
            out.extend(_rdma_devices(iface, inputs.config, inputs.held))
        return out

    def owns(self, device: Device) -> bool:
        return device.type == "rdma"

    def attributes(self, device: Device) -> list[tuple[str, Value]]:
        p = payload_of(device)
        ep, parent = p.endpoint, p.interface
        is_vf = ep is not parent
        # A VF with no NUMA node of its own has its parent's (the seed's hint rule).
        numa = ep.numaNode if ep.numaNode is not None or not is_vf else parent.numaNode
        return [
            *pci_values(ep.topology, ep.pciBusId, numa),
            ("rdmaMode", p.mode),
            ("rdmaDevice", ep.rdmaDevice),
            ("netdev", ep.name),
            ("linkLayer", ep.linkLayer),
            ("linkVerdict", ep.link.verdict if ep.link else None),
            ("virtualFunction", is_vf),
            *_scale_out_values(parent),
        ]

    def taint_value(self, device: Device) -> str:
        """`rdma-link-down`; `rdma-link` when no cause is known."""
        return causes_value("rdma", "rdma-link", device.health_causes)

    def nccl_hca(self, device: Device) -> str | None:
        return payload_of(device).endpoint.rdmaDevice

    def within(self, device: Device) -> str | None:
        p = payload_of(device)
        if p.endpoint is not p.interface:
            return endpoint_name(p.interface)  # a VF: part of its PF
        return None

    def netdev(self, device: Device) -> str | None:
        return payload_of(device).endpoint.name

    def holders(self, device: Device) -> bool:
        return payload_of(device).mode == "shared"

    def trouble_since(self, device: Device) -> datetime | None:
        link = payload_of(device).endpoint.link
        return link.since if link is not None else None

    def port(self, device: Device) -> Interface | None:
        return payload_of(device).interface

    def serve(self, device: Device, ctx: PrepareContext) -> Served:
        ep = device.payload.endpoint if isinstance(device.payload, RdmaPayload) else None
        if not self.owns(device) or ep is None or not ep.rdmaDevice:
            raise PrepareError(f"device {device.name} names no RDMA endpoint")
        node = ctx.host.verbs_device(ep.rdmaDevice, ep.verbsDevice)
        return Served(device_nodes([node]), group=NCCL)


def _scale_out_values(link: Endpoint) -> list[tuple[str, Value]]:
    """Rail, switch, role and subnet (docs/scale-out.md): the physical port's, so a VF (which
    shares its PF's port and cable) carries its parent's. Unknown or disputed: left out."""
    record = link.scaleOut if isinstance(link, Interface) else None
    if record is None:
        return []
    return [
        (RAIL_ATTRIBUTE, record.rail),
        (RAIL_SWITCH_ATTRIBUTE, rail_switch(record)),
        (NET_ROLE_ATTRIBUTE, record.role),
        (SUBNET_ATTRIBUTE, record.subnetPrefix),
    ]


def _rdma_devices(
    iface: Interface, config: DeviceConfig, held: Mapping[str, HeldAs]
) -> list[Device]:
    if iface.driver == "efa":
        return []  # an EFA function is the efa kind's (kinds/efa.py), never plain RDMA
    mode = _mode_of(iface, config, config.rdma_mode)
    if iface.sriovVfsConfigured or iface.virtualFunctions:
        # A PF with VFs configured serves the partitioned mode only: the node was put in that
        # state before we started, and offering the PF whole too would hand its link out twice.
        # A VF switched off (node-wide, its PF's mode or its own) stays offered while held.
        out = []
        for vf in iface.virtualFunctions:
            if vf.rdmaDevice:
                device = _rdma_device(vf, iface, "vf")
                on = config.rdma_vfs and _mode_of(vf, config, mode) != "off"
                if on or device.name in held:
                    out.append(device)
        return out
    if not iface.rdmaDevice:
        return []
    device = _rdma_device(iface, iface, "shared" if mode == "shared" else "exclusive")
    held_as = held.get(device.name)
    if held_as is not None:  # never moved while prepared: offered as it is held
        return [replace(device, payload=replace(payload_of(device), mode=held_as))]
    return [] if mode == "off" else [device]


def _mode_of(ep: Endpoint, config: DeviceConfig, default: RdmaMode) -> RdmaMode:
    for o in config.rdma_overrides:
        if o.matches(ep):
            return o.mode
    return default


def _rdma_device(ep: Endpoint, iface: Interface, mode: EndpointMode) -> Device:
    return link_device(endpoint_name(ep), "rdma", ep, RdmaPayload(ep, iface, mode))


def link_device(name: str, type_: DeviceType, ep: Endpoint, payload: object) -> Device:
    """A NIC's device (RDMA endpoint, EFA function), healthy as its link's verdict (`ep`'s)
    says, carrying its kind's `payload`."""
    health, reason = link_health(ep)
    return Device(
        name=name,
        type=type_,
        health=health,
        health_reason=reason,
        # The only Failed verdict discovery gives: every port of the link is down.
        health_causes=("link-down",) if health == "Unhealthy" else (),
        payload=payload,
    )


def link_health(ep: Endpoint) -> tuple[Health, str | None]:
    """An endpoint's link verdict as a device's health: only Failed is Unhealthy."""
    if ep.link is None:
        return "Unknown", "no link verdict"
    if ep.link.verdict == "OK":
        return "Healthy", None
    if ep.link.verdict == "Failed":
        return "Unhealthy", ep.link.reason or "RDMA link failed"
    return "Unknown", ep.link.reason or "RDMA link unverified"


KIND = Rdma()
