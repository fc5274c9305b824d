"""The RDMA link verdict, rule by rule (the table in docs/discovery.md):

a port is up      state is exactly ACTIVE and phys_state exactly LinkUp
a port is down    both read, not up (ACTIVE_DEFER is not ACTIVE)
a port is unknown a file absent, unreadable or not `N: NAME`
OK / Unverified / Failed  some port up / none up, some unknown / every port down
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from fabricdra.api.inventory import Interface, LinkRecord, PortReading
from fabricdra.kubeletplugin.discovery.rdma import merge_first_seen, parse_enum, verdict
from tests.sysfs.builder import ACTIVE_DEFER, DOWN, UNREADABLE_HOW, UP, Port, SysfsBuilder
from tests.sysfs.nodes import discover_at, rdma_node

NOW = datetime(2026, 12, 3, 6, 0, tzinfo=UTC)
EARLIER = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)


def link_of(
    tmp_path: Path, ports: list[Port], *, broken: int | None = None, how: str = ""
) -> LinkRecord:
    """The verdict discovery records for one NIC whose RDMA device has `ports`; `broken` names
    a port (1-based) whose state file is then made unreadable `how`."""
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [ports])
    if broken is not None:
        b.make_unreadable(
            f"devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:30:00.0"
            f"/infiniband/mlx5_0/ports/{broken}/state",
            how,
        )
    iface = nic(discover_at(tmp_path / "sys", now=NOW).interfaces)
    assert iface.link is not None
    return iface.link


def nic(interfaces: list[Interface] | None, name: str = "ens0np0") -> Interface:
    assert interfaces is not None
    return next(i for i in interfaces if i.name == name)


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("4: ACTIVE", "ACTIVE"),
        ("5: ACTIVE_DEFER", "ACTIVE_DEFER"),
        ("5: LinkUp", "LinkUp"),
        ("1:DOWN", "DOWN"),
        ("ACTIVE", None),
        ("x: ACTIVE", None),
        ("4:", None),
        ("", None),
    ],
)
def test_parse_enum_reads_the_whole_name(value: str, name: str | None) -> None:
    assert parse_enum(value) == name


def test_an_active_linked_port_is_ok(tmp_path: Path) -> None:
    link = link_of(tmp_path, [UP])
    assert link.verdict == "OK"
    assert link.since is None
    assert link.ports == [PortReading(port=1, state="4: ACTIVE", physState="5: LinkUp")]


def test_every_port_down_is_failed_with_the_readings_verbatim(tmp_path: Path) -> None:
    link = link_of(tmp_path, [DOWN, Port("2: INIT", "5: LinkUp")])
    assert link.verdict == "Failed"
    assert link.since == NOW
    assert link.ports == [
        PortReading(port=1, state="1: DOWN", physState="3: Disabled"),
        PortReading(port=2, state="2: INIT", physState="5: LinkUp"),
    ]


def test_active_defer_is_not_active(tmp_path: Path) -> None:
    link = link_of(tmp_path, [ACTIVE_DEFER, ACTIVE_DEFER])
    assert link.verdict == "Failed"
    assert [p.state for p in link.ports] == ["5: ACTIVE_DEFER", "5: ACTIVE_DEFER"]


def test_active_without_physical_link_is_down(tmp_path: Path) -> None:
    assert link_of(tmp_path, [Port("4: ACTIVE", "3: Disabled")]).verdict == "Failed"


def test_one_port_up_is_enough(tmp_path: Path) -> None:
    assert link_of(tmp_path, [DOWN, ACTIVE_DEFER, UP]).verdict == "OK"


@pytest.mark.parametrize("how", UNREADABLE_HOW)
def test_an_unreadable_port_beside_down_ones_is_unverified(tmp_path: Path, how: str) -> None:
    link = link_of(tmp_path, [DOWN, DOWN, DOWN, DOWN], broken=3, how=how)
    assert link.verdict == "Unverified"  # never Failed from a file that could not be read
    assert link.since is None
    assert link.ports[2].state is None
    assert link.ports[0].state == "1: DOWN"


def test_an_unreadable_port_beside_an_up_one_is_ok(tmp_path: Path) -> None:
    assert link_of(tmp_path, [UP, DOWN], broken=2, how="directory").verdict == "OK"


@pytest.mark.parametrize(
    "port",
    [
        Port(state=None),  # no state file
        Port(phys_state=None),  # no phys_state file
        Port(state="ACTIVE"),  # not of the `N: NAME` form
        Port(state="4: ACTIVE", phys_state="garbage"),
    ],
)
def test_a_port_that_cannot_be_interpreted_is_unknown(tmp_path: Path, port: Port) -> None:
    assert link_of(tmp_path, [DOWN, port]).verdict == "Unverified"


def test_a_device_with_no_ports_is_unverified(tmp_path: Path) -> None:
    link = link_of(tmp_path, [])
    assert link.verdict == "Unverified"
    assert link.ports == []


def test_unreadable_ports_directory_is_unverified(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [[DOWN]])
    b.escape(
        "devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:30:00.0"
        "/infiniband/mlx5_0/ports"
    )
    link = nic(discover_at(tmp_path / "sys").interfaces).link
    assert link is not None
    assert link.verdict == "Unverified"
    assert link.reason is not None
    assert "ports" in link.reason


def test_an_unreadable_rdma_tree_is_unverified_not_absent(tmp_path: Path) -> None:
    """`rdma: false` with an Unverified verdict: whether a device is bound is unknown. Virtual
    interfaces get no verdict: they never carry an RDMA device of their own."""
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [[UP]])
    b.escape("class/infiniband")
    d = discover_at(tmp_path / "sys")
    iface = nic(d.interfaces)
    assert iface.rdma is False
    assert iface.rdmaDevice is None
    assert iface.link is not None
    assert iface.link.verdict == "Unverified"
    assert nic(d.interfaces, "lo").link is None


def test_no_rdma_subsystem_is_no_rdma(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [None])
    iface = nic(discover_at(tmp_path / "sys").interfaces)
    assert (iface.rdma, iface.link, iface.rdmaDevice) == (False, None, None)


def test_the_bound_device_and_its_verbs_node(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [[UP], [UP]])
    d = discover_at(tmp_path / "sys")
    for i in range(2):
        iface = nic(d.interfaces, f"ens{i}np0")
        assert iface.rdma is True
        assert iface.rdmaDevice == f"mlx5_{i}"
        assert iface.verbsDevice == f"uverbs{i}"
        assert iface.linkLayer == "Ethernet"


def test_binding_falls_back_to_the_shared_device(tmp_path: Path) -> None:
    """IPoIB GIDs name no netdev: the RDMA device is matched by the device both hang off."""
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [None])
    pf = "devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:30:00.0"
    b.rdma(pf, "mlx5_ib0", [Port(link_layer="InfiniBand")])
    iface = nic(discover_at(tmp_path / "sys").interfaces)
    assert iface.rdmaDevice == "mlx5_ib0"
    assert iface.linkLayer == "InfiniBand"


def test_verdict_function_table() -> None:
    up = PortReading(port=1, state="4: ACTIVE", physState="5: LinkUp")
    down = PortReading(port=2, state="1: DOWN", physState="3: Disabled")
    unknown = PortReading(port=3, state=None, physState="3: Disabled")
    assert verdict([up, down], None, NOW).verdict == "OK"
    assert verdict([down], None, NOW).verdict == "Failed"
    assert verdict([down, unknown], None, NOW).verdict == "Unverified"
    assert verdict([unknown], None, NOW).verdict == "Unverified"
    assert verdict([], None, NOW).verdict == "Unverified"


def test_merge_first_seen_keeps_the_earlier_time() -> None:
    ports = [PortReading(port=1, state="1: DOWN", physState="3: Disabled")]
    current = LinkRecord(verdict="Failed", ports=ports, since=NOW, reason="every port is down")
    before = current.model_copy(update={"since": EARLIER})
    assert merge_first_seen(current, before).since == EARLIER
    assert merge_first_seen(current, before) == before  # an unchanged failure compares equal
    assert merge_first_seen(current, None).since == NOW
    healed = LinkRecord(verdict="OK")
    assert merge_first_seen(healed, before) == healed  # a heal forgets the failure
    # A failure after an Unverified pass starts now: nothing said it was failed before.
    unverified = LinkRecord(verdict="Unverified", reason="x")
    assert merge_first_seen(current, unverified).since == NOW


def test_a_multi_port_device_binds_each_port_to_its_own_netdev(tmp_path: Path) -> None:
    """Two netdevs on one PCI function, one RDMA device with a port for each: both interfaces
    carry the device, and its verdict is the device's (one port up is enough)."""
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [None])
    pf = "devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:30:00.0"
    b.netdev("ens0d1", pf)
    b.rdma(pf, "mlx4_0", [Port(netdev="ens0np0"), Port("1: DOWN", "3: Disabled", netdev="ens0d1")])
    d = discover_at(tmp_path / "sys")
    for name in ("ens0np0", "ens0d1"):
        iface = nic(d.interfaces, name)
        assert iface.rdmaDevice == "mlx4_0"
        assert iface.link is not None
        assert iface.link.verdict == "OK"


def test_an_rdma_device_that_cannot_be_bound_makes_the_others_unverified(tmp_path: Path) -> None:
    """An RDMA device whose class entry cannot be read could belong to any interface that shows
    none: those are Unverified (no device), not "no RDMA"; bound ones keep their verdict."""
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [[UP], [DOWN]])
    b.escape("class/infiniband/mlx5_0")
    d = discover_at(tmp_path / "sys")
    lost = nic(d.interfaces, "ens0np0")
    assert (lost.rdma, lost.rdmaDevice) == (False, None)
    assert lost.link is not None
    assert lost.link.verdict == "Unverified"
    assert lost.link.reason is not None
    assert "mlx5_0" in lost.link.reason
    kept = nic(d.interfaces, "ens1np0")
    assert kept.link is not None
    assert (kept.rdmaDevice, kept.link.verdict) == ("mlx5_1", "Failed")
    assert nic(d.interfaces, "lo").link is None
    assert d.labels.desired["fabricdra.io/rdma.capable"] == "true"
