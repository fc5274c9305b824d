"""One assembly of a discovery pass (issue 31 point 4): the agent, `fabricdra inventory`'s
preview and the NodeDevices record see the same devices.

Before: the preview built devices without the node's device settings or its sysfs tree, so it
could never show EFA functions; it took no `--efa`; and EFA devices were published as slices
but absent from the NodeDevices record. Real discovery over a kernel-shaped AWS tree
(tests/sysfs/nodes.py `aws_efa_node`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.nodedevices import NodeDevicesSpec
from fabricdra.cli import build_parser, main
from fabricdra.cli.deviceflags import device_config
from fabricdra.cli.kubelet_plugin import build_config
from fabricdra.kubeletplugin.assembly import assemble
from fabricdra.kubeletplugin.devices import DeviceConfig, DeviceInventory
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.kinds import accelerator, efa
from fabricdra.kubeletplugin.publisher import node_devices_spec
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import aws_efa_node, discover_at

EFA0, EFA1 = "efa-0000-51-00-0", "efa-0000-52-00-0"
GPU = "gpu-0000-50-00-0"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    b = SysfsBuilder(tmp_path / "sys")
    aws_efa_node(b, efas=2)
    return b.root


def preview(capsys: pytest.CaptureFixture[str], root: Path, *flags: str) -> list[str]:
    """The device names `fabricdra inventory --node-name` prints in its resourceSlices."""
    assert main(["inventory", "--sysfs-root", str(root), "--node-name", "n", *flags]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return sorted(d["name"] for s in doc["resourceSlices"] for d in s["spec"].get("devices", []))


def test_inventory_previews_efa_devices_with_the_agents_flag(
    capsys: pytest.CaptureFixture[str], node: Path
) -> None:
    assert preview(capsys, node) == [GPU]  # off by default, as on the agent
    assert preview(capsys, node, "--efa") == [EFA0, EFA1, GPU]


def test_inventory_preview_is_the_agents_assembly(
    capsys: pytest.CaptureFixture[str], node: Path
) -> None:
    inventory = assemble(discover_at(node), DeviceConfig(efa=True), SysfsTree(node))
    assert preview(capsys, node, "--efa") == sorted(d.name for d in inventory)


DEVICE_FLAGS = [
    "--efa",
    "--efa-device-rdma",
    "--rdma-mode=shared",
    "--rdma-override=0000:1c:00.0=off",
    "--rdma-vfs=false",
    "--rdma-shared-holders=8",
    "--gpu-shares=4",
    "--dynamic-mig",
    "--gpus=false",
]


def test_inventory_and_the_kubelet_plugin_read_the_same_device_flags() -> None:
    parser = build_parser()
    agent = build_config(parser.parse_args(["kubelet-plugin", "--node-name=n", *DEVICE_FLAGS]))
    inventory = device_config(parser.parse_args(["inventory", *DEVICE_FLAGS]))
    assert inventory == agent.devices
    assert (inventory.efa, inventory.rdma_mode, inventory.gpu_shares) == (True, "shared", 4)
    assert device_config(parser.parse_args(["inventory"])) == DeviceConfig()


def test_inventory_refuses_bad_device_flags_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inventory", "--sample", "--rdma-override", "nonsense"]) == 2
    assert "rdma override must be MATCH=MODE" in capsys.readouterr().err


def _record(node: Path, config: DeviceConfig) -> tuple[DeviceInventory, NodeDevicesSpec]:
    discovery = discover_at(node)
    inventory = assemble(discovery, config, SysfsTree(node))
    spec = node_devices_spec(discovery, inventory, None)
    assert spec is not None
    return inventory, spec


def _recorded_buses(spec: NodeDevicesSpec) -> set[str]:
    buses = {i.pciBusId for i in spec.interfaces}
    buses |= {vf.pciBusId for i in spec.interfaces for vf in i.virtualFunctions}
    buses |= {a.pciBusId for g in spec.groups for a in g.accelerators}
    buses |= {a.pciBusId for a in spec.adapters}
    return {b for b in buses if b}


def test_every_published_device_is_in_the_node_devices_record(node: Path) -> None:
    inventory, spec = _record(node, DeviceConfig(efa=True))
    assert [d.name for d in inventory] == [EFA0, EFA1, GPU]
    for device in inventory:
        if device.type == "efa":
            bus = efa.payload_of(device).endpoint.pciBusId
        else:
            bus = accelerator.payload_of(device).accelerator.pciBusId
        assert bus in _recorded_buses(spec), f"{device.name} is not in the NodeDevices record"
    assert [(a.rdmaDevice, a.verbsDevice, a.link and a.link.verdict) for a in spec.adapters] == [
        ("efa_0", "uverbs0", "OK"),
        ("efa_1", "uverbs1", "OK"),
    ]


def test_efa_off_records_no_adapters(node: Path) -> None:
    _, spec = _record(node, DeviceConfig())
    assert spec.adapters == []
