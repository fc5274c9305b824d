"""The scale-out tree and the cabling check (issue 27 points 4 and 5), on held-out fabrics: a
DGX SuperPOD-style scalable unit recorded as ibnetdiscover prints it (tests/fabrics/superpod.py
says what is mis-cabled there and why), and a RoCE ToR fabric read from LLDP neighbours and a
topology file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.scaleout import parse_topology_file
from fabricdra.controller.scaleout import (
    FabricDumpError,
    Nic,
    build_tree,
    group_name,
    guid,
    nics_of,
    parse_ibnetdiscover,
)
from tests.fabrics import superpod as sp

DUMP = Path(__file__).resolve().parents[1] / "fabrics" / "superpod-su.ibnetdiscover"


def test_recorded_dump_is_the_generators_output() -> None:
    assert DUMP.read_text() == sp.dump() + "\n"


def test_ibnetdiscover_dump_parses_into_switches_links_and_ca_ports() -> None:
    d = parse_ibnetdiscover(DUMP.read_text())
    assert len(d.switches) == 2 * sp.RAILS + sp.SPINES + sp.CORES
    assert d.switches[f"0x{sp.leaf(1, 3):016x}"] == "MF0;su1-leaf-r3:MQM9700/U1"
    # Every CA port hangs under the switch port it is cabled to.
    assert d.ca_ports[f"0x{sp.ca_port(1, 0):016x}"] == (f"0x{sp.leaf(1, 0):016x}", 1)
    assert d.ca_ports[f"0x{sp.ca_port(9, 2):016x}"][0] == f"0x{sp.leaf(1, 3):016x}"
    assert d.ca_names[f"0x{sp.ca_port(33, 7):016x}"] == "dgx033 mlx5_7"
    levels = d.levels()
    assert levels[f"0x{sp.leaf(2, 0):016x}"] == 1
    assert levels[f"0x{sp.spine(0):016x}"] == 2
    assert levels[f"0x{sp.core(1):016x}"] == 3
    assert d.links[f"0x{sp.spine(2):016x}"] >= {f"0x{sp.core(0):016x}", f"0x{sp.leaf(1, 7):016x}"}


def test_bad_dump_names_the_line() -> None:
    with pytest.raises(FabricDumpError, match="line 2"):
        parse_ibnetdiscover('Switch\t36 "S-0000000000000001"\nthis is not ibnetdiscover\n')
    with pytest.raises(FabricDumpError, match="no Switch or Ca"):
        parse_ibnetdiscover("# nothing here\n")
    with pytest.raises(FabricDumpError, match="before any node"):
        parse_ibnetdiscover('[1]\t"S-0000000000000001"[2]\t\t# "x" lid 1 4xNDR\n')


def test_guid_spellings() -> None:
    want = "0x0c42a10300a1b2c1"
    for text in (
        "0x0c42a10300a1b2c1",
        "c42a10300a1b2c1",
        "H-0c42a10300a1b2c1",
        "0c42:a103:00a1:b2c1",
    ):
        assert guid(text) == want
    assert guid("b8:59:9f:12:34:56") == "b8:59:9f:12:34:56"  # an LLDP chassis id: verbatim


def _superpod(smp_su2: bool = False) -> dict[str, Any]:
    nodes = {n: nics_of(r) for n, r in sp.records(smp_su2=smp_su2).items()}
    return build_tree(nodes, [parse_ibnetdiscover(DUMP.read_text())])


def test_superpod_su_tiers_rail_group_spines_cores() -> None:
    v = _superpod()
    su1 = group_name(f"0x{sp.leaf(1, r):016x}" for r in range(sp.RAILS))
    su2 = group_name(f"0x{sp.leaf(2, r):016x}" for r in range(sp.RAILS))
    spines = group_name(f"0x{sp.spine(s):016x}" for s in range(sp.SPINES))
    cores = group_name(f"0x{sp.core(c):016x}" for c in range(sp.CORES))
    assert su1 != su2
    assert all(len(x) <= 63 for x in (su1, su2, spines, cores))
    good = [sp.node_name(n) for n in sp.SU_NODES[1] if n not in (9, 10, 11, 17)]
    assert len(good) == 28
    for name in good:
        assert v[name].tiers == (su1, spines, cores), name
        assert v[name].passed
        assert v[name].checked
    # SU 2's agents measured no neighbour: their leaves come from the dump, by port GUID.
    for n in sp.SU_NODES[2]:
        assert v[sp.node_name(n)].tiers == (su2, spines, cores)
    assert _superpod(smp_su2=True)["dgx033"].tiers == (su2, spines, cores)


def test_superpod_miscabled_nodes_fail_by_name_with_no_tiers() -> None:
    v = _superpod()
    failed = {name for name, x in v.items() if not x.passed}
    assert failed == {"dgx009", "dgx010", "dgx011", "dgx017"}
    assert all(v[n].tiers == () for n in failed)
    leaf = lambda su, r: f"0x{sp.leaf(su, r):016x}"  # noqa: E731
    assert any(
        f"ibp79s0 (rail 2) reaches leaf {leaf(1, 3)}; rail 2 of this block is leaf {leaf(1, 2)}"
        in f
        for f in v["dgx009"].failures
    )
    assert any(
        f"ibp206s0 and ibp220s0 all reach leaf {leaf(1, 7)}" in f for f in v["dgx010"].failures
    )
    assert any(
        f"ibp154s0 reaches leaf {leaf(2, 4)}, of another block" in f for f in v["dgx011"].failures
    )
    assert v["dgx017"].failures == (
        f"ibp41s0f0 (storage) reaches compute leaf {leaf(1, 5)} of a rail-optimised block",
    )


def test_disagreement_fails_the_node() -> None:
    nodes = {n: nics_of(r) for n, r in sp.records().items()}
    nodes["dgx005"] = tuple(
        Nic(**{**n.__dict__, "disagreement": "declared leaf-r0 port 5, measured port 7"})
        if n.rail == 0
        else n
        for n in nodes["dgx005"]
    )
    v = build_tree(nodes, [parse_ibnetdiscover(DUMP.read_text())])
    assert not v["dgx005"].passed
    assert v["dgx005"].tiers == ()
    assert "declared leaf-r0 port 5, measured port 7" in v["dgx005"].failures[0]


# --- a RoCE fabric: LLDP neighbours (chassis ids) and a topology file above the ToRs ---------

ROCE_TOPOLOGY = """
switches:
  "b8:59:9f:00:01:0a": spine-1       # rack 1, ToR A (rail 0)
  "b8:59:9f:00:01:0b": spine-1       # rack 1, ToR B (rail 1)
  "b8:59:9f:00:02:0a": spine-1
  "b8:59:9f:00:02:0b": spine-1
  tor-3: spine-2                     # rack 3: one ToR for everything, by its LLDP system name
  spine-1: super-1
  spine-2: super-1
