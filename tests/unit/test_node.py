"""One discovery pass: a failed enumeration keeps the previous record, a Failed verdict keeps
its first-seen time, and an unchanged node compares equal (so nothing is rewritten)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fabricdra.api import labels as keys
from fabricdra.api.inventory import Interface, LinkRecord
from fabricdra.kubeletplugin.discovery.node import Discovery, Previous, discover
from fabricdra.kubeletplugin.discovery.nvml import NvmlReadings
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.report import inventory_document, load_previous
from tests.sysfs.builder import DOWN, UP, SysfsBuilder
from tests.sysfs.nodes import (
    cpu_node,
    discover_at,
    h100_snapshot,
    hgx_h100,
    nvml_fabric,
    rdma_node,
    write_json,
)

T1 = datetime(2026, 12, 3, 6, 0, tzinfo=UTC)
T2 = T1 + timedelta(minutes=5)
T3 = T1 + timedelta(minutes=10)
PORT1 = "devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:30:00.0/infiniband/mlx5_0"


def previous_of(d: Discovery) -> Previous:
    return Previous(interfaces=d.interfaces, accelerators=d.accelerators)


def nic0(interfaces: list[Interface] | None) -> Interface:
    assert interfaces is not None
    return next(i for i in interfaces if i.name == "ens0np0")


def link0(d: Discovery) -> LinkRecord:
    link = nic0(d.interfaces).link
    assert link is not None
    return link


# -- failed enumeration ------------------------------------------------------------------


def test_a_failed_interface_enumeration_keeps_the_previous_record(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx_h100(b)
    first = discover_at(b.root)
    assert first.interfaces
    b.escape("class/net")
    second = discover_at(b.root, previous=previous_of(first))
    assert second.interfaces == first.interfaces  # kept, not emptied
    assert "interfaces" in second.failures
    assert "class/net" in second.failures["interfaces"]
    assert keys.RDMA_CAPABLE in second.labels.unknown
    assert keys.RDMA_CAPABLE not in second.labels.desired


def test_a_failed_enumeration_without_a_previous_record_is_none_not_empty(
    tmp_path: Path,
) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx_h100(b)
    b.escape("class/net")
    b.escape("bus/pci/devices")
    d = discover_at(b.root)
    assert d.interfaces is None
    assert d.accelerators is None
    assert set(d.failures) == {"interfaces", "accelerators"}
    assert d.labels.desired == {}
    assert d.labels.unknown == set(keys.ALL)


def test_a_failed_pci_enumeration_keeps_the_previous_accelerators(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    snap = h100_snapshot(hgx.gpus, fabric=nvml_fabric("completed"))
    first = discover_at(b.root, snap)
    b.escape("bus/pci/devices")
    second = discover_at(b.root, snap, previous=previous_of(first))
    assert second.accelerators == first.accelerators
    assert second.interfaces == first.interfaces  # the other part is read as usual
    assert set(second.failures) == {"accelerators"}


def test_a_pass_that_found_nothing_writes_the_empty_list(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx_h100(b)
    first = discover_at(b.root)
    empty = SysfsBuilder(tmp_path / "empty")
    second = discover_at(empty.root, previous=previous_of(first))
    assert second.interfaces == []
    assert second.accelerators == []
    assert second.failures == {}
    assert second.labels.desired == {}
    assert second.labels.unknown == frozenset()


# -- first seen ----------------------------------------------------------------------------


def test_first_seen_is_stable_while_the_failure_persists(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [[DOWN], [UP]])
    first = discover_at(b.root, now=T1)
    link = nic0(first.interfaces).link
    assert link is not None
    assert link.verdict == "Failed"
    assert link.since == T1
    second = discover_at(b.root, previous=previous_of(first), now=T2)
    assert nic0(second.interfaces).link == link  # since stays T1
    assert second.record_equals(first)
    # Without the previous record the clock would be taken again, and nothing would match.
    fresh = discover_at(b.root, now=T2)
    assert not fresh.record_equals(first)


def test_a_healed_failure_that_returns_starts_a_new_time(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [[DOWN]])
    failed = discover_at(b.root, now=T1)
    b.write(f"{PORT1}/ports/1/state", "4: ACTIVE")
    b.write(f"{PORT1}/ports/1/phys_state", "5: LinkUp")
    healed = discover_at(b.root, previous=previous_of(failed), now=T2)
    assert link0(healed).verdict == "OK"
    b.write(f"{PORT1}/ports/1/state", "1: DOWN")
    again = discover_at(b.root, previous=previous_of(healed), now=T3)
    assert link0(again).since == T3


def test_first_seen_is_kept_for_a_vf(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b, vf_nics=(2,), vfs_per_nic=2)
    first = discover_at(b.root, now=T1)
    pf_path = next(
        p for p in (b.root / "devices").rglob(hgx.nics[2]) if (p / "sriov_numvfs").exists()
    )
    vf_port = pf_path.parent / hgx.vfs[hgx.nics[2]][1] / "infiniband/mlx5_2v1/ports/1/state"
    vf_port.write_text("1: DOWN\n")
    second = discover_at(b.root, previous=previous_of(first), now=T2)
    third = discover_at(b.root, previous=previous_of(second), now=T3)

    def vf_link(d: Discovery) -> LinkRecord:
        assert d.interfaces is not None
        pf = next(i for i in d.interfaces if i.pciBusId == hgx.nics[2])
        link = pf.virtualFunctions[1].link
        assert link is not None
        return link

    assert vf_link(first).verdict == "OK"
    assert (vf_link(second).verdict, vf_link(second).since) == ("Failed", T2)
    assert vf_link(third) == vf_link(second)
    assert third.record_equals(second)


def test_first_seen_survives_the_json_document(tmp_path: Path) -> None:
    """`--previous` hands back an earlier output: the merge works through it."""
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [[DOWN]])
    first = discover_at(b.root, now=T1)
    doc = write_json(tmp_path / "prev.json", inventory_document(first, str(b.root)))
    second = discover_at(b.root, previous=load_previous(doc), now=T2)
    assert nic0(second.interfaces).link == nic0(first.interfaces).link
    assert second.record_equals(first)
    assert json.loads(doc.read_text())["interfaces"] is not None


# -- unchanged compares equal --------------------------------------------------------------


def test_an_unchanged_node_compares_equal(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b, vf_nics=(6, 7), broken_nics=(3,))
    snap = h100_snapshot(hgx.gpus, fabric=nvml_fabric("completed"), mig_gpu=7)
    first = discover_at(b.root, snap, now=T1)
    second = discover_at(b.root, snap, previous=previous_of(first), now=T2)
    assert second.record_equals(first)
    assert inventory_document(second, "x") == inventory_document(first, "x")


def test_a_change_compares_unequal(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rdma_node(b, [[UP], [UP]])
    first = discover_at(b.root, now=T1)
    b.write(f"{PORT1}/ports/1/state", "1: DOWN")
    second = discover_at(b.root, previous=previous_of(first), now=T2)
    assert not second.record_equals(first)
    assert not second.record_equals(None)


def test_directory_order_does_not_matter(tmp_path: Path) -> None:
    """Two trees holding the same node, built in opposite orders, give one record."""
    a = SysfsBuilder(tmp_path / "a")
    rdma_node(a, [[UP], [DOWN], [UP]])
    b = SysfsBuilder(tmp_path / "b")
    for name in ("zz9", "aa0"):
        b.netdev(name, None)
    rdma_node(b, [[UP], [DOWN], [UP]])
    for name in ("aa0", "zz9"):
        a.netdev(name, None)
    assert discover_at(a.root, now=T1).record_equals(discover_at(b.root, now=T1))


# -- NVML is asked only where there is an NVIDIA device ------------------------------------


def test_nvml_is_not_asked_without_an_nvidia_device(tmp_path: Path) -> None:
    cpu_node(SysfsBuilder(tmp_path / "sys"))
    asked: list[int] = []

    def source() -> NvmlReadings:
        asked.append(1)
        return NvmlReadings(source="library", available=False, reason="no driver")

    d = discover(SysfsTree(tmp_path / "sys"), nvml_source=source)
    assert asked == []
    assert d.nvml is None


def test_nvml_unavailable_is_a_reading_not_a_failure(tmp_path: Path) -> None:
    hgx_h100(SysfsBuilder(tmp_path / "sys"))
    d = discover(
        SysfsTree(tmp_path / "sys"),
        nvml_source=lambda: NvmlReadings(source="library", available=False, reason="no lib"),
    )
    assert d.failures == {}
    assert d.nvml is not None
    assert d.nvml.reason == "no lib"
    assert d.accelerators is not None
    assert all(a.uuid is None for a in d.accelerators)
