"""The one PCI walk: a device's coordinates from its resolved sysfs path.

Interfaces and accelerators both get their topology here, so two devices' coordinates compare
equal by construction rather than by discipline. The kernel lays PCI devices out as
devices/pci<domain>:<bus>/<bridge>/<bridge>/…/<device>; the path *is* the upstream bridge chain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fabricdra.api.inventory import PciTopology

from .sysfs import Absent, Failure, SysfsTree, Unreadable

# Domains may be wider than 4 hex digits (Intel VMD puts devices in domain 10000).
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ROOT_BUS = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")


def is_bdf(name: str) -> bool:
    return _BDF.match(name) is not None


def topology_from_path(device_path: str) -> PciTopology | None:
    """Coordinates of the PCI function at `device_path` (relative to the sysfs root, resolved).

    None when the path is not a PCI function under a root bus."""
    parts = device_path.split("/")
    if len(parts) < 3 or parts[0] != "devices" or not is_bdf(parts[-1]):
        return None
    root_index = next((i for i, p in enumerate(parts) if _ROOT_BUS.match(p)), None)
    if root_index is None:
        return None
    upstream = [p for p in parts[root_index + 1 : -1] if is_bdf(p)]
    return PciTopology(
        pciRootId=upstream[0] if upstream else None,
        pciSwitches=list(reversed(upstream)),
        pcieRoot=parts[root_index],
    )


@dataclass(frozen=True, slots=True)
class PciFunction:
    """What every consumer needs to know about one PCI function."""

    bus_id: str
    path: str  # resolved, relative to the sysfs root
    topology: PciTopology
    numa_node: int | None
    cpu_affinity: str | None
    driver: str | None


def read_numa_node(tree: SysfsTree, device_path: str) -> int | None:
    """The kernel says -1 (or nothing) when it declines to name a node: that is None, not 0."""
    value = tree.read_int(f"{device_path}/numa_node")
    if isinstance(value, Absent | Unreadable) or value < 0:
        return None
    return value


def read_function(tree: SysfsTree, device_path: str) -> PciFunction | None:
    topology = topology_from_path(device_path)
    if topology is None:
        return None
    cpus = tree.read(f"{device_path}/local_cpulist")
    return PciFunction(
        bus_id=device_path.rsplit("/", 1)[1],
        path=device_path,
        topology=topology,
        numa_node=read_numa_node(tree, device_path),
        cpu_affinity=None if isinstance(cpus, Absent | Unreadable) or not cpus else cpus,
        driver=_name_or_none(tree.link_name(f"{device_path}/driver")),
    )


def subsystem(tree: SysfsTree, device_path: str) -> str | Failure:
    """The bus a device sits on: the name its `subsystem` link points at (pci, auxiliary, …)."""
    return tree.link_name(f"{device_path}/subsystem")


def _name_or_none(value: str | Failure) -> str | None:
    return None if isinstance(value, Absent | Unreadable) else value