"""


def _roce_nic(
    name: str, chassis: str, rail: int | None, role: str, sysname: str = ""
) -> dict[str, Any]:
    return {
        "name": name,
        "rdma": True,
        "rdmaDevice": f"mlx5_{name[-1]}",
        "scaleOut": {
            "rail": rail,
            "role": role,
            "neighbour": {
                "switch": chassis,
                "port": "Ethernet1",
                "name": sysname or None,
                "source": "measured",
                "via": "lldp",
            },
        },
    }


def _roce_records() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rack in (1, 2):
        for i in range(1, 5):
            name = f"r{rack}n{i}"
            ifaces = [
                _roce_nic("ens1np0", f"b8:59:9f:00:0{rack}:0a", 0, "compute"),
                _roce_nic("ens2np1", f"b8:59:9f:00:0{rack}:0b", 1, "compute"),
                _roce_nic("ens3np2", f"b8:59:9f:00:0{rack}:5e", None, "storage"),
            ]
            out[name] = {"metadata": {"name": name}, "spec": {"interfaces": ifaces}}
    # r1n3: its rail-1 cable on rack 2's ToR B. r2n2: its storage NIC on rack 2's ToR A.
    out["r1n3"]["spec"]["interfaces"][1] = _roce_nic("ens2np1", "b8:59:9f:00:02:0b", 1, "compute")
    out["r2n2"]["spec"]["interfaces"][2] = _roce_nic(
        "ens3np2", "b8:59:9f:00:02:0a", None, "storage"
    )
    for i in range(1, 3):  # rack 3: one ToR, converged (storage shares it: allowed)
        name = f"r3n{i}"
        ifaces = [
            _roce_nic("ens1np0", "b8:59:9f:00:03:01", 0, "compute", "tor-3"),
            _roce_nic("ens2np1", "b8:59:9f:00:03:01", 1, "compute", "tor-3"),
            _roce_nic("ens3np2", "b8:59:9f:00:03:01", None, "storage", "tor-3"),
        ]
        out[name] = {"metadata": {"name": name}, "spec": {"interfaces": ifaces}}
    return out


def test_roce_tor_fabric() -> None:
    declared = parse_topology_file(ROCE_TOPOLOGY)
    v = build_tree({n: nics_of(r) for n, r in _roce_records().items()}, (), declared)
    rack1 = group_name(["b8:59:9f:00:01:0a", "b8:59:9f:00:01:0b"])
    rack2 = group_name(["b8:59:9f:00:02:0a", "b8:59:9f:00:02:0b"])
    for name in ("r1n1", "r1n2", "r1n4"):
        assert v[name].tiers == (rack1, "spine-1", "super-1"), name
    for name in ("r2n1", "r2n3", "r2n4"):
        assert v[name].tiers == (rack2, "spine-1", "super-1"), name
    assert not v["r1n3"].passed
    assert "ens2np1 reaches leaf b8:59:9f:00:02:0b" in v["r1n3"].failures[0]
    assert v["r2n2"].failures == (
        "ens3np2 (storage) reaches compute leaf b8:59:9f:00:02:0a of a rail-optimised block",
    )
    # A single ToR: not rail-optimised, storage on it is fine; its parent found by LLDP name.
    tor3 = v["r3n1"]
    assert tor3.passed
    assert not tor3.checked
    assert tor3.tiers == (group_name(["b8:59:9f:00:03:01"]), "spine-2", "super-1")


def test_node_without_any_fabric_fact_gets_no_tiers() -> None:
    v = build_tree({"cpu1": (), "gpu1": (Nic("ib0", rail=0, role="compute"),)})
    assert v["cpu1"].tiers == ()
    assert v["cpu1"].passed
    assert v["gpu1"].tiers == ()
    assert v["gpu1"].passed


def test_slurm_topology_conf_gives_tiers_where_nothing_is_measured() -> None:
    declared = parse_topology_file(
        "SwitchName=s0 Nodes=n[1-2]\nSwitchName=s1 Nodes=n3\nSwitchName=top Switches=s[0-1]\n"
    )
    v = build_tree({"n1": (), "n2": (), "n3": ()}, (), declared)
    assert v["n1"].tiers == ("s0", "top") == v["n2"].tiers
    assert v["n3"].tiers == ("s1", "top")
