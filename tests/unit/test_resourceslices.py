"""ResourceSlice objects built from real discovery over kernel-shaped sysfs trees."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.inventory import Interface, LinkRecord, PciTopology
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import (
    Device,
    DeviceConfig,
    DeviceInventory,
    gpu_info,
)
from fabricdra.kubeletplugin.discovery.distance import distance
from fabricdra.kubeletplugin.discovery.node import Discovery, discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.kinds import accelerator, rdma
from fabricdra.kubeletplugin.resourceslices import (
    ApiFeatures,
    binary_quantity,
    build_slices,
    published_device_names,
    slice_name,
)
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import Hgx, h100_snapshot, hgx_h100, write_json

_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _discover(tmp_path: Path, mig_gpu: int | None = None, **kw: Any) -> tuple[Discovery, Hgx]:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b, **kw)
    snap = h100_snapshot(
        hgx.gpus,
        mig_gpu=mig_gpu,
        fabric={
            "clusterUuid": "5b0e1122-3344-5566-7788-99aabbccddef",
            "cliqueId": 1,
            "state": "completed",
            "status": "success",
        },
    )
    readings = load_snapshot(write_json(tmp_path / "nvml.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    return d, hgx


def _inventory(d: Discovery, **kw: Any) -> DeviceInventory:
    assert d.interfaces is not None
    assert d.accelerators is not None
    return build_devices(d.interfaces, d.accelerators, **kw)


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def test_hgx_slice_is_one_pool_with_every_device(tmp_path: Path) -> None:
    d, _ = _discover(tmp_path)
    plan = build_slices(_inventory(d), "node-a", generation=3)
    assert plan.omitted == {}
    (s,) = plan.slices
    assert s["apiVersion"] == "resource.k8s.io/v1"
    assert s["metadata"]["name"] == "node-a-devices.fabricdra.io-0"
    assert s["spec"]["driver"] == "devices.fabricdra.io"
    assert s["spec"]["nodeName"] == "node-a"
    assert s["spec"]["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 1}
    devs = _devices(plan.slices)
    assert len(devs) == 16
    gpu = devs["gpu-0000-18-00-0"]
    a = gpu["attributes"]
    assert a["type"] == {"string": "gpu"}
    assert a["vendor"] == {"string": "nvidia"}
    assert a["deviceClass"] == {"string": "h100-80gb-sxm"}
    assert a["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert a["uuid"]["string"].startswith("GPU-")
    assert a["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:15"}
    assert a["resource.kubernetes.io/pciBusID"] == {"string": "0000:18:00.0"}
    assert a["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert a["pciRoot"] == {"string": "0000:15:01.0"}
    assert a["pciSwitch"] == {"string": "0000:17:00.0"}
    assert a["fabricDomain"] == {"string": "nvlink-5b0e112233445566778899aabbccddef-1"}
    assert gpu["capacity"] == {"memory": {"value": "81559Mi"}}
    # no health reading was given: Unknown informs, blocks nothing
    assert gpu["taints"] == [
        {"key": "fabricdra.io/health-unknown", "value": "gpu", "effect": "None"}
    ]
    nic = devs["rdma-0000-19-00-0"]
    n = nic["attributes"]
    assert n["type"] == {"string": "rdma"}
    assert n["rdmaMode"] == {"string": "exclusive"}
    assert n["rdmaDevice"] == {"string": "mlx5_0"}
    assert n["netdev"] == {"string": "enp25s0np0"}
    assert n["linkLayer"] == {"string": "Ethernet"}
    assert n["linkVerdict"] == {"string": "OK"}
    assert n["virtualFunction"] == {"bool": False}
    assert n["pciRoot"] == a["pciRoot"]  # the GPU's own NIC shares its outermost bridge
    assert n["pciSwitch"] != a["pciSwitch"]  # ...on another switch port: PXB, not PIX
    assert "capacity" not in nic
    assert "allowMultipleAllocations" not in nic


def test_devices_sit_in_pci_address_order_so_a_gpu_is_followed_by_its_nic(
    tmp_path: Path,
) -> None:
    # The scheduler tries a request's devices in slice order: in name order every GPU and MIG
    # device came before the first NIC, so the NIC of a "GPU + NIC on one pciRoot" claim was
    # found only after ~10 class evaluations per node examined (bench/scale.py).
    d, _ = _discover(tmp_path, mig_gpu=7)
    (s,) = build_slices(_inventory(d), "n").slices
    devices = s["spec"]["devices"]
    bus = [x["attributes"]["resource.kubernetes.io/pciBusID"]["string"] for x in devices]
    assert bus == sorted(bus)
    root = [x["attributes"].get("pciRoot", {}).get("string") for x in devices]
    kind = [x["attributes"]["type"]["string"] for x in devices]
    gpus_with_a_nic = [
        i
        for i, k in enumerate(kind)
        if k == "gpu" and any(kind[j] == "rdma" and root[j] == root[i] for j in range(len(devices)))
    ]
    assert len(gpus_with_a_nic) >= 4  # the fixture has NICs beside most GPUs
    for i in gpus_with_a_nic:
        assert (kind[i + 1], root[i + 1]) == ("rdma", root[i]), devices[i]["name"]
    # The same devices as in name order: only their places changed.
    assert sorted(x["name"] for x in devices) == [x.name for x in _inventory(d).devices]


def test_every_name_and_value_is_within_the_api_limits(tmp_path: Path) -> None:
    d, _ = _discover(tmp_path, mig_gpu=2, vf_nics=(1,), vfs_per_nic=4)
    for model in ("current", "basic"):
        plan = build_slices(
            _inventory(d, config=DeviceConfig(rdma_mode="shared")),
            "node-a",
            features=ApiFeatures(model),  # type: ignore[arg-type]
        )
        for s in plan.slices:
            assert len(s["spec"].get("devices", [])) <= ApiFeatures(model).devices_per_slice  # type: ignore[arg-type]
            for dev in s["spec"].get("devices", []):
                assert _DNS_LABEL.match(dev["name"])
                entries = {**dev["attributes"], **dev.get("capacity", {})}
                assert len(entries) <= 32
                for key, value in dev["attributes"].items():
                    ident = key.rsplit("/", 1)[-1]
                    assert _C_IDENT.match(ident), key
                    assert len(value) == 1
                    if "string" in value:
                        assert len(value["string"]) <= 64


def test_unknown_facts_are_absent_attributes(tmp_path: Path) -> None:
    d, _ = _discover(tmp_path, numa=False)
    devs = _devices(build_slices(_inventory(d), "n").slices)
    for dev in devs.values():
        assert "resource.kubernetes.io/numaNode" not in dev["attributes"]
    # Off the PCI bus: no PCI attribute at all, never a stand-in.
    iface = Interface(name="ib0", bus="auxiliary", virtual=False, rdma=True, rdmaDevice="mlx5_9")
    (dev,) = _devices(build_slices(build_devices([iface], []), "n").slices).values()
    assert dev["name"] == "rdma-mlx5-9"
    assert set(dev["attributes"]) == {"type", "rdmaMode", "rdmaDevice", "netdev", "virtualFunction"}


def test_match_attribute_guarantees_the_distance_table(tmp_path: Path) -> None:
    """Equal pciSwitch ⇒ PIX, equal pciRoot ⇒ PXB or closer, equal numaNode ⇒ NODE or closer,
    checked over every pair of devices on the node against discovery's distance rules."""
    d, _ = _discover(tmp_path, vf_nics=(0,), vfs_per_nic=2)
    inv = _inventory(d)
    attrs = _devices(build_slices(inv, "n").slices)
    order = ["SELF", "LINK", "PIX", "PXB", "PHB", "NODE", "SYS", "UNK"]
    checked = {"pciSwitch": 0, "pciRoot": 0, "resource.kubernetes.io/numaNode": 0}
    for x in inv.devices:
        for y in inv.devices:
            if x is y:
                continue
            tx, ty = _topology(x), _topology(y)
            ax, ay = attrs[x.name]["attributes"], attrs[y.name]["attributes"]
            nx = ax.get("resource.kubernetes.io/numaNode", {}).get("int")
            ny = ay.get("resource.kubernetes.io/numaNode", {}).get("int")
            dist = order.index(distance(tx, nx, ty, ny))
            for key, worst in (
                ("pciSwitch", "PIX"),
                ("pciRoot", "PXB"),
                ("resource.kubernetes.io/numaNode", "NODE"),
            ):
                if key in ax and ax.get(key) == ay.get(key):
                    checked[key] += 1
                    assert dist <= order.index(worst), (x.name, y.name, key)
    assert all(checked.values()), checked


