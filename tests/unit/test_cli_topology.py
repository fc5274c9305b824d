"""`fabricdra topology` (issue 27 point 7): the scale-out tree as a table, JSON, Slurm's
topology.yaml (tree and block) and a Kueue Topology, from Nodes and NodeDevices as published;
and `fabricdra fabric-dump`'s ConfigMap, which the controller reads back."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from fabricdra.api import labels
from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.cli import UsageError
from fabricdra.cli.topology import as_json, dump_configmap, kueue, rows, slurm, table
from fabricdra.controller.tierlabels import TierDeps, TierLabels
from tests.fabrics import superpod as sp

T1, T2, T3 = TIER_LABELS


def _node(name: str, tiers: tuple[str, ...], domain: str | None, cabling: Any = None) -> Any:
    lab = dict(zip(TIER_LABELS, tiers, strict=False))
    if domain:
        lab[labels.FABRIC_DOMAIN] = domain
    lab["kubernetes.io/hostname"] = name
    ann = {labels.CABLING_CHECK: json.dumps(cabling)} if cabling else {}
    return {"metadata": {"name": name, "labels": lab, "annotations": ann}}


NODES = [
    _node("gb-a1", ("su1", "spines", "cores"), "nvl-a", {"result": "Passed", "leaves": 4}),
    _node("gb-a2", ("su1", "spines", "cores"), "nvl-a"),
    _node("gb-b1", ("su2", "spines", "cores"), "nvl-b"),
    _node(
        "gb-b2",
        (),
        "nvl-b",
        {"result": "Failed", "findings": ["ibp79s0 (rail 2) reaches leaf 0xb8; rail 2 is 0xa8"]},
    ),
]
DEVICES = [sp.records()["dgx001"] | {"metadata": {"name": "gb-a1"}}]


def test_table_shows_tiers_domain_cabling_and_nics() -> None:
    out = table(rows(NODES, DEVICES)).splitlines()
    assert out[0].split()[:4] == ["NODE", "TIER-3", "TIER-2", "TIER-1"]
    a1 = next(line for line in out if line.startswith("gb-a1"))
    assert a1.split()[:6] == ["gb-a1", "cores", "spines", "su1", "nvl-a", "Passed"]
    assert "8 compute (rails 0,1,2,3,4,5,6,7), 1 storage" in a1
    b2 = next(line for line in out if line.startswith("gb-b2"))
    assert "Failed: ibp79s0 (rail 2) reaches leaf 0xb8" in b2


def test_json_nests_the_tree_and_names_the_untiered() -> None:
    doc = as_json(rows(NODES, DEVICES))
    assert doc["tree"] == {
        "cores": {"spines": {"su1": {"nodes": ["gb-a1", "gb-a2"]}, "su2": {"nodes": ["gb-b1"]}}}
    }
    assert doc["untiered"] == ["gb-b2"]
    a1 = next(n for n in doc["nodes"] if n["name"] == "gb-a1")
    assert a1["nics"][0] == {
        "name": "ibp24s0",
        "rdmaDevice": "mlx5_0",
        "rail": 0,
        "role": "compute",
        "switch": f"0x{sp.leaf(1, 0):016x}",
        "port": "1",
        "source": "measured",
    }


def test_slurm_topology_yaml_tree_and_blocks() -> None:
    doc = yaml.safe_load(slurm(rows(NODES, DEVICES), "fab"))
    tree, block = doc
    assert tree["topology"] == "fab"
    assert tree["cluster_default"] is True
    assert tree["tree"]["switches"] == [
        {"switch": "cores", "children": "spines"},
        {"switch": "spines", "children": "su1,su2"},
        {"switch": "su1", "nodes": "gb-a1,gb-a2"},
        {"switch": "su2", "nodes": "gb-b1"},
    ]
    assert block["block"]["blocks"] == [
        {"block": "nvl-a", "nodes": "gb-a1,gb-a2"},
        {"block": "nvl-b", "nodes": "gb-b1,gb-b2"},
    ]


def test_kueue_topology_levels_broadest_first_and_who_is_left_out() -> None:
    obj, left_out = kueue(rows(NODES, DEVICES), "fab")
    assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert obj["kind"] == "Topology"
    assert [lv["nodeLabel"] for lv in obj["spec"]["levels"]] == [
        T3,
        T2,
        T1,
        labels.FABRIC_DOMAIN,
        "kubernetes.io/hostname",
    ]
    assert left_out == ["gb-b2"]
    # A tiered node known only to tier-2 and no NVLink domain: only the levels every tiered
    # node has (Kueue ignores a node lacking any level's label).
    shallow = [*NODES, _node("hgx-1", ("tor-9", "spines"), None)]
    obj, _ = kueue(rows(shallow, []), "fab")
    assert [lv["nodeLabel"] for lv in obj["spec"]["levels"]] == [T2, T1, "kubernetes.io/hostname"]


class _Cache:
    def __init__(self, items: list[Any]) -> None:
        self._items = items

    def get(self, key: str) -> Any:
        return next((o for o in self._items if o["metadata"]["name"] == key), None)

    def items(self) -> list[Any]:
        return list(self._items)

    def by_index(self, name: str, value: str) -> list[Any]:
        return []


def test_fabric_dump_configmap_round_trips_to_the_controller() -> None:
    cm = dump_configmap("compute", sp.dump())
    assert cm["metadata"]["labels"] == {"fabricdra.io/ibnetdiscover": "compute"}
    assert "ibnetdiscover.txt.gz" in cm["binaryData"]
    assert len(json.dumps(cm)) < len(sp.dump()) / 4  # gzipped: a large fabric fits 1 MiB
    deps = TierDeps(
        nodes=_Cache([]),
        node_devices=_Cache([]),
        dumps=_Cache([cm]),
        topology_file="",
        patch_node=lambda n, p: None,
        node_event=lambda n, e: None,
        require_synced=lambda: None,
        requeue_after=lambda k, d: None,
    )
    (dump,) = TierLabels(deps).fabric_dumps()
    assert len(dump.switches) == 2 * sp.RAILS + sp.SPINES + sp.CORES


def test_fabric_dump_refuses_what_does_not_parse() -> None:
    with pytest.raises(UsageError, match="refusing to store it: the dump line 1"):
        dump_configmap("compute", "ibwarn: [12345] mad_rpc_open_port: can't open UMAD port\n")
