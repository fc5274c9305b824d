"""Prepare writes each granted RDMA netdev's network status into the claim (KEP-4817), by
server-side apply with the driver's field manager, leaving another driver's entries alone:
a real kube-apiserver, the devices driver behind a real PluginServer (gRPC over a unix socket),
a kernel-shaped sysfs node, and a network namespace of the test's own as "the host's", whose
addresses the kernel answers for."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client

from e2e.harness.controlplane import ControlPlane
from fabricdra.kube.rest import CLAIMS, Rest
from fabricdra.kubeletplugin import metrics
from fabricdra.kubeletplugin.kinds.nvidia.claims import NvidiaClaims
from fabricdra.kubeletplugin.kinds.nvidia.nvidiacdi import ToolkitSpecs
from fabricdra.kubeletplugin.kubelet import PluginPaths, PluginServer
from fabricdra.kubeletplugin.kubelet.cdi import CdiWriter
from fabricdra.kubeletplugin.kubelet.checkpoint import Checkpoint
from fabricdra.kubeletplugin.networkstatus import NetworkStatus
from fabricdra.kubeletplugin.prepare import CDI_KIND, ApiClaimReader, DevicesDriver
from fabricdra.proto.gen.dra_v1 import api_pb2 as v1_pb2
from fabricdra.proto.gen.dra_v1 import api_pb2_grpc as v1_grpc
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture
from tests.integration.kubelethost import DRIVER, RdmaHost, build_rdma_host, create_claim
from tests.netns import IsolatedNetns

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("installed")]

NODE = "node-a"
OTHER = "gpu.example.com"
MAC0 = "b8:3f:d2:00:00:10"


@pytest.fixture
def host(tmp_path: Path) -> RdmaHost:
    h = build_rdma_host(tmp_path / "host", hcas=2)
    (h.root / "sys" / "class" / "net" / "ens0np0" / "address").write_text(MAC0 + "\n")
    return h


@pytest.fixture
def netns(tmp_path: Path) -> Iterator[IsolatedNetns]:
    with IsolatedNetns(tmp_path / "netns", {"ens0np0": ["192.0.2.10/24", "2001:db8::10/64"]}) as ns:
        yield ns


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[Any]:
    with control_plane.api_client() as c:
        yield c


def _serve(base: Path, host: RdmaHost, api: Any, proc_root: Path) -> PluginServer:
    reader = ApiClaimReader(api)
    driver = DevicesDriver(
        node_name=NODE,
        inventory=host.inventory,
        claims=reader,
        events=reader,
        cdi=CdiWriter(base / "cdi", CDI_KIND),
        checkpoint=Checkpoint(base / "checkpoint.json", boot_id="b"),
        host=host.layout,
        families=(NvidiaClaims(ToolkitSpecs(())),),
        network=NetworkStatus(metrics.counting_rest(api), NODE, host.root / "sys", proc_root),
    )
    server = PluginServer(
        driver,
        PluginPaths.for_driver(DRIVER, registry_dir=base / "reg", plugin_dir=base / "plugin"),
    )
    server.start()
    return server


def test_prepare_writes_the_netdevs_status_beside_another_drivers(
    control_plane: ControlPlane, api: Any, host: RdmaHost, netns: IsolatedNetns, tmp_path: Path
) -> None:
    ns = f"netstatus-{os.getpid()}"
    control_plane.create_namespace(ns)
    nic = host.device("mlx5_0")
    uid = create_claim(
        api,
        ns,
        "nic-and-gpu",
        [
            {"request": "nic", "pool": NODE, "device": nic},
            {"request": "gpu", "pool": NODE, "device": "gpu-0", "driver": OTHER},
        ],
    )
    resource = client.ResourceV1Api(api)
    # The other driver has written its own entry, under its own field manager.
    other_entry = {"driver": OTHER, "pool": NODE, "device": "gpu-0", "data": {"slot": 3}}
    Rest(api).apply(
        CLAIMS,
        "nic-and-gpu",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "nic-and-gpu", "namespace": ns},
            "status": {"devices": [other_entry]},
        },
        ns,
        field_manager=OTHER,
        sub="status",
    )

    server = _serve(tmp_path / "plugin", host, api, netns.proc_root)
    try:
        request = v1_pb2.NodePrepareResourcesRequest(
            claims=[v1_pb2.Claim(namespace=ns, name="nic-and-gpu", uid=uid)]
        )
        with grpc.insecure_channel(f"unix://{server.paths.dra_socket}") as ch:
            answer = v1_grpc.DRAPluginStub(ch).NodePrepareResources(request, timeout=45)
    finally:
        server.stop()
    assert not answer.claims[uid].error

    claim = api.sanitize_for_serialization(
        resource.read_namespaced_resource_claim("nic-and-gpu", ns)
    )
    entries = {d["driver"]: d for d in claim["status"]["devices"]}
    assert entries[OTHER] == other_entry  # untouched
    ours = entries[DRIVER]
    assert (ours["pool"], ours["device"]) == (NODE, nic)
    data = ours["networkData"]
    assert data["interfaceName"] == "ens0np0"
    assert data["hardwareAddress"] == MAC0
    assert sorted(data["ips"]) == ["192.0.2.10/24", "2001:db8::10/64"]  # no link-local
    managers = {
        m["manager"] for m in claim["metadata"]["managedFields"] if m.get("subresource") == "status"
    }
    assert {DRIVER, OTHER} <= managers
