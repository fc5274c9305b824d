"""Intel Gaudi as a device family (issue 31 point 6): off unless `--gaudi`; each Gaudi bound to
`habanalabs` with an accel device is one device (`type: gaudi`) with its PCI placement, model
and on-chip scale-out ports; prepare hands the container exactly its own two accel nodes.
Real discovery over kernel-shaped trees (tests/sysfs/nodes.py `gaudi_node`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fabricdra.cli import main
from fabricdra.kubeletplugin.assembly import assemble
from fabricdra.kubeletplugin.devices import DeviceConfig, DeviceInventory
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.hostdevices import HostLayout
from fabricdra.kubeletplugin.kinds.gaudi import payload_of
from fabricdra.kubeletplugin.kinds.gaudi.sysfs import GaudiRecord
from fabricdra.kubeletplugin.kinds.nvidia.claims import NvidiaClaims
from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import ToolkitSpecs
from fabricdra.kubeletplugin.kubelet import PrepareError
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint
from fabricdra.kubeletplugin.prepare import CDI_KIND, DevicesDriver
from fabricdra.kubeletplugin.resourceslices import build_slices
from tests.integration.kubelethost import mknod
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import discover_at, gaudi_node
from tests.unit.test_prepare import Cdi, Claims, kubelet_ids

G0, G1 = "gaudi-0000-33-00-0", "gaudi-0000-34-00-0"
ON = DeviceConfig(gaudi=True)
ACCEL_MAJOR = 261  # include/drm/drm_accel.h


def _inventory(root: Path, config: DeviceConfig = ON) -> DeviceInventory:
    return assemble(discover_at(root), config, SysfsTree(root))


def _published(inventory: DeviceInventory) -> dict[str, dict[str, Any]]:
    plan = build_slices(inventory, "n")
    return {d["name"]: d for s in plan.slices for d in s["spec"].get("devices", [])}


@pytest.fixture
def node(tmp_path: Path) -> Path:
    b = SysfsBuilder(tmp_path / "sys")
    gaudi_node(b, gaudis=2, ports=3)
    return b.root


def test_gaudi_is_off_by_default(node: Path) -> None:
    assert [d for d in _inventory(node, DeviceConfig()) if d.type == "gaudi"] == []


def test_each_gaudi_is_one_device_with_its_placement_and_scale_out_ports(node: Path) -> None:
    inventory = _inventory(node)
    assert [d.name for d in inventory if d.type == "gaudi"] == [G0, G1]
    attrs = _published(inventory)[G1]["attributes"]
    assert attrs["type"] == {"string": "gaudi"}
    assert attrs["model"] == {"string": "gaudi2"}  # PCI 0x1da3:0x1020
    assert attrs["vendor"] == {"string": "habana"}
    assert attrs["scaleOutPorts"] == {"int": 3}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:34:00.0"}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:30"}
    assert attrs["pciSwitch"] == {"string": "0000:32:01.0"}  # its own downstream port
    # its ports are on the chip: offered as RDMA endpoints too, named after their RDMA device
    assert {d.name for d in inventory if d.type == "rdma"} == {f"rdma-hbl-{k}" for k in range(6)}


def test_the_ports_and_nodes_are_each_gaudis_own(node: Path) -> None:
    payloads = [payload_of(d).record for d in _inventory(node) if d.type == "gaudi"]
    assert payloads == [
        GaudiRecord(0, ("hbl_0", "hbl_1", "hbl_2")),
        GaudiRecord(1, ("hbl_3", "hbl_4", "hbl_5")),
    ]


def test_a_gaudi_with_no_accel_device_or_another_driver_is_not_offered(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rp = b.bridge(b.root_bus("pci0000:30"), "0000:30:01.0", 0)
    b.gaudi(rp, "0000:33:00.0", 0)
    b.gaudi(rp, "0000:34:00.0", 1, driver="vfio-pci")  # passed through to a VM
    rp2 = b.bridge(b.root_bus("pci0000:40"), "0000:40:01.0", 0)
    b.gaudi(rp2, "0000:41:00.0", 2)
    (b.root / "class" / "accel" / "accel2").unlink()  # its accel device not (yet) there
    assert [d.name for d in _inventory(b.root) if d.type == "gaudi"] == [G0]


def _driver(tmp_path: Path, root: Path, claims: Claims) -> DevicesDriver:
    inventory = _inventory(root)
    dev = tmp_path / "dev"
    for n in range(2):
        mknod(dev / "accel" / f"accel{n}", ACCEL_MAJOR, n)
        mknod(dev / "accel" / f"accel_controlD{n}", 510, n)
    return DevicesDriver(
        node_name="node-a",
        inventory=lambda: inventory,
        claims=claims,
        cdi=CdiWriter(tmp_path / "cdi", CDI_KIND),
        checkpoint=Checkpoint(tmp_path / "state" / "checkpoint.json", boot_id="boot-1"),
        host=HostLayout(dev, tmp_path / "proc", root),
        families=(NvidiaClaims(ToolkitSpecs(())),),
        devices=ON,
    )


def test_prepare_hands_over_exactly_its_own_accel_nodes(tmp_path: Path, node: Path) -> None:
    claims = Claims()
    driver = _driver(tmp_path, node, claims)
    ids = kubelet_ids(driver.prepare(claims.add("g", [{"request": "g", "device": G1}])))
    cdi = Cdi(tmp_path / "cdi")
    assert cdi.node_paths(ids) == {"/dev/accel/accel1", "/dev/accel/accel_controlD1"}
    env = [e for edits in cdi.edits(ids) for e in edits.get("env", [])]
    assert not [e for e in env if e.startswith(("NCCL_IB_HCA=", "NVIDIA_VISIBLE_DEVICES="))]


def test_a_gaudi_is_not_shared(tmp_path: Path, node: Path) -> None:
    claims = Claims()
    driver = _driver(tmp_path, node, claims)
    driver.prepare(claims.add("one", [{"request": "g", "device": G0}]))
    with pytest.raises(PrepareError, match=G0):
        driver.prepare(claims.add("two", [{"request": "g", "device": G0}]))


def test_a_missing_accel_node_fails_prepare_naming_it(tmp_path: Path, node: Path) -> None:
    claims = Claims()
    driver = _driver(tmp_path, node, claims)
    (tmp_path / "dev" / "accel" / "accel_controlD0").unlink()
    with pytest.raises(Exception, match="accel_controlD0"):
        driver.prepare(claims.add("g", [{"request": "g", "device": G0}]))


def test_inventory_previews_gaudi_with_the_flag(
    capsys: pytest.CaptureFixture[str], node: Path
) -> None:
    args = ["inventory", "--sysfs-root", str(node), "--node-name", "n", "--gaudi"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    names = {d["name"] for s in doc["resourceSlices"] for d in s["spec"].get("devices", [])}
    assert {G0, G1} <= names
