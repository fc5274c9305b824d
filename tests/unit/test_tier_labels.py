"""The tier-label reconciler's rules (controller/tierlabels.py) on in-memory caches: nothing is
written when nothing changed, nothing is decided from an unreadable input, a node whose agent
has not reported is left alone, and a failed node's labels are removed with one Event."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api import labels
from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.controller.status import Event
from fabricdra.controller.tierlabels import InputUnreadable, TierDeps, TierLabels, node_view
from tests.fabrics import superpod as sp
from tests.unit.test_cli_topology import _Cache


def _deps(
    nodes: list[Any], devices: list[Any], dumps: list[Any], topology: str = ""
) -> tuple[TierDeps, list[tuple[str, Any]], list[tuple[str, Event]]]:
    patches: list[tuple[str, Any]] = []
    events: list[tuple[str, Event]] = []
    cache = _Cache(nodes)

    def patch(name: str, body: Any) -> None:
        patches.append((name, body))
        node = cache.get(name)
        meta = node["metadata"]
        for k, v in body["metadata"].get("labels", {}).items():
            if v is None:
                meta["labels"].pop(k, None)
            else:
                meta["labels"][k] = v
        for k, v in body["metadata"].get("annotations", {}).items():
            if v is None:
                meta["annotations"].pop(k, None)
            else:
                meta["annotations"][k] = v

    deps = TierDeps(
        nodes=cache,
        node_devices=_Cache(devices),
        dumps=_Cache(dumps),
        topology_file=topology,
        patch_node=patch,
        node_event=lambda n, e: events.append((n, e)),
        require_synced=lambda: None,
        requeue_after=lambda k, d: None,
    )
    return deps, patches, events


def _superpod() -> tuple[list[Any], list[Any], list[Any]]:
    records = sp.records()
    nodes = [node_view({"metadata": {"name": n, "labels": {}}}) for n in records]
    cm = {
        "metadata": {"name": "ibnetdiscover-compute"},
        "data": {"ibnetdiscover.txt": sp.dump()},
    }
    return nodes, list(records.values()), [cm]


def test_writes_once_then_nothing_when_nothing_changed() -> None:
    nodes, devices, dumps = _superpod()
    deps, patches, events = _deps(nodes, devices, dumps)
    TierLabels(deps).reconcile("t")
    assert len(patches) == len(nodes)
    failed = {n for n, e in events if e.reason == "ScaleOutCablingFailed"}
    assert failed == {"dgx009", "dgx010", "dgx011", "dgx017"}
    dgx009 = deps.nodes.get("dgx009")
    assert not any(k in dgx009["metadata"]["labels"] for k in TIER_LABELS)
    assert json.loads(dgx009["metadata"]["annotations"][labels.CABLING_CHECK])["result"] == "Failed"
    patches.clear()
    events.clear()
    TierLabels(deps).reconcile("t")
    assert patches == []
    assert events == []


def test_unreadable_inputs_decide_nothing(tmp_path: Path) -> None:
    nodes, devices, dumps = _superpod()
    bad = {"metadata": {"name": "ibnetdiscover-broken"}, "data": {"ibnetdiscover.txt": "oops\n"}}
    deps, patches, _ = _deps(nodes, devices, [*dumps, bad])
    with pytest.raises(InputUnreadable, match="ConfigMap ibnetdiscover-broken line 1"):
        TierLabels(deps).reconcile("t")
    assert patches == []
    topology = tmp_path / "topology.yaml"
    topology.write_text("nodes: [not, a, map]\n")
    deps, patches, _ = _deps(nodes, devices, dumps, str(topology))
    with pytest.raises(InputUnreadable, match="topology file"):
        TierLabels(deps).reconcile("t")
    assert patches == []
    deps, patches, _ = _deps(nodes, devices, dumps, str(tmp_path / "missing.yaml"))
    with pytest.raises(InputUnreadable, match=r"missing\.yaml"):
        TierLabels(deps).reconcile("t")
    assert patches == []


def test_a_node_whose_agent_never_reported_is_left_alone() -> None:
    nodes, devices, dumps = _superpod()
    nodes.append(node_view({"metadata": {"name": "new", "labels": {TIER_LABELS[0]: "old"}}}))
    deps, patches, _ = _deps(nodes, devices, dumps)
    TierLabels(deps).reconcile("t")
    assert "new" not in {n for n, _ in patches}


def test_a_node_status_heartbeat_leaves_the_cached_node_equal() -> None:
    """The Node cache keeps no resourceVersion or status: a heartbeat computes no tree."""
    before = {"metadata": {"name": "n", "resourceVersion": "1", "labels": {"team": "a"}}}
    after = {
        "metadata": {"name": "n", "resourceVersion": "2", "labels": {"team": "a"}},
        "status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": "now"}]},
    }
    assert node_view(before) == node_view(after)
    tiered = {"metadata": {"name": "n", "labels": {TIER_LABELS[0]: "leaf"}}}
    assert node_view(tiered) != node_view(before)


def test_one_topology_file_poll_is_pending_however_many_reconciles(tmp_path: Path) -> None:
    topology = tmp_path / "topology.yaml"
    topology.write_text("switches: {}\n")
    nodes, devices, dumps = _superpod()
    deps, _, _ = _deps(nodes, devices, dumps, str(topology))
    polls: list[float] = []
    now = [100.0]
    deps = replace(deps, requeue_after=lambda k, d: polls.append(d), clock=lambda: now[0])
    tiers = TierLabels(deps)
    for _ in range(5):  # events in a burst
        tiers.reconcile("t")
    assert polls == [60.0]
    now[0] += 60.0  # the poll fires
    tiers.reconcile("t")
    assert polls == [60.0, 60.0]


def test_a_disagreement_on_a_node_without_a_block_is_still_recorded() -> None:
    """A storage NIC's declared and measured neighbours disagree; no compute NIC has a leaf."""
    nic = {
        "name": "ibp41s0f0",
        "rdma": True,
        "scaleOut": {
            "role": "storage",
            "disagreement": "declared storage-leaf0 port 3, measured port 9",
            "neighbour": {"switch": "0x1", "source": "measured", "via": "smp"},
        },
    }
    nodes = [node_view({"metadata": {"name": "s1", "labels": {}}})]
    devices = [{"metadata": {"name": "s1"}, "spec": {"interfaces": [nic]}}]
    deps, patches, events = _deps(nodes, devices, [])
    TierLabels(deps).reconcile("t")
    record = json.loads(deps.nodes.get("s1")["metadata"]["annotations"][labels.CABLING_CHECK])
    assert record["result"] == "Failed"
    assert "measured port 9" in record["findings"][0]
    assert [e.reason for _, e in events] == ["ScaleOutCablingFailed"]
    assert len(patches) == 1
