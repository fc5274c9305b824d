"""Distance from coordinates only: PIX / PXB / PHB / NODE / SYS / UNK, the further level where
two cannot be told apart, and never SELF or LINK."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fabricdra.api.inventory import PciTopology
from fabricdra.kubeletplugin.discovery.distance import ORDER, closest, distance
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import discover_at, hgx_h100


def topo(*bridges: str, root: str | None = "pci0000:15") -> PciTopology:
    """Coordinates from the bridge chain written outermost first, as a path reads."""
    return PciTopology(
        pciRootId=bridges[0] if bridges else None,
        pciSwitches=list(reversed(bridges)),
        pcieRoot=root,
    )


RP, USP = "0000:15:01.0", "0000:16:00.0"
DSP0, DSP1 = "0000:17:00.0", "0000:17:01.0"


@pytest.mark.parametrize(
    ("a", "b", "a_numa", "b_numa", "expected"),
    [
        # The same innermost bridge.
        (topo(RP, USP, DSP0), topo(RP, USP, DSP0), 0, 0, "PIX"),
        # Two ports of one switch: a switch cannot be told from a chain of bridges, so PXB.
        (topo(RP, USP, DSP0), topo(RP, USP, DSP1), 0, 0, "PXB"),
        # Same root port, one deeper than the other.
        (topo(RP, USP, DSP0), topo(RP), 0, 0, "PXB"),
        # Two root ports of one root complex: the root bus is shared.
        (topo(RP), topo("0000:15:02.0"), 0, 0, "PHB"),
        (topo(), topo("0000:15:02.0"), 0, 0, "PHB"),  # one of them on the root bus itself
        # Different root complexes: the NUMA node decides.
        (topo(RP), topo("0000:37:01.0", root="pci0000:37"), 0, 0, "NODE"),
        (topo(RP), topo("0000:97:01.0", root="pci0000:97"), 0, 1, "SYS"),
        # A missing coordinate is UNK, never a distance.
        (topo(RP), topo("0000:97:01.0", root="pci0000:97"), None, 1, "UNK"),
        (topo(RP), topo("0000:97:01.0", root="pci0000:97"), 0, None, "UNK"),
        (topo(RP), PciTopology(), 0, 0, "UNK"),  # not on the PCI bus
        (PciTopology(), PciTopology(), 0, 0, "UNK"),
    ],
)
def test_distance(
    a: PciTopology, b: PciTopology, a_numa: int | None, b_numa: int | None, expected: str
) -> None:
    assert distance(a, a_numa, b, b_numa) == expected
    assert distance(b, b_numa, a, a_numa) == expected  # symmetric


def test_numa_does_not_matter_where_the_bus_already_answers() -> None:
    assert distance(topo(RP, USP), None, topo(RP, USP), None) == "PIX"
    assert distance(topo(RP), None, topo("0000:15:02.0"), None) == "PHB"


def test_self_and_link_are_never_produced_from_coordinates() -> None:
    shapes = [topo(RP, USP, DSP0), topo(RP, USP, DSP1), topo(RP), topo(), PciTopology()]
    shapes.append(topo("0000:97:01.0", root="pci0000:97"))
    for (a, b), (na, nb) in itertools.product(
        itertools.product(shapes, repeat=2), itertools.product([0, 1, None], repeat=2)
    ):
        assert distance(a, na, b, nb) not in ("SELF", "LINK")


def test_closest() -> None:
    assert ORDER == ("SELF", "LINK", "PIX", "PXB", "PHB", "NODE", "SYS", "UNK")
    assert closest(["SYS", "PXB", "UNK", "NODE"]) == "PXB"
    assert closest(["UNK"]) == "UNK"
    assert closest([]) is None


def test_on_the_hgx_node(tmp_path: Path) -> None:
    hgx = hgx_h100(SysfsBuilder(tmp_path / "sys"))
    d = discover_at(tmp_path / "sys")
    assert d.interfaces is not None
    assert d.accelerators is not None
    nic = {i.pciBusId: i for i in d.interfaces}
    gpu = {a.pciBusId: a for a in d.accelerators}

    def between(g: int, n: int) -> str:
        a, i = gpu[hgx.gpus[g]], nic[hgx.nics[n]]
        return distance(a.topology, a.numaNode, i.topology, i.numaNode)

    assert between(0, 0) == "PXB"  # its own NIC, on the next port of its switch
    assert between(0, 1) == "NODE"  # another host bridge on the same socket
    assert between(0, 4) == "SYS"  # the other socket
