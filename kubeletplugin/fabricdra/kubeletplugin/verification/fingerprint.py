"""The identity of a node's hardware and drivers, as far as verification is concerned.

A verification result holds for the hardware it measured. When a GPU or NIC is swapped (a
repair), a device appears or leaves, or a driver module is upgraded, the fingerprint changes and
the last result no longer speaks for the node: it is unverified again until a new run passes.
"""

from __future__ import annotations

import hashlib

from fabricdra.api.inventory import Accelerator, Interface

from ..discovery.sysfs import SysfsTree


def fingerprint(
    tree: SysfsTree, interfaces: list[Interface], accelerators: list[Accelerator]
) -> str:
    """sha256 over every accelerator (bus id, UUID, driver) and RDMA NIC (bus id, RDMA device,
    driver), plus the version of each driver module that reports one (`/sys/module/<m>/version`)."""
    parts: list[str] = []
    drivers: set[str] = set()
    for a in sorted(accelerators, key=lambda a: a.pciBusId):
        parts.append(f"gpu {a.pciBusId} {a.uuid} {a.driver}")
        if a.driver:
            drivers.add(a.driver)
    for i in sorted(interfaces, key=lambda i: i.name):
        if i.rdma and i.pciBusId:
            parts.append(f"nic {i.pciBusId} {i.rdmaDevice} {i.driver}")
            if i.driver:
                drivers.add(i.driver)
    for d in sorted(drivers):
        version = tree.read(f"module/{d}/version")
        parts.append(f"module {d} {version if isinstance(version, str) else '-'}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
