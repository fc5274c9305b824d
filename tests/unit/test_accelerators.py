"""Accelerators: found by PCI vendor and class, NVIDIA details from NVML (a recorded snapshot
here), the NVLink fabric record in every NVML registration state, AMD XGMI hives from KFD."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.inventory import Accelerator, Fabric
from fabricdra.kubeletplugin.discovery.accelerators import canonical_cluster_uuid
from fabricdra.kubeletplugin.discovery.nvml import (
    SnapshotError,
    dump_snapshot,
    load_snapshot,
    normalise_bus_id,
)
from tests.sysfs.builder import CLASS_ACCEL, SysfsBuilder
from tests.sysfs.nodes import (
    MI300X_HIVE,
    amd_mi300x,
    discover_at,
    h100_snapshot,
    hgx_h100,
    nvml_fabric,
    write_json,
)

CLUSTER = "5b0e112233445566778899aabbccddef"


def accelerators(root: Path, snapshot: dict[str, Any] | None = None) -> list[Accelerator]:
    found = discover_at(root, snapshot).accelerators
    assert found is not None
    return found


@pytest.fixture
def hgx(tmp_path: Path) -> tuple[Path, list[str]]:
    h = hgx_h100(SysfsBuilder(tmp_path / "sys"))
    return tmp_path / "sys", h.gpus


def test_nvidia_details_from_nvml(hgx: tuple[Path, list[str]]) -> None:
    root, gpus = hgx
    accs = accelerators(root, h100_snapshot(gpus, mig_gpu=7))
    assert [a.pciBusId for a in accs] == sorted(gpus)
    a = accs[0]
    assert (a.vendor, a.vendorId, a.deviceId) == ("nvidia", "0x10de", "0x2330")
    assert a.productName == "NVIDIA H100 80GB HBM3"
    assert a.deviceClass == "h100-80gb-sxm"
    assert a.uuid is not None
    assert a.uuid.startswith("GPU-")
    assert a.memoryMiB == 81559
    assert a.migMode is False
    assert a.migDevices == []
    assert a.numaNode == 0
    assert a.driver == "nvidia"
    mig = next(x for x in accs if x.pciBusId == gpus[7])
    assert mig.migMode is True
    assert [(m.gpuInstanceId, m.profile, m.deviceClass) for m in mig.migDevices] == [
        (1, "3g.40gb", "h100-mig-3g-40gb"),
        (2, "3g.40gb", "h100-mig-3g-40gb"),
    ]


def test_without_nvml_the_pci_id_classifies(hgx: tuple[Path, list[str]]) -> None:
    root, _ = hgx
    a = accelerators(root)[0]
    assert a.deviceClass == "h100-80gb-sxm"
    assert a.productName == "NVIDIA H100 80GB SXM"  # the class label, not an NVML answer
    assert a.uuid is None
    assert a.memoryMiB is None
    assert a.migMode is None
    assert a.topology.fabric is None
    assert a.fabricRegistration is None


def test_a_gpu_nvml_did_not_answer_for_gets_no_invented_details(
    hgx: tuple[Path, list[str]],
) -> None:
    root, gpus = hgx
    accs = accelerators(root, h100_snapshot(gpus[1:]))
    assert accs[0].uuid is None
    assert accs[1].uuid is not None


# -- the NVLink fabric record: one test per NVML state -------------------------------------


@pytest.mark.parametrize(
    ("fabric", "domain"),
    [
        (nvml_fabric("completed"), f"nvlink-{CLUSTER}-1"),
        (nvml_fabric("completed", clique=7), f"nvlink-{CLUSTER}-7"),
        (nvml_fabric("completed", clique=None), f"nvlink-{CLUSTER}"),  # no clique: two parts
        (nvml_fabric("completed", cluster=CLUSTER.upper()), f"nvlink-{CLUSTER}-1"),
        (nvml_fabric("completed", status="nvml_success"), f"nvlink-{CLUSTER}-1"),
        # Not registered (yet), or registered with an error, or no cluster: no record.
        (nvml_fabric("in_progress"), None),
        (nvml_fabric("not_started"), None),
        (nvml_fabric("not_supported", cluster="0" * 32, clique=0), None),
        (nvml_fabric("not_supported"), None),
        (nvml_fabric("completed", status="not_ready"), None),
        (nvml_fabric("completed", status="unknown_error"), None),
        (nvml_fabric("completed", cluster="00000000-0000-0000-0000-000000000000"), None),
        (nvml_fabric("completed", cluster="not-a-uuid"), None),
    ],
)
def test_fabric_record_in_each_nvml_state(
    hgx: tuple[Path, list[str]], fabric: dict[str, Any], domain: str | None
) -> None:
    root, gpus = hgx
    accs = accelerators(root, h100_snapshot(gpus, fabric=fabric))
    for a in accs:
        # The raw registration reading is kept whatever it says.
        assert a.fabricRegistration is not None
        assert a.fabricRegistration.state == fabric["state"]
        assert a.fabricRegistration.status == fabric["status"]
        if domain is None:
            assert a.topology.fabric is None
        else:
            assert a.topology.fabric == Fabric(
                kind="nvlink",
                id=CLUSTER,
                cliqueId=fabric["cliqueId"],
                memberCount=None,
                domain=domain,
            )


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("5B0E1122-3344-5566-7788-99AABBCCDDEF", CLUSTER),
        (CLUSTER, CLUSTER),
        ("0x" + CLUSTER, CLUSTER),
        ("5b0e", None),
        (None, None),
        ("zz" * 16, None),
    ],
)
def test_canonical_cluster_uuid(raw: str | None, canonical: str | None) -> None:
    assert canonical_cluster_uuid(raw) == canonical


# -- which PCI functions are accelerators --------------------------------------------------


def test_found_by_vendor_and_class(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rb = b.root_bus()
    b.pci(rb, "0000:00:02.0", vendor="0x1a03", pci_class=0x030000)  # a BMC's VGA: not one
    b.pci(rb, "0000:00:03.0", vendor="0x1da3", pci_class=CLASS_ACCEL)  # Habana Gaudi
    b.pci(rb, "0000:00:04.0", vendor="0x1234", pci_class=CLASS_ACCEL)  # unknown vendor
    b.pci(rb, "0000:00:05.0", vendor="0x10de", pci_class=0x030200)  # NVIDIA 3D controller
    b.pci(rb, "0000:00:06.0", vendor="0x10de", pci_class=0x040300)  # NVIDIA HDMI audio: not
    b.pci(rb, "0000:00:07.0", vendor="0x1002", pci_class=0x038000)  # AMD display controller
    accs = accelerators(b.root)
    assert [(a.pciBusId, a.vendor) for a in accs] == [
        ("0000:00:03.0", "habana"),
        ("0000:00:04.0", "pci-1234"),
        ("0000:00:05.0", "nvidia"),
        ("0000:00:07.0", "amd"),
    ]


def test_a_gpu_vf_is_not_another_accelerator(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    rp = b.bridge(b.root_bus("pci0000:15"), "0000:15:01.0", 0)
    gpu = b.gpu(rp, "0000:16:00.0")
    vf = b.gpu(rp, "0000:16:00.4")
    b.link(f"{vf}/physfn", gpu)
    assert [a.pciBusId for a in accelerators(b.root)] == ["0000:16:00.0"]


def test_no_accelerator_is_an_empty_list(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    b.nic(b.root_bus(), "0000:00:03.0", "eth0")
    d = discover_at(b.root)
    assert d.accelerators == []
    assert "accelerators" not in d.failures


# -- AMD XGMI ------------------------------------------------------------------------------


def test_amd_hive_from_kfd(tmp_path: Path) -> None:
    amd_mi300x(SysfsBuilder(tmp_path / "sys"))
    accs = accelerators(tmp_path / "sys")
    assert len(accs) == 8
    hive = format(MI300X_HIVE, "x")
    for a in accs:
        assert a.vendor == "amd"
        assert a.deviceClass == "mi300x-192gb-oam"
        assert a.topology.fabric == Fabric(
            kind="xgmi", id=hive, memberCount=8, domain=f"xgmi-{hive}"
        )


def test_amd_in_no_hive_has_no_fabric(tmp_path: Path) -> None:
    amd_mi300x(SysfsBuilder(tmp_path / "sys"), hive_id=0)
    assert all(a.topology.fabric is None for a in accelerators(tmp_path / "sys"))


KFD = "devices/virtual/kfd/kfd/topology/nodes"


@pytest.mark.parametrize("broken", ["io_links", "io_links/3/properties"])
def test_unreadable_xgmi_links_make_the_count_unknown(tmp_path: Path, broken: str) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    amd = amd_mi300x(b)
    b.escape(f"{KFD}/2/{broken}")
    accs = {a.pciBusId: a for a in accelerators(b.root)}
    first = accs[amd.gpus[0]].topology.fabric
    assert first is not None
    assert first.memberCount is None  # unknown, never the number that happened to be readable
    assert first.domain == f"xgmi-{MI300X_HIVE:x}"
    other = accs[amd.gpus[1]].topology.fabric
    assert other is not None
    assert other.memberCount == 8


# -- the NVML snapshot format --------------------------------------------------------------


def test_snapshot_bus_ids_are_normalised(tmp_path: Path) -> None:
    snap = h100_snapshot(["00000000:1B:00.0"])
    readings = load_snapshot(write_json(tmp_path / "s.json", snap))
    assert list(readings.gpus) == ["0000:1b:00.0"]
    assert normalise_bus_id("00000000:1B:00.0") == "0000:1b:00.0"


def test_snapshot_round_trips(tmp_path: Path) -> None:
    snap = h100_snapshot(["0000:18:00.0", "0000:3a:00.0"], fabric=nvml_fabric("completed"))
    first = load_snapshot(write_json(tmp_path / "a.json", snap))
    (tmp_path / "b.json").write_text(dump_snapshot(first))
    assert load_snapshot(tmp_path / "b.json").gpus == first.gpus


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected an object"),
        (json.dumps({"0000:18:00.0": {"uuid": "GPU-1"}}), "entry '0000:18:00.0' field name"),
        (
            json.dumps({"0000:18:00.0": {**h100_snapshot(["x"])["x"], "fabric": {"state": "up"}}}),
            "fabric",
        ),
    ],
)
def test_a_bad_snapshot_names_the_file_and_the_problem(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "snap.json"
    path.write_text(content)
    with pytest.raises(SnapshotError) as e:
        load_snapshot(path)
    assert str(path) in str(e.value)
    assert message in str(e.value)
