"""The five node labels and every publish/withhold rule (docs/labels.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fabricdra.api import labels as keys
from fabricdra.api.inventory import (
    Accelerator,
    AcceleratorTopology,
    Fabric,
    Interface,
    LinkRecord,
    PciTopology,
    VirtualFunction,
)
from fabricdra.kubeletplugin.discovery.labels import (
    NodeLabels,
    compute_labels,
    is_valid_label_value,
)
from tests.sysfs.builder import ACTIVE_DEFER, DOWN, UNREADABLE_HOW, UP, SysfsBuilder
from tests.sysfs.nodes import (
    MI300X_HIVE,
    amd_mi300x,
    aux_rdma_node,
    cpu_node,
    discover_at,
    h100_snapshot,
    hgx_h100,
    nvml_fabric,
    rdma_node,
)

CLUSTER = "5b0e112233445566778899aabbccddef"
KFD = "devices/virtual/kfd/kfd/topology/nodes"
NIC0_PORTS = "devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:30:00.0/infiniband"


def labels_of(root: Path, snapshot: dict[str, Any] | None = None) -> NodeLabels:
    return discover_at(root, snapshot).labels


@pytest.fixture
def b(tmp_path: Path) -> SysfsBuilder:
    return SysfsBuilder(tmp_path / "sys")


# -- rdma.capable --------------------------------------------------------------------------


def test_hgx_node_publishes_all_three_rdma_labels(b: SysfsBuilder) -> None:
    hgx_h100(b)
    assert labels_of(b.root).desired == {
        keys.RDMA_CAPABLE: "true",
        keys.RDMA_DISTANCE: "PXB",
        keys.RDMA_NUMA: "0_1",
    }


def test_a_broken_nic_beside_a_working_one_keeps_the_label(b: SysfsBuilder) -> None:
    hgx_h100(b, broken_nics=(0, 1, 2, 3, 4, 5, 6))
    desired = labels_of(b.root).desired
    assert desired[keys.RDMA_CAPABLE] == "true"
    assert desired[keys.RDMA_NUMA] == "1"  # only the working NIC (socket 1) is counted


def test_every_nic_broken_withholds_the_rdma_labels(b: SysfsBuilder) -> None:
    hgx_h100(b, broken_nics=tuple(range(8)))
    desired = labels_of(b.root).desired
    for key in (keys.RDMA_CAPABLE, keys.RDMA_NUMA, keys.RDMA_DISTANCE):
        assert key not in desired


def test_only_active_defer_ports_withhold_the_label(b: SysfsBuilder) -> None:
    rdma_node(b, [[ACTIVE_DEFER], [ACTIVE_DEFER, ACTIVE_DEFER]])
    assert keys.RDMA_CAPABLE not in labels_of(b.root).desired


def test_vf_only_rdma_counts(b: SysfsBuilder) -> None:
    """A VF is nested under its PF, so a node whose only RDMA devices are VFs would otherwise
    report none."""
    hgx_h100(b, vf_nics=(5,), pf_rdma=False)
    d = discover_at(b.root)
    assert d.interfaces is not None
    assert not any(i.rdma for i in d.interfaces)  # no top-level interface carries RDMA
    assert d.labels.desired == {
        keys.RDMA_CAPABLE: "true",
        keys.RDMA_DISTANCE: "PXB",
        keys.RDMA_NUMA: "1",
    }


@pytest.mark.parametrize("how", UNREADABLE_HOW)
def test_an_unreadable_port_beside_down_ones_keeps_the_label(b: SysfsBuilder, how: str) -> None:
    rdma_node(b, [[DOWN, DOWN, DOWN]])
    b.make_unreadable(f"{NIC0_PORTS}/mlx5_0/ports/2/state", how)
    assert labels_of(b.root).desired[keys.RDMA_CAPABLE] == "true"


def test_an_unreadable_rdma_tree_keeps_the_label(b: SysfsBuilder) -> None:
    rdma_node(b, [[DOWN]])
    b.escape("class/infiniband")
    assert labels_of(b.root).desired[keys.RDMA_CAPABLE] == "true"


def test_no_rdma_at_all_has_no_rdma_labels(b: SysfsBuilder) -> None:
    rdma_node(b, [None, None])
    desired = labels_of(b.root).desired
    assert not any(k.startswith(keys.PREFIX + "rdma.") for k in desired)


def test_an_explicit_verdict_wins_over_the_rdma_flag() -> None:
    bound_but_failed = _iface("a", rdma=True, link=LinkRecord(verdict="Failed"))
    unbound_but_unverified = _iface("b", rdma=False, link=LinkRecord(verdict="Unverified"))
    bound_no_verdict = _iface("c", rdma=True, link=None)
    assert keys.RDMA_CAPABLE not in compute_labels([bound_but_failed], []).desired
    assert compute_labels([unbound_but_unverified], []).desired[keys.RDMA_CAPABLE] == "true"
    assert compute_labels([bound_no_verdict], []).desired[keys.RDMA_CAPABLE] == "true"
    assert keys.RDMA_CAPABLE not in compute_labels([_iface("d")], []).desired


# -- rdma.distance -------------------------------------------------------------------------


def test_no_accelerator_no_distance(b: SysfsBuilder) -> None:
    cpu_node(b)
    desired = labels_of(b.root).desired
    assert keys.RDMA_DISTANCE not in desired  # absent, not UNK
    assert desired[keys.RDMA_CAPABLE] == "true"
    assert desired[keys.RDMA_NUMA] == "0_1"


def test_distance_is_the_closest_pair_over_usable_endpoints(b: SysfsBuilder) -> None:
    hgx_h100(b, broken_nics=tuple(range(7)))  # only NIC 7 works: GPU 7 is its PXB neighbour
    assert labels_of(b.root).desired[keys.RDMA_DISTANCE] == "PXB"


def test_a_broken_close_nic_does_not_count_for_distance(b: SysfsBuilder) -> None:
    """The GPU's own NIC (PXB) is down; the usable one is on another host bridge."""
    rdma_node(b, [[DOWN]])
    assert keys.RDMA_DISTANCE not in labels_of(b.root).desired  # no usable endpoint: no pair
    far = b.nic(b.bridge(b.root_bus("pci0000:80"), "0000:80:01.0", 0), "0000:81:00.0", "far0")
    b.rdma(far, "mlx5_far")
    assert labels_of(b.root).desired[keys.RDMA_DISTANCE] == "NODE"


