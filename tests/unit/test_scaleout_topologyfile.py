"""The declared topology file (issue 27 point 1, "Declared"): Slurm's topology.conf tree form
and the per-node/per-NIC YAML, with errors that name the line or key at fault."""

from __future__ import annotations

import pytest

from fabricdra.api.scaleout import (
    TopologyFileError,
    expand_hostlist,
    label_value,
    parse_topology_file,
)

SLURM = """
# a two-leaf scalable unit under one spine
SwitchName=leaf1 Nodes=dgx[001-002]
SwitchName=leaf2 Nodes=dgx[003-004],dgx010 LinkSpeed=400
SwitchName=spine Switches=leaf[1-2]
"""


def test_slurm_tree_form_gives_each_node_its_switches_nearest_first() -> None:
    topo = parse_topology_file(SLURM)
    assert topo.tiers("dgx001") == ("leaf1", "spine")
    assert topo.tiers("dgx010") == ("leaf2", "spine")
    assert topo.tiers("elsewhere") == ()


def test_hostlists_expand_with_their_zero_padding() -> None:
    assert expand_hostlist("n[08-10],x") == ["n08", "n09", "n10", "x"]
    with pytest.raises(TopologyFileError, match="runs backwards"):
        expand_hostlist("n[5-1]")


def test_a_node_under_two_leaves_is_refused_by_line() -> None:
    with pytest.raises(TopologyFileError, match="line 2: node 'a' is under both"):
        parse_topology_file("SwitchName=s1 Nodes=a\nSwitchName=s2 Nodes=a\n")


def test_yaml_form_declares_nics_by_any_name() -> None:
    topo = parse_topology_file(
        "switches: {leaf-1: spine-a}\n"
        "nodes:\n"
        "  dgx001:\n"
        "    switch: leaf-1\n"
        "    nics:\n"
        "      mlx5_0: {rail: 0, switch: rail0-leaf, port: '17', role: compute}\n"
    )
    assert topo.tiers("dgx001") == ("leaf-1", "spine-a")
    nic = topo.nic("dgx001", ["ibp24s0", "mlx5_0"])
    assert nic is not None
    assert (nic.rail, nic.switch, nic.port, nic.role) == (
        0,
        "rail0-leaf",
        "17",
        "compute",
    )


def test_yaml_errors_name_the_key() -> None:
    with pytest.raises(TopologyFileError, match=r"nodes\.a\.nics\.mlx5_0\.role"):
        parse_topology_file("nodes: {a: {nics: {mlx5_0: {role: gpu}}}}")


def test_long_switch_ids_become_stable_short_label_values() -> None:
    long = "S-0x" + "ab" * 40 + " port group"
    value = label_value(long)
    assert len(value) <= 63
    assert value == label_value(long)
    assert value != label_value(long + "x")
    assert label_value("leaf-1") == "leaf-1"
