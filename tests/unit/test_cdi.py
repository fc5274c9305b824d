"""CDI specs: schema-valid, the lowest cdiVersion their content needs, names the CDI parser
accepts, atomic per-claim files; and the checkpoint that survives restarts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest

from fabricdra.kubeletplugin.kubelet.cdi import (
    CdiDevice,
    CdiError,
    CdiSpec,
    CdiWriter,
    ContainerEdits,
    DeviceNode,
    Mount,
    validate_device_name,
    validate_kind,
)
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint, CheckpointError, ClaimEntry
from tests.cdischema import validate

KIND = "k8s.devices.fabricdra.io/device"
UVERBS = DeviceNode("/dev/infiniband/uverbs3", major=231, minor=195)


def spec(*devices: CdiDevice, **kw: object) -> CdiSpec:
    return CdiSpec(KIND, devices, **kw)  # type: ignore[arg-type]


def test_plain_device_nodes_and_env_need_only_0_3_0() -> None:
    s = spec(
        CdiDevice("rdma-0000-1c-00-0-uid", ContainerEdits(device_nodes=(UVERBS,))),
        CdiDevice("rdma-uid", ContainerEdits(env=("NCCL_IB_HCA=mlx5_0,mlx5_1",))),
    )
    doc = s.to_dict()
    validate(doc)
    assert doc["cdiVersion"] == "0.3.0"
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/infiniband/uverbs3", "type": "c", "major": 231, "minor": 195}
    ]


@pytest.mark.parametrize(
    ("edits", "name", "expected"),
    [
        (ContainerEdits(mounts=(Mount("/a", "/b", ("ro",), type="bind"),)), "d", "0.4.0"),
        (ContainerEdits(mounts=(Mount("/a", "/b", ("ro",)),)), "d", "0.3.0"),
        (
            ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia0", host_path="/x/nvidia0"),)),
            "d",
            "0.5.0",
        ),
        # the same path on both sides is no hostPath at all
        (
            ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia0", host_path="/dev/nvidia0"),)),
            "d",
            "0.3.0",
        ),
        (ContainerEdits(env=("A=1",)), "0abc", "0.5.0"),  # a name starting with a digit
    ],
)
def test_lowest_version_for_content(edits: ContainerEdits, name: str, expected: str) -> None:
    doc = spec(CdiDevice(name, edits)).to_dict()
    validate(doc)
    assert doc["cdiVersion"] == expected


def test_annotations_and_dotted_class_need_0_6_0() -> None:
    dev = CdiDevice("d", ContainerEdits(env=("A=1",)))
    with_ann = spec(dev, annotations={"fabricdra.io/claim": "ns/name"}).to_dict()
    validate(with_ann)
    assert with_ann["cdiVersion"] == "0.6.0"
    dotted = CdiSpec("example.com/gpu.mig", (dev,)).to_dict()
    validate(dotted)
    assert dotted["cdiVersion"] == "0.6.0"


def test_the_highest_requirement_wins() -> None:
    doc = spec(
        CdiDevice("a", ContainerEdits(mounts=(Mount("/a", "/b", type="bind"),))),
        CdiDevice("b", ContainerEdits(device_nodes=(DeviceNode("/dev/x", host_path="/h/x"),))),
    ).to_dict()
    validate(doc)
    assert doc["cdiVersion"] == "0.5.0"


@pytest.mark.parametrize("name", ["-a", "a-", "a/b", "a b", "", "a=b"])
def test_bad_device_names_are_refused(name: str) -> None:
    with pytest.raises(CdiError, match="device name"):
        validate_device_name(name)


@pytest.mark.parametrize("name", ["a", "gpu-0000-1b-00-0-8f2e", "MIG-1:2", "a.b_c"])
def test_good_device_names(name: str) -> None:
    validate_device_name(name)


@pytest.mark.parametrize("kind", ["nokind", "1vendor/class", "vendor/class-", "v/c/d", "/c"])
def test_bad_kinds_are_refused(kind: str) -> None:
    with pytest.raises(CdiError, match="kind"):
        validate_kind(kind)


def test_duplicate_names_empty_devices_and_empty_specs_are_refused() -> None:
    dev = CdiDevice("a", ContainerEdits(env=("A=1",)))
    with pytest.raises(CdiError, match="used twice"):
        spec(dev, dev)
    with pytest.raises(CdiError, match="no container edits"):
        spec(CdiDevice("b", ContainerEdits()))
    with pytest.raises(CdiError, match="at least one device"):
        spec()
    with pytest.raises(CdiError, match="KEY=value"):
        ContainerEdits(env=("=x",))


def test_schema_catches_what_the_model_would_not_write() -> None:
    # the schema itself is strict enough to matter: a deviceNode without a path is invalid
    bad = {
        "cdiVersion": "0.3.0",
        "kind": KIND,
        "devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"type": "c"}]}}],
    }
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


def test_writer_is_atomic_per_claim_and_removes(tmp_path: Path) -> None:
    w = CdiWriter(tmp_path / "cdi", KIND)
    s = spec(CdiDevice("a-uid1", ContainerEdits(device_nodes=(UVERBS,))))
    path = w.write("uid1", s)
    assert path == tmp_path / "cdi" / "k8s.devices.fabricdra.io-device_uid1.json"
    assert json.loads(path.read_text()) == s.to_dict()
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert os.listdir(tmp_path / "cdi") == [path.name]  # no temp file left behind
    assert w.device_id("a-uid1") == "k8s.devices.fabricdra.io/device=a-uid1"
    assert w.remove("uid1")
    assert not w.remove("uid1")
    with pytest.raises(CdiError):
        w.path_for("../etc")


def test_writer_never_leaves_a_partial_file(tmp_path: Path) -> None:
    w = CdiWriter(tmp_path, KIND)
    good = spec(CdiDevice("a", ContainerEdits(env=("A=1",))))
    w.write("u", good)
    before = w.path_for("u").read_bytes()
    with pytest.raises(CdiError):
        w.write("u", CdiSpec("other.io/x", good.devices))
    assert w.path_for("u").read_bytes() == before


def test_checkpoint_survives_a_restart_and_writes_atomically(tmp_path: Path) -> None:
    path = tmp_path / "state" / "checkpoint.json"
    cp = Checkpoint(path)
    assert cp.entries() == []
    e1 = ClaimEntry("u1", "ns", "c1", ("/var/run/cdi/x_u1.json",))
    cp.put(e1)
    cp.put(ClaimEntry("u2", "ns", "c2", ()))
    again = Checkpoint(path)
    assert again.get("u1") == e1
    assert [e.uid for e in again.entries()] == ["u1", "u2"]
    assert again.remove("u1")
    assert not again.remove("u1")
    assert Checkpoint(path).get("u1") is None
    # No temp file left; the lock file stays (every pod of the driver locks the same file).
    assert sorted(os.listdir(path.parent)) == ["checkpoint.json", "checkpoint.json.lock"]


def test_unreadable_checkpoint_is_an_error_not_an_empty_one(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot be read"):
        Checkpoint(path)
    path.write_text(json.dumps({"version": 99, "claims": []}))
    with pytest.raises(CheckpointError, match="version 99"):
        Checkpoint(path)