def test_distance_to_an_endpoint_off_the_pci_bus_is_unk(b: SysfsBuilder) -> None:
    aux_rdma_node(b)
    assert labels_of(b.root).desired[keys.RDMA_DISTANCE] == "UNK"


def test_a_nic_sharing_the_innermost_bridge_is_pix(b: SysfsBuilder) -> None:
    rp = b.bridge(b.root_bus("pci0000:15"), "0000:15:01.0", 0)
    (port,) = b.switch(rp, "0000:16:00.0", ["0000:17:00.0"], 0)
    b.gpu(port, "0000:18:00.0")
    b.rdma(b.nic(port, "0000:18:00.1", "ens1np0"), "mlx5_0")
    assert labels_of(b.root).desired[keys.RDMA_DISTANCE] == "PIX"


def test_distance_phb_on_one_root_complex(b: SysfsBuilder) -> None:
    rb = b.root_bus("pci0000:15")
    b.gpu(b.bridge(rb, "0000:15:01.0", 0), "0000:16:00.0")
    b.rdma(b.nic(b.bridge(rb, "0000:15:02.0", 0), "0000:17:00.0", "ens1np0"), "mlx5_0")
    assert labels_of(b.root).desired[keys.RDMA_DISTANCE] == "PHB"


# -- rdma.numa -----------------------------------------------------------------------------


def test_numa_minus_one_everywhere_withholds_rdma_numa(b: SysfsBuilder) -> None:
    hgx_h100(b, numa=False)
    desired = labels_of(b.root).desired
    assert keys.RDMA_NUMA not in desired  # never "0" for a node nobody named
    assert desired[keys.RDMA_CAPABLE] == "true"
    assert desired[keys.RDMA_DISTANCE] == "PXB"  # the bus still answers


def test_numa_set_is_joined_with_underscore_and_sorted(b: SysfsBuilder) -> None:
    rdma_node(b, [[UP], [UP], [UP], [UP]], rdma_numa=[3, 1, None, 1])
    value = labels_of(b.root).desired[keys.RDMA_NUMA]
    assert value == "1_3"
    assert is_valid_label_value(value)


def test_numa_of_failed_endpoints_is_not_published(b: SysfsBuilder) -> None:
    rdma_node(b, [[UP], [DOWN]], rdma_numa=[0, 1])
    assert labels_of(b.root).desired[keys.RDMA_NUMA] == "0"


def test_a_vf_with_a_blank_numa_uses_its_parents() -> None:
    vf = VirtualFunction(name="v0", index=0, rdma=True, numaNode=None)
    pf = _iface("pf", numa=1, rdma=True, link=LinkRecord(verdict="Failed"), vfs=[vf])
    assert compute_labels([pf], []).desired[keys.RDMA_NUMA] == "1"