def test_shared_endpoints_current_model_use_consumable_capacity(tmp_path: Path) -> None:
    d, _ = _discover(tmp_path)
    inv = _inventory(d, config=DeviceConfig(rdma_mode="shared", rdma_shared_holders=16))
    devs = _devices(build_slices(inv, "n").slices)
    nic = devs["rdma-0000-19-00-0"]
    assert nic["allowMultipleAllocations"] is True
    assert nic["attributes"]["rdmaMode"] == {"string": "shared"}
    assert nic["capacity"] == {
        "holders": {
            "value": "16",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "16"}},
        }
    }
    assert len(devs) == 16


def test_shared_endpoints_basic_model_are_holder_devices(tmp_path: Path) -> None:
    d, _ = _discover(tmp_path)
    inv = _inventory(d, config=DeviceConfig(rdma_mode="shared"))
    plan = build_slices(inv, "n", features=ApiFeatures("basic"), generation=1)
    names = published_device_names(plan.slices)
    assert len(names) == 8 + 8 * 64
    assert len(plan.slices) == 5  # 520 devices, 128 per slice
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 5 for s in plan.slices)
    assert [s["metadata"]["name"] for s in plan.slices] == [
        slice_name("n", "devices.fabricdra.io", i) for i in range(5)
    ]
    assert len(set(names)) == len(names)
    assert "rdma-0000-19-00-0-s63" in names
    assert "rdma-0000-19-00-0" not in names
    for n in names:
        assert inv.get(n) is not None  # every published name resolves for prepare
    for dev in _devices(plan.slices).values():
        assert "allowMultipleAllocations" not in dev
        assert "taints" not in dev


