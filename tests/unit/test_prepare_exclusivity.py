"""prepare is the last line of defence (issue 17): it hands a container only what its claim was
allocated, refuses a device another claim holds in a way the node did not offer, never offers
what it cannot serve, and keeps a GPU that fell off the bus published, tainted.

Over the fake host of the kubelet-plugin tests (an HGX sysfs tree, recorded NVML answers, real
character devices in a dev root); claims come from an in-memory claim store instead of the API
server, and the inventory is switched between prepares as the node's state changes (RDMA mode,
MIG mode, SR-IOV VFs)."""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.inventory import Accelerator, Interface
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import (
    DeviceConfig,
    DeviceInventory,
    lost_accelerators,
)
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.exclusivity import Hold, find_conflict, may_coexist, recorded_hold
from fabricdra.kubeletplugin.kinds.accelerator import payload_of
from fabricdra.kubeletplugin.kinds.nvidia.claims import NvidiaClaims
from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import ToolkitSpecs
from fabricdra.kubeletplugin.kubelet import ClaimRef, PrepareError
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint, ClaimEntry, PreparedRecord
from fabricdra.kubeletplugin.prepare import CDI_KIND, DevicesDriver
from fabricdra.kubeletplugin.resourceslices import TAINT_KEY, build_slices
from tests.integration.kubelethost import Host, build_host
from tests.sysfs.builder import CLASS_ACCEL, SysfsBuilder

NODE = "node-a"
DRIVER = "devices.fabricdra.io"
GPU0 = "gpu-0000-18-00-0"
GPU7 = "gpu-0000-cd-00-0"  # MIG-capable in the host below
MIG71, MIG72 = "mig-0000-cd-00-0-gi1-ci0", "mig-0000-cd-00-0-gi2-ci0"
NIC0 = "rdma-0000-19-00-0"
PF6, VF60 = "rdma-0000-bd-00-0", "rdma-0000-bd-00-2"  # mlx5_6 and its first VF
SHARE_A = "0f0e0d0c-1111-2222-3333-444455556666"
SHARE_B = "1f0e0d0c-1111-2222-3333-444455556666"

# -- the rule, as a table ---------------------------------------------------------------------

EX, SH, AD = "exclusive", "shared", "admin"


@pytest.mark.parametrize(
    ("held", "wanted", "ok"),
    [
        # one device
        (Hold(NIC0, None, EX), Hold(NIC0, None, EX), False),
        (Hold(NIC0, None, EX), Hold(NIC0, None, SH), False),  # a share on an exclusive hold
        (Hold(NIC0, None, SH), Hold(NIC0, None, EX), False),  # exclusive on a shared hold
        (Hold(NIC0, None, SH), Hold(NIC0, None, SH), True),
        (Hold(NIC0, None, EX), Hold(NIC0, None, AD), True),
        (Hold(NIC0, None, AD), Hold(NIC0, None, EX), True),
        (Hold(NIC0, None, AD), Hold(NIC0, None, SH), True),
        # a GPU and its MIG instances, both ways; two instances of one GPU do not meet
        (Hold(GPU7, None, EX), Hold(MIG71, GPU7, EX), False),
        (Hold(MIG71, GPU7, EX), Hold(GPU7, None, EX), False),
        (Hold(MIG71, GPU7, EX), Hold(MIG72, GPU7, EX), True),
        (Hold(MIG71, GPU7, EX), Hold(GPU7, None, AD), True),
        # a PF and its VFs, both ways, also a shared PF (a VF is always exclusive)
        (Hold(PF6, None, EX), Hold(VF60, PF6, EX), False),
        (Hold(VF60, PF6, EX), Hold(PF6, None, EX), False),
        (Hold(VF60, PF6, EX), Hold(PF6, None, SH), False),
        (Hold(PF6, None, SH), Hold(VF60, PF6, EX), False),
        (Hold(VF60, PF6, EX), Hold("rdma-0000-bd-00-3", PF6, EX), True),
        # different hardware
        (Hold(NIC0, None, EX), Hold(GPU0, None, EX), True),
    ],
)
def test_which_holds_may_coexist(held: Hold, wanted: Hold, ok: bool) -> None:
    assert may_coexist(held, wanted) is ok
    assert may_coexist(wanted, held) is ok


