"""Scale-out facts on the node (issue 27 points 1-3): InfiniBand port facts from kernel-shaped
sysfs, the IB neighbour from recorded `smpquery` output, LLDPDUs parsed from raw bytes laid out
as IEEE 802.1AB specifies, lldpd's json0, rail and role from PCI distance, the declared topology
file and its disagreements, and the attributes each RDMA device publishes.

A rail-optimised DGX H100 (8 compute HCAs beside 8 GPUs, 4 storage NICs on root ports of their
own: tests/sysfs/nodes.py dgx_h100) and a RoCE HGX node (hgx_h100) are the trees."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api.inventory import Interface, Neighbour
from fabricdra.api.scaleout import parse_topology_file
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.discovery.node import Discovery
from fabricdra.kubeletplugin.discovery.scaleout import ibport, lldp, lldpd, smp
from fabricdra.kubeletplugin.discovery.scaleout.annotate import (
    RoleOverride,
    ScaleOutInputs,
    parse_role_override,
)
from fabricdra.kubeletplugin.discovery.scaleout.rails import place
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.resourceslices import build_slices
from fabricdra.kubeletplugin.scaleoutsources import NeighbourSources, ScaleOutConfig
from tests.sysfs.builder import Port, SysfsBuilder
from tests.sysfs.nodes import dgx_h100, h100_snapshot, hgx_h100, rdma_node, write_json
from tests.sysfs.sample_node import lldpcli_json0

RECORDED = Path(__file__).parent.parent / "recorded"


def _recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def _discover(root: Path, gpus: list[str], inputs: ScaleOutInputs | None = None) -> Discovery:
    from fabricdra.kubeletplugin.discovery.node import discover
    from fabricdra.kubeletplugin.discovery.nvml import load_snapshot

    readings = load_snapshot(write_json(root.parent / "nvml.json", h100_snapshot(gpus)))
    tree = SysfsTree(str(root))
    try:
        return discover(tree, nvml_source=lambda: readings, scaleout=inputs)
    finally:
        tree.close()


def _by_rdma(d: Discovery) -> dict[str, Interface]:
    assert d.interfaces is not None
    return {i.rdmaDevice: i for i in d.interfaces if i.rdmaDevice}


def _attributes(d: Discovery) -> dict[str, dict[str, Any]]:
    """RDMA device name (mlx5_N) -> the attributes its ResourceSlice device carries."""
    assert d.interfaces is not None
    assert d.accelerators is not None
    plan = build_slices(build_devices(d.interfaces, d.accelerators), "node-a")
    out: dict[str, dict[str, Any]] = {}
    for s in plan.slices:
        for dev in s["spec"].get("devices", []):
            attrs = dev.get("attributes", {})
            if "rdmaDevice" in attrs:
                out[attrs["rdmaDevice"]["string"]] = {
                    k: next(iter(v.values())) for k, v in attrs.items()
                }
    return out


# --- InfiniBand port facts (sysfs) -----------------------------------------------------------


def test_ib_port_facts_come_from_the_gid_table_and_lid_files(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = dgx_h100(b, ib_identity=True)
    so = _by_rdma(_discover(b.root, hgx.gpus))["mlx5_2"].scaleOut
    assert so is not None
    assert so.subnetPrefix == "0xfe80000000000000"
    assert so.portGuid == "0x0c42a10300024a02"
    assert (so.lid, so.smLid, so.rateGbps) == (0x102, 1, 400.0)
    assert so.error is None


def test_gid_and_rate_parsers_refuse_what_the_kernel_does_not_print() -> None:
    assert ibport.parse_gid("fe80:0000:0000:0000:0c42:a103:0012:3456\n") == (
        "0xfe80000000000000",
        "0x0c42a10300123456",
    )
    with pytest.raises(ValueError, match="%pI6"):
        ibport.parse_gid("fe80::c42:a103:12:3456")  # compressed: not how sysfs prints it
    assert ibport.parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    with pytest.raises(ValueError, match="not a port rate"):
        ibport.parse_rate("fast")


def test_an_unparsable_gid_is_an_error_not_an_absent_guid(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = dgx_h100(b, ib_identity=True)
    b.write("class/infiniband/mlx5_0/ports/1/gids/0", "garbage")
    so = _by_rdma(_discover(b.root, hgx.gpus))["mlx5_0"].scaleOut
    assert so is not None
    assert so.portGuid is None
    assert so.error is not None
    assert "gids/0" in so.error
    assert "mlx5_0 port 1" in so.error


# --- The IB neighbour: recorded smpquery output ----------------------------------------------


def test_smpquery_switch_peer_is_the_neighbour_and_its_entry_port() -> None:
    peer = smp.parse_peer(
        _recorded("smpquery-nodeinfo-switch.txt"), _recorded("smpquery-nodedesc-switch.txt")
    )
    assert peer == smp.Peer("Switch", "0xfc6a1c0300a1b2c0", 17, "MF0;leaf-rail0-su1:MQM9700/U1")
    assert smp.neighbour_of(peer) == Neighbour(
        switch="0xfc6a1c0300a1b2c0",
        port="17",
        name="MF0;leaf-rail0-su1:MQM9700/U1",
        source="measured",
        via="smp",
    )


def test_smpquery_hca_peer_names_no_switch_and_a_long_description_keeps_its_text() -> None:
    peer = smp.parse_peer(
        _recorded("smpquery-nodeinfo-hca.txt"), _recorded("smpquery-nodedesc-hca.txt")
    )
    assert peer.node_type == "Channel Adapter"
    assert peer.description == "dgx-b017 HCA-1 mlx5_0 with a long node description"
    assert smp.neighbour_of(peer) is None


def test_smpquery_output_missing_fields_is_an_error_naming_them() -> None:
    with pytest.raises(smp.SmpError, match="lacks Guid, LocalPort"):
        smp.parse_peer("NodeType:........................Switch\n", None)
    with pytest.raises(smp.SmpError, match="Node Description"):
        smp.parse_nodedesc("nothing here\n")


def test_the_query_asks_the_peer_over_the_directed_route_of_its_port() -> None:
    asked: list[list[str]] = []
    outputs = {
        "nodeinfo": _recorded("smpquery-nodeinfo-switch.txt"),
        "nodedesc": _recorded("smpquery-nodedesc-switch.txt"),
    }

    def runner(argv: Sequence[str]) -> str:
        asked.append(list(argv))
        return outputs[argv[-2]]

    smp.query_peer("mlx5_3", 1, runner)
    assert asked == [
        ["smpquery", "-C", "mlx5_3", "-P", "1", "-D", "nodeinfo", "0,1"],
        ["smpquery", "-C", "mlx5_3", "-P", "1", "-D", "nodedesc", "0,1"],
    ]


def test_dgx_rails_switches_and_a_failed_smp_query(tmp_path: Path) -> None:
    """Each compute HCA's peer answers as rail leaf i; mlx5_5's query fails: that HCA reports
    the error, keeps its rail, and publishes no railSwitch (never "no neighbour")."""
    b = SysfsBuilder(tmp_path / "sys")
    hgx = dgx_h100(b, ib_identity=True)
    info = _recorded("smpquery-nodeinfo-switch.txt")

    def runner(argv: Sequence[str]) -> str:
        ca = argv[argv.index("-C") + 1]
        if ca == "mlx5_5":
            raise smp.SmpError("smpquery exited 255: ibwarn: mad_rpc: _do_madrpc failed")
        n = int(ca.removeprefix("mlx5_"))
        if argv[-2] == "nodeinfo":
            return info.replace("0xfc6a1c0300a1b2c0", f"0xfc6a1c0300a1b2{n:02x}")
        return f"Node Description:........MF0;leaf-rail{n}-su1:MQM9700/U1\n"

    sources = NeighbourSources(ScaleOutConfig(lldp="off"), smp_runner=runner)
    d = _discover(b.root, hgx.gpus, ScaleOutInputs("dgx-a", None, sources))
    nics = _by_rdma(d)
    attrs = _attributes(d)
    for i in range(8):
        so = nics[f"mlx5_{i}"].scaleOut
        assert so is not None
        assert (so.rail, so.railSource, so.role, so.roleSource) == (
            i,
            "measured",
            "compute",
            "gpu-distance",
        )
        assert attrs[f"mlx5_{i}"]["rail"] == i
        assert attrs[f"mlx5_{i}"]["netRole"] == "compute"
        assert attrs[f"mlx5_{i}"]["subnet"] == "0xfe80000000000000"
        if i == 5:
            assert so.neighbour is None
            assert so.error is not None
            assert "_do_madrpc failed" in so.error
            assert "railSwitch" not in attrs["mlx5_5"]
        else:
            assert so.neighbour is not None
            assert so.neighbour.port == "17"
            assert attrs[f"mlx5_{i}"]["railSwitch"] == f"0xfc6a1c0300a1b2{i:02x}"
    # Storage NICs on root ports of their own: beside no GPU, so no rail and no role.
    for k in range(8, 12):
        so = nics[f"mlx5_{k}"].scaleOut
        assert so is not None
        assert so.rail is None
        assert so.role is None
        assert "rail" not in attrs[f"mlx5_{k}"]
        assert "netRole" not in attrs[f"mlx5_{k}"]


# --- Rails and roles --------------------------------------------------------------------------


def test_two_nics_beside_one_gpu_are_compute_without_rails(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    node = rdma_node(b, [[Port()], [Port()]])
    nics = _by_rdma(_discover(b.root, node.gpus))
    for dev in ("mlx5_0", "mlx5_1"):
        so = nics[dev].scaleOut
        assert so is not None
        assert so.role == "compute"
        assert so.rail is None


def test_no_gpu_record_means_no_rail_and_no_role() -> None:
    iface = Interface(name="ens0np0", bus="pci", virtual=False, rdmaDevice="mlx5_0")
    assert place([iface], []) == {"ens0np0": place([iface], [])["ens0np0"]}
    assert place([iface], [])["ens0np0"].rail is None
    assert place([iface], [])["ens0np0"].compute is False


def test_role_selector_beats_measured_and_declared(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = dgx_h100(b)
    declared = parse_topology_file(
        "nodes:\n  dgx-a:\n    nics:\n"
        "      mlx5_8: {role: frontend}\n      mlx5_9: {role: storage}\n"
    )
    roles = (
        parse_role_override("mlx5_8=storage"),
        parse_role_override("0000:2b:00.1=storage"),
        parse_role_override("ibp25s0=frontend"),
    )
    nics = _by_rdma(_discover(b.root, hgx.gpus, ScaleOutInputs("dgx-a", declared, None, roles)))

    def role(dev: str) -> tuple[str | None, str | None]:
        so = nics[dev].scaleOut
        assert so is not None
        return so.role, so.roleSource

    assert role("mlx5_8") == ("storage", "selector")
    assert role("mlx5_9") == ("storage", "selector")  # 0000:2b:00.1 is mlx5_9
    assert role("mlx5_10") == (None, None)
    assert role("mlx5_0") == ("frontend", "selector")
    assert role("mlx5_1") == ("compute", "gpu-distance")


def test_role_selector_errors_name_what_was_wrong() -> None:
    assert parse_role_override("ens1f0=storage") == RoleOverride("ens1f0", "storage")
    with pytest.raises(ValueError, match="MATCH=ROLE"):
        parse_role_override("storage")
    with pytest.raises(ValueError, match="not 'spine'"):
        parse_role_override("mlx5_0=spine")


# --- Declared vs measured ---------------------------------------------------------------------


def _roce_node(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    return b.root, hgx.gpus, hgx.netdevs


def test_a_miscabled_nic_and_a_storage_nic_on_a_compute_leaf_are_disagreements(
    tmp_path: Path,
) -> None:
    """RoCE rail fabric: the file says NIC i on leaf-rail{i}. LLDP measures NIC 2 on rail 3's
    leaf (mis-cabled), and NIC 5 declared storage on `storage-leaf` reaches rail 5's leaf
    (a storage NIC on a compute leaf). Both keep the two readings, name the dispute, and
    publish no railSwitch; the declared rail 1 for NIC 0 contradicts the measured 0, so NIC 0
    publishes no rail."""
    root, gpus, netdevs = _roce_node(tmp_path)
    heard = {
        nd: (f"0c:42:a1:5e:10:{3 if i == 2 else i:02x}", f"leaf-rail{3 if i == 2 else i}", "swp1")
        for i, nd in enumerate(netdevs)
    }
    text = "nodes:\n  roce-a:\n    nics:\n"
    for i in range(8):
        if i == 5:
            text += "      mlx5_5: {switch: storage-leaf, role: storage}\n"
        else:
            text += f"      mlx5_{i}: {{rail: {1 if i == 0 else i}, switch: leaf-rail{i}}}\n"
    neighbours = lldpd.parse_neighbors(__import__("json").dumps(lldpcli_json0(heard)))
    inputs = ScaleOutInputs(
        "roce-a",
        parse_topology_file(text),
        lambda iface, port: lldpd.reading_for(neighbours, iface.name),
    )
    d = _discover(root, gpus, inputs)
    nics, attrs = _by_rdma(d), _attributes(d)

    so2 = nics["mlx5_2"].scaleOut
    assert so2 is not None
    assert so2.neighbour is not None
    assert so2.neighbour.name == "leaf-rail3"
    assert so2.declaredNeighbour is not None
    assert so2.declaredNeighbour.switch == "leaf-rail2"
    assert (
        so2.disagreement == "switch: measured 0c:42:a1:5e:10:03 (leaf-rail3), declared leaf-rail2"
    )
    assert "railSwitch" not in attrs["mlx5_2"]
    assert attrs["mlx5_2"]["rail"] == 2

    so5 = nics["mlx5_5"].scaleOut
    assert so5 is not None
    assert so5.disagreement is not None
    assert "declared storage-leaf" in so5.disagreement
    assert "role: measured compute, declared storage" in so5.disagreement
    assert so5.role is None
    assert "netRole" not in attrs["mlx5_5"]

    so0 = nics["mlx5_0"].scaleOut
    assert so0 is not None
    assert so0.disagreement == "rail: measured 0, declared 1"
    assert so0.rail is None
    assert "rail" not in attrs["mlx5_0"]
    assert attrs["mlx5_0"]["railSwitch"] == "0c:42:a1:5e:10:00"  # the switch agrees

    so1 = nics["mlx5_1"].scaleOut
    assert so1 is not None
    assert so1.disagreement is None
    assert so1.declaredNeighbour is None
    assert attrs["mlx5_1"]["railSwitch"] == "0c:42:a1:5e:10:01"


def test_declared_neighbour_stands_in_where_nothing_was_measured(tmp_path: Path) -> None:
    root, gpus, _ = _roce_node(tmp_path)
    declared = parse_topology_file(
        "SwitchName=tor-1 Nodes=roce-a\n"  # the tree form says nothing per NIC
    )
    yaml = parse_topology_file(
        "nodes:\n  roce-a:\n    nics:\n      enp25s0np0: {switch: tor-1, port: '7'}\n"
    )
    nics = _by_rdma(_discover(root, gpus, ScaleOutInputs("roce-a", yaml)))
    so = nics["mlx5_0"].scaleOut
    assert so is not None
    assert so.neighbour == Neighbour(
        switch="tor-1", port="7", source="declared", via="topology-file"
    )
    assert declared.nic("roce-a", ["enp25s0np0"]) is None
    other = _by_rdma(_discover(root, gpus, ScaleOutInputs("roce-b", yaml)))
    assert other["mlx5_0"].scaleOut is not None
    assert other["mlx5_0"].scaleOut.neighbour is None  # the file speaks of another node


def test_a_long_switch_id_becomes_its_stable_label_form(tmp_path: Path) -> None:
    root, gpus, _ = _roce_node(tmp_path)
    long_id = "chassis-" + "x" * 80
    nb = Neighbour(switch=long_id, port="1", source="measured", via="lldp")
    inputs = ScaleOutInputs("n", None, lambda iface, port: nb)
    value = _attributes(_discover(root, gpus, inputs))["mlx5_1"]["railSwitch"]
    assert len(value) <= 63
    assert value.startswith("chassis-xxx")


# --- LLDP frames -----------------------------------------------------------------------------


def tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!H", (kind << 9) | len(value)) + value


def lldpdu(
    chassis: bytes = b"\x04" + bytes.fromhex("0c42a15e1000"),
    port: bytes = b"\x05swp17",
    ttl: int = 120,
    name: bytes | None = b"leaf-rail0-su1",
) -> bytes:
    body = tlv(1, chassis) + tlv(2, port) + tlv(3, struct.pack("!H", ttl))
    if name is not None:
        body += tlv(5, name)
    return body + tlv(0, b"")


def frame(payload: bytes, ethertype: int = 0x88CC) -> bytes:
    return (
        lldp.NEAREST_BRIDGE + bytes.fromhex("020000000001") + struct.pack("!H", ethertype) + payload
    )


def test_lldpdu_mandatory_tlvs_and_system_name() -> None:
    pdu = lldp.parse_frame(frame(lldpdu()))
    assert pdu == lldp.Lldpdu("0c:42:a1:5e:10:00", "swp17", 120, "leaf-rail0-su1")
    assert pdu.neighbour() == Neighbour(
        switch="0c:42:a1:5e:10:00",
        port="swp17",
        name="leaf-rail0-su1",
        source="measured",
        via="lldp",
    )


def test_lldpdu_id_subtypes() -> None:
    ipv4 = b"\x05\x01" + bytes([192, 0, 2, 9])
    pdu = lldp.parse_lldpdu(lldpdu(chassis=ipv4, port=b"\x03" + bytes(6), name=None))
    assert (pdu.chassis_id, pdu.port_id, pdu.system_name) == (
        "192.0.2.9",
        "00:00:00:00:00:00",
        None,
    )
    pdu = lldp.parse_lldpdu(lldpdu(chassis=b"\x07spine-chassis-1", port=b"\x07Eth1/1"))
    assert (pdu.chassis_id, pdu.port_id) == ("spine-chassis-1", "Eth1/1")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (tlv(2, b"\x05p") + tlv(1, b"\x07c") + tlv(3, b"\x00\x78"), "starts with types [2, 1, 3]"),
        (lldpdu(chassis=b"\x04\x01\x02"), "MAC address of 2 octets"),
        (tlv(1, b"\x07c") + tlv(2, b"\x05p") + tlv(3, b"\x78"), "TTL TLV is 1 octets"),
        (tlv(1, b"\x07c") + struct.pack("!H", (2 << 9) | 20) + b"ab", "runs past the frame"),
    ],
)
def test_malformed_lldpdus_are_refused_naming_the_tlv(payload: bytes, message: str) -> None:
    with pytest.raises(lldp.LldpError, match=message.replace("[", r"\[").replace("]", r"\]")):
        lldp.parse_lldpdu(payload)


def test_a_frame_of_another_ethertype_is_not_lldp() -> None:
    with pytest.raises(lldp.LldpError, match="0x0800"):
        lldp.parse_frame(frame(lldpdu(), ethertype=0x0800))
    tagged = lldp.NEAREST_BRIDGE + bytes(6) + b"\x81\x00\x00\x05\x88\xcc" + lldpdu()
    assert lldp.parse_frame(tagged).port_id == "swp17"


# --- lldpd -----------------------------------------------------------------------------------


def test_lldpd_json0_neighbours_and_errors() -> None:
    import json

    text = json.dumps(lldpcli_json0({"enp25s0np0": ("0c:42:a1:5e:10:00", "leaf-rail0", "swp1")}))
    heard = lldpd.parse_neighbors(text)
    assert heard == {
        "enp25s0np0": Neighbour(
            switch="0c:42:a1:5e:10:00",
            port="swp1",
            name="leaf-rail0",
            source="measured",
            via="lldpd",
        )
    }
    assert lldpd.reading_for(heard, "enp59s0np0") == "lldpd heard no neighbour on enp59s0np0"
    assert lldpd.parse_neighbors('{"lldp": []}') == {}
    with pytest.raises(lldpd.LldpdError, match="not JSON"):
        lldpd.parse_neighbors("Interface: eth0")
    with pytest.raises(lldpd.LldpdError, match="json0"):
        lldpd.parse_neighbors('{"lldp": {"interface": {"eth0": {}}}}')


def test_lldpd_mode_runs_lldpcli_once_per_pass_and_reports_its_failure(tmp_path: Path) -> None:
    root, gpus, _ = _roce_node(tmp_path)
    calls: list[int] = []

    def lldpcli() -> str:
        calls.append(1)
        raise lldpd.LldpdError("lldpcli not found (is lldpd installed on the host?)")

    sources = NeighbourSources(ScaleOutConfig(lldp="lldpd"), lldpcli=lldpcli)
    sources.begin_pass()
    nics = _by_rdma(_discover(root, gpus, ScaleOutInputs("n", None, sources)))
    assert len(calls) == 1
    so = nics["mlx5_0"].scaleOut
    assert so is not None
    assert so.neighbour is None
    assert so.error == "lldpcli not found (is lldpd installed on the host?)"


def test_off_asks_nothing_and_reports_nothing(tmp_path: Path) -> None:
    root, gpus, _ = _roce_node(tmp_path)
    sources = NeighbourSources(ScaleOutConfig(lldp="off", ib="off"))
    so = _by_rdma(_discover(root, gpus, ScaleOutInputs("n", None, sources)))["mlx5_0"].scaleOut
    assert so is not None
    assert so.neighbour is None
    assert so.error is None


def test_roce_tor_node_every_nic_on_one_switch(tmp_path: Path) -> None:
    """A RoCE ToR fabric (not rail-optimised cabling): every NIC reaches the same top-of-rack
    switch. Rails are still the PCI pairing (NCCL's NIC index); railSwitch is equal on all."""
    import json

    root, gpus, netdevs = _roce_node(tmp_path)
    tor = ("58:a2:e1:00:00:01", "tor-r12", "")
    heard = lldpd.parse_neighbors(
        json.dumps(
            lldpcli_json0(
                {nd: (tor[0], tor[1], f"Ethernet{i + 1}") for i, nd in enumerate(netdevs)}
            )
        )
    )
    inputs = ScaleOutInputs(
        "roce-a", None, lambda iface, port: lldpd.reading_for(heard, iface.name)
    )
    attrs = _attributes(_discover(root, gpus, inputs))
    assert {attrs[f"mlx5_{i}"]["railSwitch"] for i in range(8)} == {"58:a2:e1:00:00:01"}
    assert [attrs[f"mlx5_{i}"]["rail"] for i in range(8)] == list(range(8))


def test_topology_file_problems_are_reported_and_nothing_is_used(tmp_path: Path) -> None:
    from fabricdra.kubeletplugin.scaleoutsources import inputs_for, read_topology

    assert read_topology(None) == (None, None)
    missing = tmp_path / "absent.yaml"
    assert read_topology(missing) == (None, f"topology file {missing}: No such file or directory")
    bad = tmp_path / "bad.conf"
    bad.write_text("SwitchName=leaf1 Nodes=a\nSwitchName=leaf2 Nodes=a\n")
    declared, problem = read_topology(bad)
    assert declared is None
    assert problem is not None
    assert "under both 'leaf1' and 'leaf2'" in problem
    good = tmp_path / "good.yaml"
    good.write_text("nodes:\n  n:\n    nics:\n      mlx5_0: {rail: 0}\n")
    inputs, problem = inputs_for("n", ScaleOutConfig(topology_file=good), None)
    assert problem is None
    assert inputs.declared is not None
    assert inputs.declared.nic("n", ["mlx5_0"]) is not None