def test_failed_link_taints_the_device_with_its_first_seen_time(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path, broken_nics=(3,))
    inv = _inventory(d)
    devs = _devices(build_slices(inv, "n").slices)
    broken = devs[f"rdma-{hgx.nics[3].replace(':', '-').replace('.', '-')}"]
    assert broken["attributes"]["linkVerdict"] == {"string": "Failed"}
    (taint,) = broken["taints"]
    assert taint["key"] == "fabricdra.io/unhealthy"
    assert taint["value"] == "rdma-link-down"
    assert taint["effect"] == "NoSchedule"
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", taint["timeAdded"])
    others = [x for x in devs.values() if x is not broken]
    # the rest carry no taint but, where their health is unknown (GPUs without a reading
    # here), one that only informs
    assert all(t["effect"] == "None" for x in others for t in x.get("taints", []))
    # 1.34/1.35: no taints at all (the API server would drop the field).
    basic = _devices(build_slices(inv, "n", features=ApiFeatures("basic")).slices)
    assert all("taints" not in x for x in basic.values())


def test_taint_time_is_stable_across_passes() -> None:
    since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    iface = Interface(
        name="ens1",
        bus="pci",
        virtual=False,
        pciBusId="0000:05:00.0",
        rdma=True,
        rdmaDevice="mlx5_0",
        link=LinkRecord(verdict="Failed", since=since, reason="down"),
    )
    a = build_slices(build_devices([iface], []), "n").slices
    b = build_slices(build_devices([iface], []), "n").slices
    assert a == b
    assert a[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2026-01-02T03:04:05Z"


def test_mig_instances_carry_their_own_identity(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path, mig_gpu=0)
    devs = _devices(build_slices(_inventory(d), "n").slices)
    migs = {k: v for k, v in devs.items() if v["attributes"]["type"] == {"string": "mig"}}
    assert len(migs) == 2
    for m in migs.values():
        a = m["attributes"]
        assert a["uuid"]["string"].startswith("MIG-")
        assert a["parentUuid"]["string"].startswith("GPU-")
        assert a["productName"] == {"string": "NVIDIA H100 80GB HBM3 MIG 3g.40gb"}
        assert m["capacity"] == {"memory": {"value": "40192Mi"}}
    assert f"gpu-{hgx.gpus[0].replace(':', '-').replace('.', '-')}" not in devs


def test_large_pools_split_within_limits_and_empty_pool_is_one_slice() -> None:
    ifaces = [
        Interface(
            name=f"e{i}",
            bus="pci",
            virtual=False,
            pciBusId=f"0000:{i // 32:02x}:{i % 32:02x}.0",
            rdma=True,
            rdmaDevice=f"mlx5_{i}",
        )
        for i in range(200)
    ]
    plan = build_slices(build_devices(ifaces, []), "n", generation=7)
    assert [len(s["spec"]["devices"]) for s in plan.slices] == [64, 64, 64, 8]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in plan.slices} == {4}
    assert {s["spec"]["pool"]["generation"] for s in plan.slices} == {7}
    basic = build_slices(build_devices(ifaces, []), "n", features=ApiFeatures("basic"))
    assert [len(s["spec"]["devices"]) for s in basic.slices] == [128, 72]
    (empty,) = build_slices(build_devices([], []), "n").slices
    assert "devices" not in empty["spec"]
    assert empty["spec"]["pool"]["resourceSliceCount"] == 1


