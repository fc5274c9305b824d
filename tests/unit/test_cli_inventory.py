"""`fabricdra inventory` and `fabricdra nvml-snapshot`, end to end: in-process through
`fabricdra.cli.main`, and as a real process for exit codes and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fabricdra.api import labels as keys
from fabricdra.cli import main
from tests.sysfs.builder import DOWN, SysfsBuilder
from tests.sysfs.nodes import (
    MI300X_VRAM_BYTES,
    amd_mi300x,
    h100_snapshot,
    hgx_h100,
    mi300x_unique_id,
    nvml_fabric,
    rdma_node,
    write_json,
)

CLUSTER = "5b0e112233445566778899aabbccddef"
INTERFACE_KEYS = {
    "name",
    "bus",
    "pciBusId",
    "numaNode",
    "mtu",
    "up",
    "virtual",
    "rdma",
    "rdmaDevice",
    "link",
    "virtualFunctions",
    "topology",
}
TOPOLOGY_KEYS = {"pciRootId", "pciSwitches", "pcieRoot"}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["inventory", *args]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def fabricdra(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabricdra.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def hgx(tmp_path: Path) -> tuple[Path, Path]:
    hgx = hgx_h100(SysfsBuilder(tmp_path / "sys"), vf_nics=(6,), broken_nics=(3,))
    snap = write_json(
        tmp_path / "nvml.json", h100_snapshot(hgx.gpus, fabric=nvml_fabric("completed"))
    )
    return tmp_path / "sys", snap


def test_the_document(capsys: pytest.CaptureFixture[str], hgx: tuple[Path, Path]) -> None:
    root, snap = hgx
    doc = run(capsys, "--sysfs-root", str(root), "--nvml-snapshot", str(snap))
    assert doc["enumeration"] == {"interfaces": "ok", "accelerators": "ok"}
    assert doc["nvml"]["source"] == "snapshot"
    assert doc["nvml"]["available"] is True
    for iface in doc["interfaces"]:
        assert set(iface) >= INTERFACE_KEYS
        assert set(iface["topology"]) == TOPOLOGY_KEYS
        for vf in iface["virtualFunctions"]:
            assert set(vf["topology"]) == TOPOLOGY_KEYS
    broken = next(i for i in doc["interfaces"] if i["rdmaDevice"] == "mlx5_3")
    assert broken["link"]["verdict"] == "Failed"
    assert broken["link"]["ports"] == [{"port": 1, "state": "1: DOWN", "physState": "3: Disabled"}]
    assert broken["link"]["since"] is not None
    assert len(doc["accelerators"]) == 8
    for acc in doc["accelerators"]:
        assert {"vendor", "pciBusId", "numaNode", "topology"} <= set(acc)
        assert set(acc["topology"]) == {*TOPOLOGY_KEYS, "fabric"}
        assert acc["topology"]["fabric"]["domain"] == f"nvlink-{CLUSTER}-1"
    assert doc["labels"] == {
        keys.RDMA_CAPABLE: "true",
        keys.RDMA_DISTANCE: "PXB",
        keys.RDMA_NUMA: "0_1",
        keys.FABRIC_DOMAIN: f"nvlink-{CLUSTER}-1",
    }
    assert doc["labelsUnknown"] == []
    assert doc["labelsRejected"] == {}


def test_absent_facts_are_null_never_invented(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    hgx_h100(SysfsBuilder(tmp_path / "sys"), numa=False)
    doc = run(capsys, "--sysfs-root", str(tmp_path / "sys"))
    assert all(i["numaNode"] is None for i in doc["interfaces"] if i["bus"] == "pci" and i["rdma"])
    assert all(a["numaNode"] is None for a in doc["accelerators"])
    assert all(a["uuid"] is None for a in doc["accelerators"])  # NVML not here
    assert keys.RDMA_NUMA not in doc["labels"]


def test_previous_keeps_first_seen(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rdma_node(SysfsBuilder(tmp_path / "sys"), [[DOWN]])
    first = run(capsys, "--sysfs-root", str(tmp_path / "sys"))
    prev = write_json(tmp_path / "prev.json", first)
    second = run(capsys, "--sysfs-root", str(tmp_path / "sys"), "--previous", str(prev))
    assert second["interfaces"] == first["interfaces"]


def test_failed_enumeration_keeps_previous_and_logs_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    b = SysfsBuilder(tmp_path / "sys")
    hgx_h100(b)
    first = run(capsys, "--sysfs-root", str(b.root))
    prev = write_json(tmp_path / "prev.json", first)
    b.escape("class/net")
    result = fabricdra("inventory", "--sysfs-root", str(b.root), "--previous", str(prev))
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc["interfaces"] == first["interfaces"]
    assert doc["enumeration"]["interfaces"].startswith("cannot enumerate network interfaces")
    assert set(doc["labelsUnknown"]) >= {keys.RDMA_CAPABLE, keys.RDMA_NUMA}
    errors = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert any(e.get("level") == "error" and e.get("part") == "interfaces" for e in errors)


def test_sample(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run(capsys, "--sample")
    assert doc["sysfsRoot"] == "sample"
    assert len(doc["accelerators"]) == 8
    assert doc["labels"][keys.RDMA_CAPABLE] == "true"


# -- bad input: one clear line naming the file, non-zero exit ------------------------------


def bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    root = tmp_path / "sys"
    SysfsBuilder(root)
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "list.json").write_text("[]")
    (tmp_path / "badgpu.json").write_text(json.dumps({"0000:18:00.0": {"uuid": "x"}}))
    (tmp_path / "badprev.json").write_text(json.dumps({"interfaces": [{"name": 1}]}))
    (tmp_path / "afile").write_text("x")
    r = ["--sysfs-root", str(root)]
    return {
        "missing root": (["--sysfs-root", str(tmp_path / "nope")], str(tmp_path / "nope")),
        "root is a file": (["--sysfs-root", str(tmp_path / "afile")], str(tmp_path / "afile")),
        "missing snapshot": ([*r, "--nvml-snapshot", str(tmp_path / "n.json")], "n.json"),
        "unreadable snapshot": ([*r, "--nvml-snapshot", str(tmp_path / "dir.json")], "dir.json"),
        "malformed snapshot": (
            [*r, "--nvml-snapshot", str(tmp_path / "broken.json")],
            "broken.json",
        ),
        "binary snapshot": ([*r, "--nvml-snapshot", str(tmp_path / "binary.json")], "binary"),
        "snapshot not an object": ([*r, "--nvml-snapshot", str(tmp_path / "list.json")], "list"),
        "snapshot entry invalid": (
            [*r, "--nvml-snapshot", str(tmp_path / "badgpu.json")],
            "badgpu.json",
        ),
        "missing previous": ([*r, "--previous", str(tmp_path / "p.json")], "p.json"),
        "unreadable previous": ([*r, "--previous", str(tmp_path / "dir.json")], "dir.json"),
        "malformed previous": ([*r, "--previous", str(tmp_path / "broken.json")], "broken.json"),
        "binary previous": ([*r, "--previous", str(tmp_path / "binary.json")], "binary.json"),
        "previous not an object": ([*r, "--previous", str(tmp_path / "list.json")], "list.json"),
        "previous invalid": ([*r, "--previous", str(tmp_path / "badprev.json")], "badprev.json"),
    }


CASES = [
    "missing root",
    "root is a file",
    "missing snapshot",
    "unreadable snapshot",
    "malformed snapshot",
    "binary snapshot",
    "snapshot not an object",
    "snapshot entry invalid",
    "missing previous",
    "unreadable previous",
    "malformed previous",
    "binary previous",
    "previous not an object",
    "previous invalid",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exits_non_zero_with_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    args, named = bad_inputs(tmp_path)[case]
    result = fabricdra("inventory", *args)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fabricdra inventory: ")
    assert named in lines[0]
    assert "Traceback" not in result.stderr


def test_bad_input_in_process_too(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args, named = bad_inputs(tmp_path)["malformed previous"]
    assert main(["inventory", *args]) == 2
    err = capsys.readouterr().err
    assert named in err
    assert len(err.strip().splitlines()) == 1


# -- this machine ------------------------------------------------------------------------


def test_this_machine_is_reported_truthfully() -> None:
    """Run with no flags: each interface's bus and `virtual` are what /sys itself says."""
    result = fabricdra("inventory")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["sysfsRoot"] == "/sys"
    ifaces = {i["name"]: i for i in doc["interfaces"]}
    assert set(ifaces) == set(os.listdir("/sys/class/net"))
    for name, iface in ifaces.items():
        location = os.path.realpath(f"/sys/class/net/{name}")
        assert iface["virtual"] == location.startswith("/sys/devices/virtual/"), name
        device = f"/sys/class/net/{name}/device"
        bus = (
            os.path.basename(os.path.realpath(f"{device}/subsystem"))
            if os.path.exists(device)
            else ""
        )
        assert iface["bus"] == bus, name
        if bus != "pci":
            assert iface["pciBusId"] is None
            assert iface["topology"]["pcieRoot"] is None
    assert ifaces["lo"]["virtual"] is True
    assert ifaces["lo"]["bus"] == ""
    if "eth0" in ifaces and "virtio" in os.path.realpath("/sys/class/net/eth0"):
        assert ifaces["eth0"]["bus"] == "virtio"
        assert ifaces["eth0"]["virtual"] is False


