"""Distance between two PCI functions, from their coordinates only.

Vocabulary (smaller is closer): SELF LINK PIX PXB PHB NODE SYS UNK.

    PIX   same innermost upstream bridge
    PXB   same outermost bridge (root port)
    PHB   same PCIe root complex (pcieRoot)
    NODE  different root complexes, same NUMA node
    SYS   different NUMA nodes
    UNK   a coordinate the comparison needs is missing

SELF and LINK are never produced from bus coordinates. Where two levels cannot be told apart
the further is reported, because the value feeds a proximity claim and over-claiming closeness
is the error nothing downstream can catch: a PCIe switch looks exactly like a chain of bridges,
so two devices on different downstream ports of one switch share only the upper bridges and
come out PXB, never PIX.
"""

from __future__ import annotations

from typing import Literal

from fabricdra.api.inventory import PciTopology

Distance = Literal["SELF", "LINK", "PIX", "PXB", "PHB", "NODE", "SYS", "UNK"]
ORDER: tuple[Distance, ...] = ("SELF", "LINK", "PIX", "PXB", "PHB", "NODE", "SYS", "UNK")
RANK = {d: i for i, d in enumerate(ORDER)}


def distance(a: PciTopology, a_numa: int | None, b: PciTopology, b_numa: int | None) -> Distance:
    if a.pcieRoot is None or b.pcieRoot is None:
        return "UNK"
    if a.pciSwitches and b.pciSwitches and a.pciSwitches[0] == b.pciSwitches[0]:
        return "PIX"
    if a.pciRootId is not None and a.pciRootId == b.pciRootId:
        return "PXB"
    if a.pcieRoot == b.pcieRoot:
        return "PHB"
    if a_numa is None or b_numa is None:
        return "UNK"
    return "NODE" if a_numa == b_numa else "SYS"


def closest(distances: list[Distance]) -> Distance | None:
    best: Distance | None = None
    for d in distances:
        if best is None or RANK[d] < RANK[best]:
            best = d
    return best