def test_too_long_string_is_omitted_not_truncated() -> None:
    iface = Interface(
        name="ens1",
        bus="pci",
        virtual=False,
        pciBusId="0000:05:00.0",
        rdma=True,
        rdmaDevice="mlx5_0",
        linkLayer="L" * 65,
    )
    plan = build_slices(build_devices([iface], []), "n")
    assert "linkLayer" not in plan.slices[0]["spec"]["devices"][0]["attributes"]
    assert "longer than 64" in plan.omitted["rdma-0000-05-00-0"]["linkLayer"]


def test_quantities_are_canonical() -> None:
    assert binary_quantity(81559 * 2**20) == "81559Mi"
    assert binary_quantity(80 * 2**30) == "80Gi"
    assert binary_quantity(0) == "0"
    assert binary_quantity(1000) == "1000"


def test_model_from_server_version() -> None:
    assert ApiFeatures.for_server_version("1", "36").model == "current"
    assert ApiFeatures.for_server_version("1", "37+").model == "current"
    assert ApiFeatures.for_server_version("1", "35").model == "basic"
    assert ApiFeatures.for_server_version("1", "34").model == "basic"
    with pytest.raises(ValueError, match="Kubernetes version"):
        ApiFeatures.for_server_version("1", "")


def test_long_node_names_still_give_valid_slice_names() -> None:
    name = slice_name("n" * 250, "devices.fabricdra.io", 3)
    assert len(name) <= 253
    assert name.endswith("-3")
    assert name != slice_name("n" * 249 + "m", "devices.fabricdra.io", 3)


def _fabricdra(*argv: str) -> dict[str, Any]:
    # A subprocess, as a user runs it: the CLI configures process-wide logging.
    out = subprocess.run(
        [sys.executable, "-m", "fabricdra.cli", *argv], check=True, capture_output=True, text=True
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_inventory_command_prints_the_slices_the_plugin_would_publish(tmp_path: Path) -> None:
    from fabricdra.kubeletplugin.health import gpu_health

    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b, broken_nics=(1,))
    snap = h100_snapshot(hgx.gpus)
    snap[hgx.gpus[4]]["eccUncorrectable"] = 2  # an unhealthy GPU: tainted in the slice
    snap_path = write_json(tmp_path / "nvml.json", snap)
    argv = ["inventory", "--sysfs-root", str(b.root), "--nvml-snapshot", str(snap_path)]
    doc = _fabricdra(*argv, "--node-name", "node-x")
    readings = load_snapshot(snap_path)
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    inv = _inventory(d, gpu_health=gpu_health(d.nvml, None), gpu_info=gpu_info(d.nvml))
    # Two discoveries, two clocks: a taint's timeAdded (first seen now) may differ by a second.
    assert _without_taint_times(doc["resourceSlices"]) == _without_taint_times(
        build_slices(inv, "node-x").slices
    )
    tainted = [x["name"] for x in _devices(doc["resourceSlices"]).values() if "taints" in x]
    assert sorted(tainted) == sorted(
        [
            "gpu-" + hgx.gpus[4].replace(":", "-").replace(".", "-"),
            "rdma-" + hgx.nics[1].replace(":", "-").replace(".", "-"),
        ]
    )
    assert "resourceSlices" not in _fabricdra(*argv)


