"""Each RDMA physical function's ScaleOut record: measured facts (port facts from sysfs, the
neighbour from SMP or LLDP, rail and role from PCI distance) joined with the declared ones (the
operator's topology file) and the operator's role selectors.

Precedence and honesty rules (docs/scale-out.md):

* `neighbour` is the measured neighbour, else the declared one; a failed measurement sets
  `error` and leaves a declared neighbour in place, marked `source: declared`.
* Where the file and a measurement disagree (switch, port, rail or role) both are kept and
  `disagreement` says how; the disputed rail or role is left unset (not guessed), and the
  published attributes carry nothing that is in dispute.
* A role selector (`--net-role MATCH=ROLE`) is the operator's word about this node and beats
  both (roleSource `selector`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from fabricdra.api.inventory import Accelerator, Interface, Neighbour, ScaleOut, ScaleOutSource
from fabricdra.api.scaleout import ROLES, DeclaredNic, DeclaredTopology, Role, label_value

from ..rdma import IB_CLASS
from ..sysfs import Absent, SysfsTree, Unreadable
from . import ibport
from .rails import Placement, place

T = TypeVar("T")

# The reader of one NIC's measured neighbour: the neighbour, an error message, or None where
# no source is configured for that link layer (nothing asked, nothing to report).
# It is given the RDMA device's port the netdev is (None: could not tell).
NeighbourSource = Callable[[Interface, int | None], Neighbour | str | None]


@dataclass(frozen=True, slots=True)
class RoleOverride:
    """`MATCH=ROLE`: MATCH is a PCI address (`0000:1c:00.0`, `1c:00.0`), a netdev or an RDMA
    device name."""

    match: str
    role: Role

    def matches(self, iface: Interface) -> bool:
        want = self.match.lower()
        bus = (iface.pciBusId or "").lower()
        if bus and want in (bus, bus.removeprefix("0000:")):
            return True
        return self.match in (iface.name, iface.rdmaDevice)


def parse_role_override(text: str) -> RoleOverride:
    match, sep, role = text.rpartition("=")
    if not sep or not match:
        raise ValueError(
            f"net role must be MATCH=ROLE (PCI address, netdev or RDMA device), not {text!r}"
        )
    for known in ROLES:
        if role == known:
            return RoleOverride(match, known)
    raise ValueError(f"net role {text!r}: role must be one of {', '.join(ROLES)}, not {role!r}")


@dataclass(frozen=True, slots=True)
class ScaleOutInputs:
    node: str | None = None  # the node's name in the topology file
    declared: DeclaredTopology | None = None
    neighbours: NeighbourSource | None = None
    roles: tuple[RoleOverride, ...] = ()


def _is_rdma_pf(iface: Interface) -> bool:
    return bool(iface.rdmaDevice) and not iface.virtual


def annotate(
    tree: SysfsTree,
    interfaces: list[Interface],
    accelerators: list[Accelerator] | None,
    inputs: ScaleOutInputs,
) -> list[Interface]:
    nics = [i for i in interfaces if _is_rdma_pf(i)]
    # Without a complete accelerator list no NIC can be said to be beside "GPU i".
    placements = place(nics, accelerators) if accelerators is not None else {}
    out: list[Interface] = []
    for iface in interfaces:
        if not _is_rdma_pf(iface):
            out.append(iface)
            continue
        record = _scale_out(tree, iface, placements.get(iface.name), inputs)
        out.append(iface.model_copy(update={"scaleOut": record}))
    return out


def _names(iface: Interface) -> list[str]:
    names = [iface.name, iface.rdmaDevice or ""]
    if iface.pciBusId:
        names += [iface.pciBusId, iface.pciBusId.lower().removeprefix("0000:")]
    return [n for n in names if n]


def _scale_out(
    tree: SysfsTree, iface: Interface, placement: Placement | None, inputs: ScaleOutInputs
) -> ScaleOut | None:
    errors: list[str] = []
    disagreements: list[str] = []
    infiniband = (iface.linkLayer or "").lower() == "infiniband"
    port = _port_of(tree, iface, errors)
    facts = ibport.read_port(tree, iface.rdmaDevice or "", port, infiniband) if port else None
    if facts is not None:
        errors += [f"{iface.rdmaDevice} port {port} {e}" for e in facts.errors]

    measured: Neighbour | None = None
    if inputs.neighbours is not None:
        reading = inputs.neighbours(iface, port)
        if isinstance(reading, str):
            errors.append(reading)
        else:
            measured = reading

    declared_nic: DeclaredNic | None = None
    if inputs.declared is not None and inputs.node is not None:
        declared_nic = inputs.declared.nic(inputs.node, _names(iface))
    declared: Neighbour | None = None
    if declared_nic is not None and declared_nic.switch:
        declared = Neighbour(
            switch=declared_nic.switch,
            port=declared_nic.port,
            source="declared",
            via="topology-file",
        )
    neighbour_disputed = False
    if measured is not None and declared is not None:
        why = _neighbour_mismatch(measured, declared)
        if why:
            disagreements.append(why)
            neighbour_disputed = True

    rail, rail_source = _agreed(
        "rail",
        placement.rail if placement else None,
        declared_nic.rail if declared_nic else None,
        disagreements,
    )
    measured_role: Role | None = "compute" if placement and placement.compute else None
    role: Role | None
    role, role_source = _agreed(
        "role", measured_role, declared_nic.role if declared_nic else None, disagreements
    )
    role_from: str | None = None
    if role_source == "measured":
        role_from = "gpu-distance"
    elif role_source == "declared":
        role_from = "topology-file"
    for override in inputs.roles:
        if override.matches(iface):
            role, role_from = override.role, "selector"
            break

    record = ScaleOut(
        portGuid=facts.port_guid if facts else None,
        subnetPrefix=facts.subnet_prefix if facts else None,
        lid=facts.lid if facts else None,
        smLid=facts.sm_lid if facts else None,
        rateGbps=facts.rate_gbps if facts else None,
        neighbour=measured or declared,
        declaredNeighbour=declared if neighbour_disputed else None,
        disagreement="; ".join(disagreements) or None,
        rail=rail,
        railSource=rail_source,
        role=role,
        roleSource=role_from,
        error="; ".join(errors) or None,
    )
    return None if record == ScaleOut() else record


def _agreed(
    what: str, measured: T | None, declared: T | None, disagreements: list[str]
) -> tuple[T | None, ScaleOutSource | None]:
    if measured is not None and declared is not None and measured != declared:
        disagreements.append(f"{what}: measured {measured}, declared {declared}")
        return None, None
    if measured is not None:
        return measured, "measured"
    if declared is not None:
        return declared, "declared"
    return None, None


def _switch_names(n: Neighbour) -> set[str]:
    names = {n.switch.lower()}
    if n.name:
        names.add(n.name.lower())
        # An IB NodeDescription is often `MF0;<hostname>:<model>/<slot>` (NVIDIA switches).
        host = n.name.split(";", 1)[-1].split(":", 1)[0]
        if host:
            names.add(host.lower())
    return names


def _neighbour_mismatch(measured: Neighbour, declared: Neighbour) -> str | None:
    if declared.switch.lower() not in _switch_names(measured):
        shown = f"{measured.switch} ({measured.name})" if measured.name else measured.switch
        return f"switch: measured {shown}, declared {declared.switch}"
    if declared.port is not None and measured.port is not None and declared.port != measured.port:
        return f"switch port: measured {measured.port}, declared {declared.port}"
    return None


def _port_of(tree: SysfsTree, iface: Interface, errors: list[str]) -> int | None:
    """The RDMA device's port this netdev is: the one whose GID 0 names it, else the only one."""
    base = f"{IB_CLASS}/{iface.rdmaDevice}/ports"
    listing = tree.listdir(base)
    if isinstance(listing, Absent | Unreadable):
        errors.append(f"{iface.rdmaDevice} ports not readable: {listing}")
        return None
    ports = sorted(int(p) for p in listing if p.isdigit())
    for p in ports:
        if tree.read(f"{base}/{p}/gid_attrs/ndevs/0") == iface.name:
            return p
    if len(ports) == 1:
        return ports[0]
    errors.append(f"{iface.rdmaDevice}: cannot tell which of ports {ports} is {iface.name}")
    return None


MAX_ATTRIBUTE_STRING = 64  # resource.k8s.io DeviceAttribute string values


def rail_switch(record: ScaleOut) -> str | None:
    """The `railSwitch` attribute: the neighbour switch's id, unless the file disputes it. An
    id over the attribute limit becomes its stable label form (the same id always gives the
    same value), so equal values still mean the same switch."""
    if record.neighbour is None or record.declaredNeighbour is not None:
        return None
    switch = record.neighbour.switch
    return switch if len(switch) <= MAX_ATTRIBUTE_STRING else label_value(switch)
