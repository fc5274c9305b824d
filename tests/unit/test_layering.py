"""Which part may import which (issue 21): the node side imports nothing of the controller,
and the shared kubelet server imports no driver's module, its metrics included (they are
handed to it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

from fabricdra.kubeletplugin.kubelet import ClaimMetrics, PluginPaths, PluginServer
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc
from tests.unit.test_kubelet_server import RecordingDriver

ROOT = Path(__file__).resolve().parents[2]


def _modules_after_import(*modules: str) -> set[str]:
    code = "import json, sys\n" + "".join(f"import {m}\n" for m in modules)
    code += "print(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    return set(json.loads(out))


def test_node_side_compute_domain_code_imports_no_controller() -> None:
    loaded = _modules_after_import(
        "fabricdra.kubeletplugin.computedomain.daemon",
        "fabricdra.kubeletplugin.computedomain.imex",
        "fabricdra.kubeletplugin.computedomain.plugin",
    )
    assert sorted(m for m in loaded if m.startswith("fabricdra.controller")) == []


def test_shared_kubelet_server_imports_no_driver_module() -> None:
    loaded = _modules_after_import("fabricdra.kubeletplugin.kubelet.server")
    driver_modules = sorted(
        m
        for m in loaded
        if m.startswith("fabricdra.kubeletplugin.")
        and not m.startswith("fabricdra.kubeletplugin.kubelet")
    )
    assert driver_modules == []


def test_server_records_claims_into_the_metrics_it_is_given(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    claims = ClaimMetrics(
        prepare_seconds=Histogram("p_seconds", "", ["driver"], registry=registry),
        unprepare_seconds=Histogram("u_seconds", "", ["driver"], registry=registry),
        prepare_errors=Counter("p_errors", "", ["driver"], registry=registry),
        unprepare_errors=Counter("u_errors", "", ["driver"], registry=registry),
    )
    driver = RecordingDriver()
    paths = PluginPaths.for_driver(
        driver.driver_name, registry_dir=tmp_path / "reg", plugin_dir=tmp_path / "plugin"
    )
    request = v1_pb2.NodePrepareResourcesRequest(
        claims=[
            v1_pb2.Claim(namespace="ns", name="good", uid="u1"),
            v1_pb2.Claim(namespace="ns", name="bad", uid="u2"),
        ]
    )
    with (
        PluginServer(driver, paths, metrics=claims),
        grpc.insecure_channel(f"unix://{paths.dra_socket}") as channel,
    ):
        stub = v1_grpc.DRAPluginStub(channel)
        stub.NodePrepareResources(request, timeout=30)
        stub.NodeUnprepareResources(
            v1_pb2.NodeUnprepareResourcesRequest(
                claims=[v1_pb2.Claim(namespace="ns", name="good", uid="u1")]
            ),
            timeout=30,
        )
    label = {"driver": driver.driver_name}
    assert registry.get_sample_value("p_seconds_count", label) == 2
    assert registry.get_sample_value("p_errors_total", label) == 1
    assert registry.get_sample_value("u_seconds_count", label) == 1
    assert registry.get_sample_value("u_errors_total", label) is None  # never failed


def test_api_is_schemas_and_talks_to_no_server() -> None:
    """`api/` holds the schemas; the REST client, its typed errors and the informer live in
    `kube/` (issue 21.4). Importing every api module loads no HTTP client and nothing of kube/."""
    modules = sorted(
        f"fabricdra.api.{p.stem}"
        for p in (ROOT / "api" / "fabricdra" / "api").glob("*.py")
        if p.stem != "__init__"
    )
    loaded = _modules_after_import(*modules)
    talking = sorted(
        m
        for m in loaded
        if m.split(".")[0] in {"urllib3", "kubernetes"} or m.startswith("fabricdra.kube")
    )
    assert talking == []
    assert not (ROOT / "api" / "fabricdra" / "api" / "rest.py").exists()