@pytest.mark.parametrize(
    ("record", "hold"),
    [
        (PreparedRecord(NIC0, NIC0, ("x",), ("r",), None), Hold(NIC0, None, EX)),
        (PreparedRecord(NIC0, NIC0, ("x",), ("r",), SHARE_A), Hold(NIC0, None, SH)),
        (PreparedRecord(f"{NIC0}-s3", NIC0, ("x",), ("r",), None), Hold(NIC0, None, SH)),
        (PreparedRecord(NIC0, NIC0, ("x",), ("r",), None, True), Hold(NIC0, None, AD)),
        (PreparedRecord(VF60, VF60, ("x",), ("r",), None, within=PF6), Hold(VF60, PF6, EX)),
        # written before `within` was recorded: a MIG name says its GPU
        (PreparedRecord(MIG71, MIG71, ("x",), ("r",), None), Hold(MIG71, GPU7, EX)),
    ],
)
def test_what_a_checkpoint_record_holds(record: PreparedRecord, hold: Hold) -> None:
    assert recorded_hold(record) == hold
    assert PreparedRecord.from_dict(record.to_dict()) == record


def test_a_claim_conflicts_with_its_own_earlier_devices_too() -> None:
    other = ClaimEntry("u1", "ns", "a", (), (PreparedRecord(GPU0, GPU0, ("x",), ("r",), None),))
    wanted = [Hold(NIC0, None, EX), Hold(NIC0, None, SH)]
    conflict = find_conflict("u2", wanted, [other])
    assert conflict is not None
    assert (conflict.index, conflict.holder) == (1, None)
    assert find_conflict("u1", [Hold(GPU0, None, EX)], [other]) is None  # its own entry


# -- through the driver, over the fake host --------------------------------------------------


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Host:
    return build_host(tmp_path_factory.mktemp("host"), mig_gpu=7)