def test_nvml_snapshot_command() -> None:
    """Without an NVIDIA driver it says so on one line and exits 1; with one it records JSON
    that `--nvml-snapshot` reads back."""
    result = fabricdra("nvml-snapshot")
    if result.returncode == 0:
        snapshot = json.loads(result.stdout)
        assert all(
            {"uuid", "name", "memoryTotalMiB", "migMode"} <= set(v) for v in snapshot.values()
        )
        return
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("fabricdra nvml-snapshot: NVML unavailable")
    assert result.stdout == ""


def test_node_name_slices_carry_recorded_xid_events(
    capsys: pytest.CaptureFixture[str], hgx: tuple[Path, Path]
) -> None:
    """`--node-name` prints what the agent publishes: a recorded critical Xid taints its GPU;
    a GPU recorded as unable to report Xids is Unknown, which only informs (effect None)."""
    root, snap = hgx
    doc = json.loads(snap.read_text())
    first, second = sorted(doc)[:2]
    doc[first].update(xidEventsSupported=True, xidEvents=[{"xid": 79}])
    doc[second].update(xidEventsSupported=False, xidEventsReason="not supported")
    snap.write_text(json.dumps(doc))
    out = run(capsys, "--sysfs-root", str(root), "--nvml-snapshot", str(snap), "--node-name", "n")
    devices = {d["name"]: d for s in out["resourceSlices"] for d in s["spec"]["devices"]}
    gpu = devices["gpu-" + first.replace(":", "-").replace(".", "-")]
    assert [t["value"] for t in gpu.get("taints", [])] == ["gpu-xid-79"]
    other = devices["gpu-" + second.replace(":", "-").replace(".", "-")]
    assert other.get("taints", []) == [
        {"key": "fabricdra.io/health-unknown", "value": "gpu", "effect": "None"}
    ]


