"""AWS EFA as a device kind (issue 21 point 3): discovered from sysfs as the kernel lays an EFA
function out (PCI 0x1d0f:0xefa0-0xefa3 bound to `efa`, RDMA device `efa_N`, no netdev), off
unless `--efa`, published as `type: efa`, and prepared as its own `/dev/infiniband/uverbsN`
plus libfabric's environment (`FI_PROVIDER=efa`; `FI_EFA_USE_DEVICE_RDMA=1` where the node
says its EFA devices do RDMA read), never NCCL_IB_HCA or rdma_cm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceConfig, DeviceInventory
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.hostdevices import HostLayout
from fabricdra.kubeletplugin.kinds import efa
from fabricdra.kubeletplugin.kinds.nvidia.claims import NvidiaClaims
from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import ToolkitSpecs
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint
from fabricdra.kubeletplugin.prepare import CDI_KIND, DevicesDriver
from fabricdra.kubeletplugin.resourceslices import TAINT_KEY, build_slices
from tests.integration.kubelethost import UVERBS_MAJOR, mknod
from tests.sysfs.builder import AMAZON, SysfsBuilder
from tests.sysfs.nodes import aws_efa_node, discover_at
from tests.unit.test_prepare import Cdi, Claims, kubelet_ids

EFA0, EFA1 = "efa-0000-51-00-0", "efa-0000-52-00-0"
ON = DeviceConfig(efa=True)


def _inventory(root: Path, config: DeviceConfig = ON) -> DeviceInventory:
    d = discover_at(root)
    return build_devices(d.interfaces or [], d.accelerators or [], config, sysfs=SysfsTree(root))


def _published(inventory: DeviceInventory) -> dict[str, dict[str, Any]]:
    plan = build_slices(inventory, "n")
    return {d["name"]: d for s in plan.slices for d in s["spec"].get("devices", [])}


@pytest.fixture
def node(tmp_path: Path) -> Path:
    b = SysfsBuilder(tmp_path / "sys")
    aws_efa_node(b, efas=2)
    return b.root


def test_efa_is_off_by_default(node: Path) -> None:
    names = [d.name for d in _inventory(node, DeviceConfig())]
    assert names == ["gpu-0000-50-00-0"]


def test_efa_functions_are_offered_as_their_own_kind(node: Path) -> None:
    inventory = _inventory(node)
    assert [d.name for d in inventory] == [EFA0, EFA1, "gpu-0000-50-00-0"]
    # never also as plain RDMA endpoints, and the ENA function (no RDMA device) is not one
    assert [d.type for d in inventory] == ["efa", "efa", "gpu"]
    attrs = _published(inventory)[EFA0]["attributes"]
    gpu = _published(inventory)["gpu-0000-50-00-0"]["attributes"]
    assert attrs["type"] == {"string": "efa"}
    assert attrs["rdmaDevice"] == {"string": "efa_0"}
    assert attrs["linkVerdict"] == {"string": "OK"}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": "0000:51:00.0"}
    assert attrs["resource.kubernetes.io/numaNode"] == {"int": 0}
    # the GPU behind the same switch shares its root port: a matchAttribute pairs them
    for key in ("pciRoot", "resource.kubernetes.io/pcieRoot"):
        assert attrs[key] == gpu[key]
    assert attrs["pciSwitch"] == {"string": "0000:42:01.0"}  # its own downstream port
    assert "rdmaMode" not in attrs
    assert "netdev" not in attrs


@pytest.mark.parametrize(
    ("device", "offered"),
    [("0xefa0", True), ("0xefa2", True), ("0xefa3", True), ("0xec20", False), ("0xefaf", False)],
)
def test_only_efa_pci_ids_are_efa(tmp_path: Path, device: str, offered: bool) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rp = b.bridge(b.root_bus("pci0000:40"), "0000:40:01.0", 0)
    b.efa(rp, "0000:41:00.0", "rdmap65s0", device=device)  # a udev-renamed RDMA device
    b.loopback()
    assert [d.name for d in _inventory(b.root)] == (["efa-0000-41-00-0"] if offered else [])


def test_another_vendors_rdma_device_is_not_efa(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rp = b.bridge(b.root_bus("pci0000:40"), "0000:40:01.0", 0)
    pf = b.pci(rp, "0000:41:00.0", vendor="0x15b3", device="0xefa1", driver="efa")
    b.rdma(pf, "efa_0")
    b.loopback()
    assert [d.name for d in _inventory(b.root)] == []
    assert AMAZON == "0x1d0f"


def test_a_port_down_taints_the_efa_device_stably(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    aws_efa_node(b, efas=2, down=(1,))
    first, second = _inventory(b.root), _inventory(b.root)
    sick = next(d for d in first if d.name == EFA1)
    assert sick.health == "Unhealthy"
    published = _published(first)
    assert published[EFA1]["taints"] == [
        {"key": TAINT_KEY, "value": "efa-link-down", "effect": "NoSchedule"}
    ]
    assert "taints" not in published[EFA0]
    # no first-seen time of our own: the server stamps timeAdded once, so passes compare equal
    assert _published(second) == published


# -- prepare -----------------------------------------------------------------------------


def _driver(tmp_path: Path, root: Path, claims: Claims, config: DeviceConfig) -> DevicesDriver:
    inventory = _inventory(root, config)
    dev = tmp_path / "dev"
    for d in inventory:
        verbs = efa.payload_of(d).endpoint.verbsDevice if d.type == "efa" else None
        if verbs:
            n = int(verbs.removeprefix("uverbs"))
            mknod(dev / "infiniband" / verbs, UVERBS_MAJOR, 192 + n)
    mknod(dev / "infiniband" / "rdma_cm", 10, 58)  # there, and still not handed over
    return DevicesDriver(
        node_name="node-a",
        inventory=lambda: inventory,
        claims=claims,
        cdi=CdiWriter(tmp_path / "cdi", CDI_KIND),
        checkpoint=Checkpoint(tmp_path / "state" / "checkpoint.json", boot_id="boot-1"),
        host=HostLayout(dev, tmp_path / "proc", root),
        families=(NvidiaClaims(ToolkitSpecs(())),),
        devices=config,
    )


def test_prepare_hands_over_its_own_verbs_device_and_libfabrics_env(
    tmp_path: Path, node: Path
) -> None:
    claims = Claims()
    driver = _driver(tmp_path, node, claims, ON)
    claim = claims.add("efa", [{"request": "efa", "device": EFA1}])
    ids = kubelet_ids(driver.prepare(claim))
    cdi = Cdi(tmp_path / "cdi")
    assert cdi.node_paths(ids) == {"/dev/infiniband/uverbs1"}  # efa_1's, not efa_0's
    assert cdi.env_values(ids, "FI_PROVIDER") == {"efa"}
    assert cdi.env_values(ids, "FI_EFA_USE_DEVICE_RDMA") == set()  # libfabric decides
    env = [e for edits in cdi.edits(ids) for e in edits.get("env", [])]
    assert not [e for e in env if e.startswith(("NCCL_IB_HCA=", "NVIDIA_VISIBLE_DEVICES="))]


def test_device_rdma_on_requires_it_of_libfabric(tmp_path: Path, node: Path) -> None:
    claims = Claims()
    config = DeviceConfig(efa=True, efa_device_rdma=True)
    driver = _driver(tmp_path, node, claims, config)
    claim = claims.add(
        "efa", [{"request": "efa", "device": EFA0}, {"request": "efa", "device": EFA1}]
    )
    ids = kubelet_ids(driver.prepare(claim))
    cdi = Cdi(tmp_path / "cdi")
    assert cdi.node_paths(ids) == {"/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"}
    assert cdi.env_values(ids, "FI_EFA_USE_DEVICE_RDMA") == {"1"}
    assert cdi.env_values(ids, "FI_PROVIDER") == {"efa"}


def test_an_efa_device_is_not_shared(tmp_path: Path, node: Path) -> None:
    from fabricdra.kubeletplugin.kubelet import PrepareError

    claims = Claims()
    driver = _driver(tmp_path, node, claims, ON)
    driver.prepare(claims.add("one", [{"request": "efa", "device": EFA0}]))
    with pytest.raises(PrepareError, match=EFA0):
        driver.prepare(claims.add("two", [{"request": "efa", "device": EFA0}]))


# -- the node agent ------------------------------------------------------------------------


def test_the_agent_offers_efa_from_its_pass_and_prepares_with_its_settings(
    tmp_path: Path,
) -> None:
    import json

    from fabricdra.kubeletplugin.agent import Agent
    from tests.sysfs.nodes import h100_snapshot
    from tests.unit.agentkit import offline_config
    from tests.unit.test_xid_events import Captured

    b = SysfsBuilder(tmp_path / "sys")
    node = aws_efa_node(b, efas=2)
    (tmp_path / "nvml.json").write_text(json.dumps(h100_snapshot(node.gpus)))
    claims = Claims()
    dev = tmp_path / "dev"
    for i in range(2):
        mknod(dev / "infiniband" / f"uverbs{i}", UVERBS_MAJOR, 192 + i)
    config = offline_config(
        tmp_path,
        b.root,
        node_name="node-a",
        nvml_snapshot=tmp_path / "nvml.json",
        dev_root=dev,
        devices=DeviceConfig(efa=True, efa_device_rdma=True),
    )
    agent = Agent(config, None, publisher=Captured(), claims=claims)
    inventory = agent.pass_once()
    assert [d.name for d in inventory if d.type == "efa"] == [EFA0, EFA1]
    ids = kubelet_ids(agent.driver.prepare(claims.add("efa", [{"request": "efa", "device": EFA1}])))
    cdi = Cdi(tmp_path / "cdi")
    assert cdi.node_paths(ids) == {"/dev/infiniband/uverbs1"}
    assert cdi.env_values(ids, "FI_EFA_USE_DEVICE_RDMA") == {"1"}