@dataclass
class ClaimStore:
    """The API's side of a claim read: ResourceClaims as JSON, allocated by "the scheduler"."""

    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    _uids: itertools.count[int] = field(default_factory=itertools.count)

    def add(self, name: str, results: Sequence[dict[str, Any]]) -> ClaimRef:
        uid = f"00000000-0000-0000-0000-{next(self._uids):012d}"
        self.claims[("ns", name)] = {
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "status": {
                "allocation": {
                    "devices": {"results": [{"driver": DRIVER, "pool": NODE, **r} for r in results]}
                }
            },
        }
        return ClaimRef(namespace="ns", name=name, uid=uid)

    def read_claim(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        return self.claims[(namespace, name)]


class Node:
    """The driver on the fake host; `inventory` is what the node offers now."""

    def __init__(self, base: Path, host: Host, inventory: DeviceInventory) -> None:
        self.host, self.inventory = host, inventory
        self.store = ClaimStore()
        self.driver = DevicesDriver(
            node_name=NODE,
            inventory=lambda: self.inventory,
            claims=self.store,
            cdi=CdiWriter(base / "cdi", CDI_KIND),
            checkpoint=Checkpoint(base / "checkpoint.json", boot_id="boot-1"),
            host=host.layout,
            families=(NvidiaClaims(ToolkitSpecs(())),),
        )

    def prepare(self, name: str, *results: dict[str, Any]) -> str:
        """The empty string when prepared, else prepare's error."""
        try:
            self.driver.prepare(self.store.add(name, results))
        except PrepareError as e:
            return str(e)
        return ""


def res(request: str, device: str, **extra: Any) -> dict[str, Any]:
    return {"request": request, "device": device, **extra}


def inventory(host: Host, *, mode: str = "exclusive", mig: bool = True, vfs: bool = True) -> Any:
    """The host's inventory in one node state: RDMA mode, MIG mode of GPU 7 on or off, the
    SR-IOV VFs of mlx5_6/mlx5_7 configured or removed."""
    accs: list[Accelerator] = list(host.discovery.accelerators or [])
    if not mig:
        accs = [a.model_copy(update={"migMode": False, "migDevices": []}) for a in accs]
    ifaces: list[Interface] = list(host.discovery.interfaces or [])
    if not vfs:
        ifaces = [
            i.model_copy(update={"virtualFunctions": [], "sriovVfsConfigured": False})
            for i in ifaces
        ]
    return build_devices(ifaces, accs, DeviceConfig(rdma_mode=mode))  # type: ignore[arg-type]


@pytest.fixture
def node(tmp_path: Path, host: Host) -> Node:
    return Node(tmp_path, host, inventory(host))


def test_a_share_never_lands_on_a_nic_held_exclusively_before_an_rdma_mode_switch(
    node: Node,
) -> None:
    assert node.prepare("first", res("nic", NIC0)) == ""
    node.inventory = inventory(node.host, mode="shared")
    error = node.prepare("share", res("nic", NIC0, shareID=SHARE_A))
    assert f"device {NIC0} (request nic) is already prepared for claim ns/first" in error
    assert "exclusively; a share cannot be added" in error
    # 1.34/1.35 model: a holder name of the now shared endpoint
    assert "already prepared for claim ns/first" in node.prepare("holder", res("nic", f"{NIC0}-s2"))


def test_an_exclusive_grant_never_lands_on_a_nic_held_shared_before_a_switch(node: Node) -> None:
    node.inventory = inventory(node.host, mode="shared")
    assert node.prepare("a", res("nic", NIC0, shareID=SHARE_A)) == ""
    assert node.prepare("b", res("nic", NIC0, shareID=SHARE_B)) == ""  # shares coexist
    node.inventory = inventory(node.host, mode="exclusive")
    error = node.prepare("excl", res("nic", NIC0))
    assert "as a share; this claim was allocated it exclusively" in error
    # a share allocated before the switch: the node no longer offers the endpoint shared
    error = node.prepare("late-share", res("nic", NIC0, shareID="2f0e0d0c-1111-2222-3333-4444"))
    assert "allocated as a share" in error
    assert "does not offer it shared" in error


def test_a_share_id_on_a_device_never_published_shared_is_refused(node: Node) -> None:
    error = node.prepare("gpu-share", res("gpu", GPU0, shareID=SHARE_A))
    assert f"device {GPU0} (request gpu)" not in error  # nobody holds it: refused anyway
    assert "does not offer it shared" in error
    assert node.prepare("gpu", res("gpu", GPU0)) == ""
    assert "does not offer it shared" in node.prepare("again", res("gpu", GPU0, shareID=SHARE_B))
    assert [e.name for e in node.driver.checkpoint.entries()] == ["gpu"]


def test_a_whole_gpu_and_its_mig_instances_exclude_each_other_both_ways(
    tmp_path: Path, host: Host
) -> None:
    # the GPU prepared whole, then MIG mode turned on and instances created
    node = Node(tmp_path / "a", host, inventory(host, mig=False))
    assert node.prepare("whole", res("gpu", GPU7)) == ""
    node.inventory = inventory(host, mig=True)
    error = node.prepare("slice", res("mig", MIG71))
    assert f"device {MIG71} (request mig) is part of {GPU7}, which is already prepared" in error
    # the other way: an instance prepared, then MIG mode turned off
    node = Node(tmp_path / "b", host, inventory(host, mig=True))
    assert node.prepare("slice-1", res("mig", MIG71)) == ""
    assert node.prepare("slice-2", res("mig", MIG72)) == ""  # two instances of one GPU
    node.inventory = inventory(host, mig=False)
    error = node.prepare("whole", res("gpu", GPU7))
    assert f"device {GPU7} (request gpu) contains {MIG71}, which is already prepared" in error


def test_a_pf_and_its_vfs_exclude_each_other_both_ways(tmp_path: Path, host: Host) -> None:
    # the PF prepared whole, then VFs created
    node = Node(tmp_path / "a", host, inventory(host, vfs=False))
    assert node.prepare("pf", res("nic", PF6)) == ""
    node.inventory = inventory(host, vfs=True)
    assert f"is part of {PF6}, which is already prepared" in node.prepare("vf", res("nic", VF60))
    # the other way: a VF prepared, then the VFs removed; also in shared mode
    node = Node(tmp_path / "b", host, inventory(host, vfs=True))
    assert node.prepare("vf", res("nic", VF60)) == ""
    node.inventory = inventory(host, vfs=False, mode="shared")
    error = node.prepare("pf", res("nic", PF6, shareID=SHARE_A))
    assert f"device {PF6} (request nic) contains {VF60}, which is already prepared" in error
    node.inventory = inventory(host, vfs=False)
    assert f"contains {VF60}" in node.prepare("pf-excl", res("nic", PF6))


def test_admin_access_overlaps_anything(node: Node) -> None:
    assert node.prepare("user", res("gpu", GPU0)) == ""
    assert node.prepare("admin", res("gpu", GPU0, adminAccess=True)) == ""
    assert node.prepare("admin-share", res("nic", NIC0, adminAccess=True)) == ""
    assert node.prepare("user-nic", res("nic", NIC0)) == ""


# -- only what prepare can serve is offered (point 5) ----------------------------------------


def test_accelerators_prepare_cannot_serve_are_not_offered(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rb = b.root_bus()
    b.pci(rb, "0000:00:03.0", vendor="0x1da3", pci_class=CLASS_ACCEL)  # Habana Gaudi
    b.pci(rb, "0000:00:04.0", vendor="0x19e5", pci_class=CLASS_ACCEL)  # Huawei Ascend
    b.pci(rb, "0000:00:05.0", vendor="0x1e52", pci_class=CLASS_ACCEL)  # Tenstorrent
    b.gpu(rb, "0000:00:06.0")  # NVIDIA
    b.gpu(rb, "0000:00:07.0", vendor="0x1002")  # AMD
    d = discover(SysfsTree(b.root))
    # discovery (and with it NodeDevices) still reports every accelerator
    assert [a.vendor for a in d.accelerators or []] == [
        "habana",
        "huawei",
        "tenstorrent",
        "nvidia",
        "amd",
    ]
    devices = build_devices([], d.accelerators or [])
    assert [dev.name for dev in devices] == ["gpu-0000-00-06-0", "gpu-0000-00-07-0"]
    slices = build_slices(devices, NODE).slices
    assert [x["name"] for x in slices[0]["spec"]["devices"]] == [
        "gpu-0000-00-06-0",
        "gpu-0000-00-07-0",
    ]


# -- a GPU that falls off the bus (point 9) --------------------------------------------------


def test_a_gpu_that_left_the_bus_stays_published_tainted_and_is_refused(
    tmp_path: Path, host: Host
) -> None:
    seen = {a.pciBusId: a for a in host.discovery.accelerators or []}
    # the kernel removed GPU 7's PCI function (and NVML no longer reports it)
    b = SysfsBuilder(tmp_path / "sys")
    shutil.copytree(host.root / "sys", b.root, symlinks=True, dirs_exist_ok=True)
    gone = "0000:cd:00.0"
    b.remove_pci(gone)
    snapshot = json.loads(host.nvml_snapshot.read_text())
    del snapshot[gone]
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps(snapshot))
    now = discover(SysfsTree(b.root), lambda: load_snapshot(nvml))
    assert gone not in {a.pciBusId for a in now.accelerators or []}
    lost = lost_accelerators(now.accelerators, seen)
    assert [a.pciBusId for a in lost] == [gone]
    assert lost_accelerators(None, seen) == []  # a failed enumeration loses nothing
    devices = build_devices(now.interfaces or [], now.accelerators or [], lost=lost)
    # GPU 7 was in MIG mode: its instances stay, Unhealthy, tainted
    for name in (MIG71, MIG72):
        dev = devices.get(name)
        assert dev is not None
        assert (dev.health, payload_of(dev).lost) == ("Unhealthy", True)
        assert dev.health_reason is not None
        assert "left the PCI bus" in dev.health_reason
    published = {
        d["name"]: d for s in build_slices(devices, NODE).slices for d in s["spec"]["devices"]
    }
    assert published[MIG71]["taints"][0]["key"] == TAINT_KEY
    # GPU 0 has no health reading here: Unknown, which blocks nothing (effect None)
    assert [t["effect"] for t in published[GPU0].get("taints", [])] in ([], ["None"])
    assert all(t["key"] != TAINT_KEY for t in published[GPU0].get("taints", []))
    node = Node(tmp_path / "drv", host, devices)
    error = node.prepare("late", res("mig", MIG71))
    assert f"device {MIG71} (request mig) is no longer on the PCI bus" in error
