"""Rail and role of each RDMA NIC, measured from PCI distance to the GPUs.

A rail-optimised node (DGX/HGX: https://docs.nvidia.com/dgx-superpod/reference-architecture-scalable-infrastructure-h100/latest/network-fabrics.html)
cables NIC i, the one beside GPU i, to leaf i of its scalable unit, so rail i is "the NIC
closest to GPU i". GPU i is the i-th GPU in PCI bus order: the order NVML and nvidia-smi number
them in (and CUDA with CUDA_DEVICE_ORDER=PCI_BUS_ID).

    compute   the NIC sits beside a GPU: on the same PCIe switch or root port (PIX / PXB,
              discovery/distance.py). Anything further (PHB, NODE, SYS, UNK) says nothing:
              the role is then unknown unless declared or set by selector.
    rail      only on a node where the pairing is exact: every GPU and every compute NIC is
              in a group of mutually-closest GPUs and NICs with as many of one as of the other.
              Inside a group of k > 1 (two GPUs and two NICs on one switch, equally close) the
              pairing follows bus order: no pair is claimed closer than it is, and every node
              of one model numbers its rails the same way. Any other shape: no rails at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricdra.api.inventory import Accelerator, Interface

from ..distance import RANK, Distance, distance

NEXT_TO = ("PIX", "PXB")  # "beside a GPU": behind the same switch or root port


@dataclass(frozen=True, slots=True)
class Placement:
    rail: int | None
    compute: bool


def _bus(a: Accelerator) -> str:
    return a.pciBusId.lower()


def place(nics: list[Interface], gpus: list[Accelerator]) -> dict[str, Placement]:
    """NIC name -> its measured placement, for the RDMA physical functions in `nics`."""
    ordered = sorted(gpus, key=_bus)
    nics = sorted(nics, key=lambda n: ((n.pciBusId or "").lower(), n.name))
    ranks = range(len(ordered))
    dist: dict[tuple[int, str], Distance] = {
        (i, n.name): distance(g.topology, g.numaNode, n.topology, n.numaNode)
        for i, g in enumerate(ordered)
        for n in nics
    }
    beside = RANK["PXB"]
    compute = [n.name for n in nics if any(RANK[dist[(i, n.name)]] <= beside for i in ranks)]
    rails = _rails(compute, len(ordered), dist)
    return {n.name: Placement(rails.get(n.name), n.name in compute) for n in nics}


def _rails(compute: list[str], gpus: int, dist: dict[tuple[int, str], Distance]) -> dict[str, int]:
    if not compute or len(compute) != gpus:
        return {}

    def best_nics(i: int) -> set[str]:
        low = min(RANK[dist[(i, n)]] for n in compute)
        return {n for n in compute if RANK[dist[(i, n)]] == low} if low <= RANK["PXB"] else set()

    def best_gpus(n: str) -> set[int]:
        low = min(RANK[dist[(i, n)]] for i in range(gpus))
        return {i for i in range(gpus) if RANK[dist[(i, n)]] == low}

    near_nics = {i: best_nics(i) for i in range(gpus)}
    near_gpus = {n: best_gpus(n) for n in compute}
    # Mutually-closest groups: a GPU's nearest NICs must have that GPU among their nearest.
    for i, ns in near_nics.items():
        if not ns or any(i not in near_gpus[n] for n in ns):
            return {}
    out: dict[str, int] = {}
    seen: set[int] = set()
    for i in range(gpus):
        if i in seen:
            continue
        group_nics = near_nics[i]
        group_gpus = {g for n in group_nics for g in near_gpus[n]}
        uneven = len(group_gpus) != len(group_nics)
        if uneven or any(near_nics[g] != group_nics for g in group_gpus):
            return {}
        seen |= group_gpus
        in_bus_order = [n for n in compute if n in group_nics]  # `compute` is in bus order
        for g, n in zip(sorted(group_gpus), in_bus_order, strict=True):
            out[n] = g
    return out