def test_node_name_slices_carry_amd_health(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--node-name` judges AMD GPUs as the agent does: an uncorrectable RAS error taints the
    GPU, and its serial and VRAM are published."""
    b = SysfsBuilder(tmp_path / "sys")
    node = amd_mi300x(b, amdgpu=True)
    b.write(f"bus/pci/devices/{node.gpus[1]}/ras/umc_err_count", "ue: 2\nce: 0\nde: 0\n")
    out = run(capsys, "--sysfs-root", str(b.root), "--node-name", "n")
    devices = {d["name"]: d for s in out["resourceSlices"] for d in s["spec"]["devices"]}
    names = ["gpu-" + g.replace(":", "-").replace(".", "-") for g in node.gpus[:2]]
    healthy, bad = devices[names[0]], devices[names[1]]
    assert healthy["attributes"]["uuid"] == {"string": f"{mi300x_unique_id(0):016x}"}
    assert healthy["capacity"] == {"memory": {"value": f"{MI300X_VRAM_BYTES // 2**20}Mi"}}
    assert healthy.get("taints", []) == []
    assert [t["value"] for t in bad.get("taints", [])] == ["gpu-ecc"]


# -- scale-out (issue 27) -------------------------------------------------------------------


def test_sample_shows_rails_roles_and_neighbours(capsys: pytest.CaptureFixture[str]) -> None:
    """The sample is rail-optimised: NIC i beside GPU i, cabled to rail leaf i (recorded
    lldpd neighbours, a topology file that agrees); NIC 3's link is down, so lldpd heard
    nobody there: an error, and the declared neighbour stands in."""
    doc = run(capsys, "--sample")
    nics = {i["rdmaDevice"]: i["scaleOut"] for i in doc["interfaces"] if i.get("scaleOut")}
    assert sorted(nics) == [f"mlx5_{i}" for i in range(8)]
    for i in range(8):
        so = nics[f"mlx5_{i}"]
        assert (so["rail"], so["railSource"], so["role"]) == (i, "measured", "compute")
        assert so["disagreement"] is None
    assert nics["mlx5_0"]["neighbour"]["name"] == "leaf-rail0-su1"
    assert nics["mlx5_0"]["neighbour"]["via"] == "lldpd"
    assert nics["mlx5_3"]["neighbour"]["source"] == "declared"
    assert nics["mlx5_3"]["error"] == "lldpd heard no neighbour on enp93s0np0"


def test_topology_file_and_role_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    topology = tmp_path / "topology.yaml"
    topology.write_text("nodes:\n  node-a:\n    nics:\n      mlx5_1: {rail: 5, switch: other}\n")
    doc = run(
        capsys,
        "--sample",
        "--topology-file",
        str(topology),
        "--net-role",
        "mlx5_2=storage",
    )
    nics = {i["rdmaDevice"]: i["scaleOut"] for i in doc["interfaces"] if i.get("scaleOut")}
    assert nics["mlx5_1"]["rail"] is None
    assert nics["mlx5_1"]["disagreement"] == (
        "switch: measured 0c:42:a1:5e:10:01 (leaf-rail1-su1), declared other; "
        "rail: measured 1, declared 5"
    )
    assert (nics["mlx5_2"]["role"], nics["mlx5_2"]["roleSource"]) == ("storage", "selector")


@pytest.mark.parametrize(
    ("content", "flag", "named"),
    [
        ("nodes: [1, 2]\n", "--topology-file", "topology YAML: nodes"),
        ("SwitchName=a Nodes=n[3-1]\n", "--topology-file", "runs backwards"),
        ("{not json", "--lldpd-json", "not JSON"),
    ],
)
def test_bad_scale_out_inputs_exit_2_naming_the_fault(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    content: str,
    flag: str,
    named: str,
) -> None:
    """Bad flags fail before the sample is unpacked (as the device flags do)."""

    def unpacked() -> None:
        raise AssertionError("the sample was unpacked before the flags were checked")

    monkeypatch.setattr("fabricdra.kubeletplugin.samples.sample_node", unpacked)
    path = tmp_path / "input"
    path.write_text(content)
    assert main(["inventory", "--sample", flag, str(path)]) == 2
    err = capsys.readouterr().err
    assert named in err
    assert str(path) in err
    assert main(["inventory", "--sample", "--net-role", "mlx5_0=spine"]) == 2
    assert "role must be one of" in capsys.readouterr().err
