"""The checked-in gRPC code is exactly what grpcio-tools makes of the upstream protos, and its
service paths are the ones kubelet dials."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from fabricdra.proto.gen.dra_health_v1alpha1 import api_pb2 as health_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1beta1 import api_pb2 as v1beta1_pb2
from fabricdra.proto.gen.pluginregistration_v1 import api_pb2 as reg_pb2

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checked_in_code_equals_a_fresh_generation(tmp_path: Path) -> None:
    gen = _generator()
    gen.generate(tmp_path / "gen")
    assert gen.differences(tmp_path / "gen", ROOT / "proto" / "fabricdra" / "proto" / "gen") == []


def test_differences_notices_a_stale_file(tmp_path: Path) -> None:
    gen = _generator()
    gen.generate(tmp_path / "a")
    gen.generate(tmp_path / "b")
    (tmp_path / "b" / "dra_v1" / "api_pb2.py").write_text("# edited\n")
    assert gen.differences(tmp_path / "a", tmp_path / "b") == ["dra_v1/api_pb2.py"]


def test_strip_gogoproto_leaves_plain_proto() -> None:
    src = (
        'import "github.com/gogo/protobuf/gogoproto/gogo.proto";\n'
        "message Claim {\n"
        '  string uid = 2 [(gogoproto.customname) = "UID"];\n'
        "}\n"
    )
    out = _generator().strip_gogoproto(src)
    assert "gogo" not in out
    assert "string uid = 2;" in out


@pytest.mark.parametrize(
    ("module", "service", "methods"),
    [
        (reg_pb2, "pluginregistration.Registration", {"GetInfo", "NotifyRegistrationStatus"}),
        (
            v1_pb2,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
            {"NodePrepareResources", "NodeUnprepareResources"},
        ),
        (
            v1beta1_pb2,
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
            {"NodePrepareResources", "NodeUnprepareResources"},
        ),
        (health_pb2, "v1alpha1.DRAResourceHealth", {"NodeWatchResources"}),
    ],
)
def test_service_names_on_the_wire_are_upstreams(
    module: ModuleType, service: str, methods: set[str]
) -> None:
    (svc,) = module.DESCRIPTOR.services_by_name.values()
    assert svc.full_name == service
    assert {m.name for m in svc.methods} == methods


def test_fields_match_upstream_numbers() -> None:
    device = v1_pb2.Device.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in device.items()} == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert device["share_id"].has_presence  # proto3 `optional`
    assert "share_id" not in v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    health = health_pb2.DeviceHealth.DESCRIPTOR.fields_by_name
    assert health["message"].number == 5
    assert health["health_check_timeout_seconds"].number == 4
    info = reg_pb2.PluginInfo.DESCRIPTOR.fields_by_name
    assert [(n, f.number) for n, f in info.items()] == [
        ("type", 1),
        ("name", 2),
        ("endpoint", 3),
        ("supported_versions", 4),
    ]