# -- fabric.domain / fabric.members --------------------------------------------------------


def test_nvlink_domain_when_every_gpu_agrees(b: SysfsBuilder) -> None:
    hgx = hgx_h100(b)
    desired = labels_of(b.root, h100_snapshot(hgx.gpus, fabric=nvml_fabric("completed"))).desired
    assert desired[keys.FABRIC_DOMAIN] == f"nvlink-{CLUSTER}-1"
    assert keys.FABRIC_MEMBERS not in desired  # NVML names no domain size


@pytest.mark.parametrize(
    "odd",
    [
        nvml_fabric("completed", clique=2),  # same cluster, another clique: no co-location
        nvml_fabric("completed", cluster="11" * 16),
        nvml_fabric("in_progress"),  # one GPU not (yet) in the fabric
    ],
)
def test_no_domain_when_gpus_disagree(b: SysfsBuilder, odd: dict[str, Any]) -> None:
    hgx = hgx_h100(b)
    snap = h100_snapshot(hgx.gpus, fabric=nvml_fabric("completed"))
    snap[hgx.gpus[3]]["fabric"] = odd
    labels = labels_of(b.root, snap)
    assert keys.FABRIC_DOMAIN not in labels.desired
    assert keys.FABRIC_DOMAIN not in labels.unknown  # a reading, so a writer removes it


@pytest.mark.parametrize("state", ["in_progress", "not_started", "not_supported"])
def test_no_domain_before_registration_completes(b: SysfsBuilder, state: str) -> None:
    hgx = hgx_h100(b)
    labels = labels_of(b.root, h100_snapshot(hgx.gpus, fabric=nvml_fabric(state)))
    assert keys.FABRIC_DOMAIN not in labels.desired
    assert keys.FABRIC_DOMAIN not in labels.unknown


def test_xgmi_domain_and_members(b: SysfsBuilder) -> None:
    amd_mi300x(b)
    desired = labels_of(b.root).desired
    assert desired[keys.FABRIC_DOMAIN] == f"xgmi-{MI300X_HIVE:x}"
    assert desired[keys.FABRIC_MEMBERS] == "8"


def test_members_need_every_gpu_to_agree(b: SysfsBuilder) -> None:
    amd_mi300x(b)
    (b.root / f"{KFD}/9/io_links/0").rename(b.root / f"{KFD}/9/io_links/gone")
    b.write(f"{KFD}/9/io_links/gone/properties", "type 2\nnode_from 9\nnode_to 0\n")  # PCIe
    desired = labels_of(b.root).desired
    assert desired[keys.FABRIC_DOMAIN] == f"xgmi-{MI300X_HIVE:x}"
    assert keys.FABRIC_MEMBERS not in desired  # seven say 8, one says 7: no agreed size


def test_members_unknown_when_xgmi_links_are_unreadable(b: SysfsBuilder) -> None:
    amd_mi300x(b)
    b.escape(f"{KFD}/4/io_links")
    labels = labels_of(b.root)
    assert labels.desired[keys.FABRIC_DOMAIN] == f"xgmi-{MI300X_HIVE:x}"
    assert keys.FABRIC_MEMBERS not in labels.desired
    assert keys.FABRIC_MEMBERS in labels.unknown  # left as published, not removed


def test_a_zero_count_is_never_published() -> None:
    fabric = Fabric(kind="xgmi", id="1f", memberCount=0, domain="xgmi-1f")
    labels = compute_labels([], [_acc("0000:18:00.0", fabric), _acc("0000:3a:00.0", fabric)])
    assert labels.desired == {keys.FABRIC_DOMAIN: "xgmi-1f"}


def test_no_accelerator_no_fabric_labels(b: SysfsBuilder) -> None:
    cpu_node(b)
    labels = labels_of(b.root)
    assert not any(k.startswith(keys.PREFIX + "fabric.") for k in labels.desired)
    assert not labels.unknown


# -- unknown: inputs that could not be read are left as published ---------------------------


def test_nvml_unavailable_leaves_fabric_labels_as_published(b: SysfsBuilder) -> None:
    hgx_h100(b)
    labels = labels_of(b.root)  # NVIDIA GPUs, nobody to ask
    assert {keys.FABRIC_DOMAIN, keys.FABRIC_MEMBERS} <= labels.unknown
    assert keys.FABRIC_DOMAIN not in labels.desired


def test_one_gpu_nvml_did_not_answer_for_leaves_fabric_labels(b: SysfsBuilder) -> None:
    hgx = hgx_h100(b)
    snap = h100_snapshot(hgx.gpus[1:], fabric=nvml_fabric("completed"))
    assert keys.FABRIC_DOMAIN in labels_of(b.root, snap).unknown