def _without_taint_times(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(slices)
    for s in out:
        for device in s["spec"]["devices"]:
            for taint in device.get("taints", []):
                taint.pop("timeAdded", None)
    return out


def test_the_verification_gate_taints_every_device_or_sets_verified(tmp_path: Path) -> None:
    d, hgx = _discover(tmp_path, broken_nics=(3,))
    inv = _inventory(d)
    ungated = _devices(build_slices(inv, "n").slices)
    for gate in ("unverified", "failed"):
        devs = _devices(build_slices(inv, "n", gate=gate).slices)
        assert devs.keys() == ungated.keys()
        for name, dev in devs.items():
            gating = [t for t in dev["taints"] if t["key"] == "fabricdra.io/unverified"]
            assert gating == [
                {"key": "fabricdra.io/unverified", "value": gate, "effect": "NoSchedule"}
            ]
            # The health taint stays next to it; nothing else about the device changes.
            assert [t for t in dev["taints"] if t not in gating] == ungated[name].get("taints", [])
            assert dev["attributes"] == ungated[name]["attributes"]
    assert _devices(build_slices(inv, "n", gate="verified").slices) == ungated
    # 1.34/1.35: no taints; a `verified` attribute the DeviceClasses require where present.
    basic = ApiFeatures("basic")
    closed = _devices(build_slices(inv, "n", features=basic, gate="unverified").slices)
    opened = _devices(build_slices(inv, "n", features=basic, gate="verified").slices)
    assert {x["attributes"]["verified"]["bool"] for x in closed.values()} == {False}
    assert {x["attributes"]["verified"]["bool"] for x in opened.values()} == {True}
    assert all("taints" not in x for x in closed.values())
    assert hgx.gpus


# -- issue 32 point 2: NUMA as a list (KEP-5491, DRAListTypeAttributes) ---------------------

NUMA = "resource.kubernetes.io/numaNode"


def _bus_name(prefix: str, bus: str) -> str:
    return prefix + bus.replace(":", "-").replace(".", "-")


def test_a_gpu_whose_memory_is_numa_nodes_publishes_them_where_lists_are_on(
    tmp_path: Path,
) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    snap = h100_snapshot(hgx.gpus)
    # Grace: the GPU's HBM is onlined as CPU-less NUMA nodes beside its CPU's node.
    snap[hgx.gpus[0]]["memoryNumaNodes"] = [5, 4]
    readings = load_snapshot(write_json(tmp_path / "nvml.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    inv = _inventory(d, gpu_info=gpu_info(d.nvml))
    gpu0, gpu1 = _bus_name("gpu-", hgx.gpus[0]), _bus_name("gpu-", hgx.gpus[1])
    nic0 = _bus_name("rdma-", hgx.nics[0])

    off = build_slices(inv, "n")
    on = build_slices(inv, "n", features=ApiFeatures(list_attributes=True))
    cpu = _devices(off.slices)[gpu0]["attributes"][NUMA]
    assert cpu == {"int": 0}  # lists off: the CPU's node, as the kernel names it for the GPU
    assert _devices(on.slices)[gpu0]["attributes"][NUMA] == {"ints": [0, 4, 5]}
    # one node only: a scalar either way; NICs unchanged
    for name in (gpu1, nic0):
        assert (
            _devices(on.slices)[name]["attributes"][NUMA]
            == (_devices(off.slices)[name]["attributes"][NUMA])
        )
        assert "int" in _devices(on.slices)[name]["attributes"][NUMA]
    assert on.omitted == off.omitted == {}


def test_a_gpu_with_only_memory_numa_nodes_publishes_no_scalar_it_cannot_know(
    tmp_path: Path,
) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b, numa=False)
    snap = h100_snapshot(hgx.gpus)
    snap[hgx.gpus[0]]["memoryNumaNodes"] = [4, 5]
    readings = load_snapshot(write_json(tmp_path / "nvml.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    inv = _inventory(d, gpu_info=gpu_info(d.nvml))
    gpu0 = _bus_name("gpu-", hgx.gpus[0])
    off = build_slices(inv, "n")
    assert NUMA not in _devices(off.slices)[gpu0]["attributes"]
    assert "lists are off" in off.omitted[gpu0][NUMA]
    on = build_slices(inv, "n", features=ApiFeatures(list_attributes=True))
    assert _devices(on.slices)[gpu0]["attributes"][NUMA] == {"ints": [4, 5]}


def _topology(device: Device) -> PciTopology:
    """The PCI placement of an RDMA endpoint or a GPU."""
    if device.type == "rdma":
        return rdma.payload_of(device).endpoint.topology
    return accelerator.payload_of(device).accelerator.topology
