"""Issue 32 point 2 against a real kube-apiserver 1.36: a Grace GPU's NUMA nodes published as a
list (`ints`) where DRAListTypeAttributes is on, and what a server with the gate off (the 1.36
default) does with the same slice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import ControlPlane
from e2e.harness.errors import HarnessError
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import gpu_info
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.publisher import NodePublisher
from tests.integration.dra_setup import install, installed  # noqa: F401 - a fixture
from tests.integration.test_publisher import Node
from tests.sysfs.nodes import h100_snapshot, write_json

pytestmark = pytest.mark.integration

NUMA = "resource.kubernetes.io/numaNode"


@pytest.fixture(scope="module")
def lists_on(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(
        tmp_path_factory.mktemp("lists-on"),
        apiserver_flags=("--feature-gates=DRAListTypeAttributes=true",),
    )
    try:
        cp.start()
    except HarnessError as e:
        pytest.fail(f"real control plane unavailable: {e}", pytrace=False)
    try:
        install(cp)
        yield cp
    finally:
        cp.stop()


def _grace_node(cp: ControlPlane, root: Path) -> Node:
    """The HGX fixture with GPU 0's memory onlined as NUMA nodes 4 and 5 (as on Grace), and a
    publisher that publishes lists."""
    node = Node(cp, root)
    snap = h100_snapshot(node.hgx.gpus)
    snap[node.hgx.gpus[0]]["memoryNumaNodes"] = [4, 5]
    node.readings = load_snapshot(write_json(root / "nvml-grace.json", snap))
    node.publisher = NodePublisher(node.api, node.name, list_attributes=True)
    return node


def _publish(node: Node) -> Any:
    d = node.discover()
    assert d.interfaces is not None
    assert d.accelerators is not None
    inventory = build_devices(d.interfaces, d.accelerators, gpu_info=gpu_info(d.nvml))
    return node.publisher.sync(d, inventory)


def _numa_as_stored(node: Node) -> dict[str, Any]:
    """Each device's numaNode as the server stored it (raw JSON: `ints` is newer than the
    client's models)."""
    with node.cp.api_client() as api:
        raw = client.ResourceV1Api(api).list_resource_slice(
            field_selector=f"spec.nodeName={node.name}", _preload_content=False
        )
    items = json.loads(raw.data)["items"]
    return {
        d["name"]: d["attributes"].get(NUMA) for s in items for d in s["spec"].get("devices") or []
    }


def _published_twice(cp: ControlPlane, root: Path) -> tuple[Node, dict[str, Any]]:
    """Publish the Grace node: the first pass succeeds, the second writes nothing (stored as
    sent). The node (its client closed) and each GPU's numaNode as stored, by GPU index."""
    node = _grace_node(cp, root)
    try:
        result = _publish(node)
        assert result.ok, result.errors
        stored = _numa_as_stored(node)
        assert _publish(node).writes == {}
    finally:
        node.api.close()
    gpus = [_bus_name(bus) for bus in node.hgx.gpus]
    return node, {str(i): stored[name] for i, name in enumerate(gpus)}


def _bus_name(bus: str) -> str:
    return "gpu-" + bus.replace(":", "-").replace(".", "-")


def test_a_grace_gpu_publishes_its_numa_nodes_as_a_list(
    lists_on: ControlPlane, tmp_path: Path
) -> None:
    _, numa = _published_twice(lists_on, tmp_path)
    assert numa["0"] == {"ints": [0, 4, 5]}
    assert numa["1"] == {"int": 0}  # one node: the scalar, as before


@pytest.mark.usefixtures("installed")
def test_where_the_gate_is_off_the_agent_falls_back_to_single_values(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The 1.36 default: the server drops `ints`, then refuses the attribute left empty (422
    "exactly one value must be specified"). The pool is published anyway, with the scalar,
    in the same pass, and stays so."""
    node, numa = _published_twice(control_plane, tmp_path)
    assert numa["0"] == {"int": 0}
    assert node.publisher.features is not None
    assert not node.publisher.features.list_attributes