@pytest.mark.parametrize("broken", ["class/kfd", f"{KFD}/5/properties"])
def test_kfd_unreadable_leaves_fabric_labels(b: SysfsBuilder, broken: str) -> None:
    amd_mi300x(b)
    b.escape(broken)
    labels = labels_of(b.root)
    assert {keys.FABRIC_DOMAIN, keys.FABRIC_MEMBERS} <= labels.unknown
    assert not any(k.startswith(keys.PREFIX + "fabric.") for k in labels.desired)


def test_failed_interface_enumeration_leaves_rdma_labels(b: SysfsBuilder) -> None:
    hgx_h100(b)
    b.escape("class/net")
    labels = labels_of(b.root)
    assert {keys.RDMA_CAPABLE, keys.RDMA_DISTANCE, keys.RDMA_NUMA} <= labels.unknown
    assert not any(k.startswith(keys.PREFIX + "rdma.") for k in labels.desired)


def test_failed_pci_enumeration_leaves_distance_and_fabric(b: SysfsBuilder) -> None:
    hgx_h100(b)
    b.escape("bus/pci/devices")
    labels = labels_of(b.root)
    assert labels.unknown == {keys.RDMA_DISTANCE, keys.FABRIC_DOMAIN, keys.FABRIC_MEMBERS}
    assert labels.desired[keys.RDMA_CAPABLE] == "true"


# -- the set as a whole --------------------------------------------------------------------


def test_the_desired_set_is_the_whole_truth_under_our_prefix(b: SysfsBuilder) -> None:
    hgx = hgx_h100(b)
    labels = labels_of(b.root, h100_snapshot(hgx.gpus, fabric=nvml_fabric("completed")))
    assert set(labels.desired) <= set(keys.ALL)
    assert all(k.startswith(keys.PREFIX) for k in labels.desired)
    assert all(is_valid_label_value(v) for v in labels.desired.values())
    assert labels.unknown == frozenset()


def test_an_invalid_value_is_withheld_never_sanitised() -> None:
    long = Fabric(kind="xgmi", id="a" * 70, domain="xgmi-" + "a" * 70)
    labels = compute_labels([], [_acc("0000:18:00.0", long)])
    assert keys.FABRIC_DOMAIN not in labels.desired
    assert labels.rejected == {keys.FABRIC_DOMAIN: "xgmi-" + "a" * 70}


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("true", True),
        ("0_1", True),
        ("0,1", False),
        ("PXB", True),
        (f"nvlink-{CLUSTER}-4294967295", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("-x", False),
        ("x-", False),
        ("", True),
    ],
)
def test_label_value_validation(value: str, valid: bool) -> None:
    assert is_valid_label_value(value) is valid


# -- helpers -------------------------------------------------------------------------------


def _iface(
    name: str,
    *,
    rdma: bool = False,
    link: LinkRecord | None = None,
    numa: int | None = 0,
    vfs: list[VirtualFunction] | None = None,
) -> Interface:
    return Interface(
        name=name,
        bus="pci",
        virtual=False,
        rdma=rdma,
        link=link,
        numaNode=numa,
        topology=PciTopology(pciRootId="0000:15:01.0", pcieRoot="pci0000:15"),
        virtualFunctions=vfs or [],
    )


def _acc(bus_id: str, fabric: Fabric | None) -> Accelerator:
    return Accelerator(
        vendor="amd",
        vendorId="0x1002",
        pciBusId=bus_id,
        topology=AcceleratorTopology(fabric=fabric),
    )


@pytest.mark.parametrize("how", ["directory", "escaping-link", "oversize"])
def test_an_unreadable_pci_function_leaves_distance_and_fabric(b: SysfsBuilder, how: str) -> None:
    """It may be an accelerator: "every accelerator agrees" and "the closest pair" are then
    unknown, while the accelerators that were read are still recorded."""
    hgx = hgx_h100(b)
    gpu = (b.root / f"bus/pci/devices/{hgx.gpus[5]}").resolve().relative_to(b.root.resolve())
    b.make_unreadable(f"{gpu}/class", how)
    d = discover_at(b.root, h100_snapshot(hgx.gpus, fabric=nvml_fabric("completed")))
    assert d.accelerators is not None
    assert len(d.accelerators) == 7
    assert d.failures == {}
    assert d.labels.unknown == {keys.RDMA_DISTANCE, keys.FABRIC_DOMAIN, keys.FABRIC_MEMBERS}
    assert d.labels.desired[keys.RDMA_CAPABLE] == "true"
