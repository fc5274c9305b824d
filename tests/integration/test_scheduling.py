"""A real kube-scheduler allocating the docs' example claims from published ResourceSlices.

The node is the 8-GPU HGX fixture: eight root ports, each with a PCIe switch carrying one GPU
and one NIC. The scheduler must pair each GPU with the NIC behind its own outermost bridge.
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.harness.controlplane import ControlPlane, KubeScheduler, wait_for
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import gpu_info
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.publisher import NodePublisher
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import HGX_BUSES, h100_snapshot, hgx_h100, nvlink_bridges, write_json

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("installed")]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
DRIVER = "devices.fabricdra.io"

FIRST_NIC_SELECTOR = 'device.attributes["resource.kubernetes.io"].pciBusID == "0000:19:00.0"'


def _suffix() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def hgx_node(control_plane: ControlPlane, tmp_path: Path) -> str:
    """A Node object (no kubelet) whose HGX devices are published through NodePublisher."""
    name = f"sched-hgx-{_suffix()}"
    control_plane.create_node(name, labels={"kubernetes.io/hostname": name})
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    readings = load_snapshot(write_json(tmp_path / "nvml.json", h100_snapshot(hgx.gpus)))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    assert d.interfaces is not None
    assert d.accelerators is not None
    with control_plane.api_client() as api:
        result = NodePublisher(api, name).sync(d, build_devices(d.interfaces, d.accelerators))
    assert result.ok, result.errors
    return name


def _schedule(
    cp: ControlPlane, node: str, example: str | dict[str, Any], ns: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create the example claim and a pod using it pinned to `node`; wait until it is bound.
    Returns the claim's allocation results by request, and the node's devices by name."""
    if ns is None:
        ns = f"sched-{_suffix()}"
        cp.create_namespace(ns)
    claim = (
        example if isinstance(example, dict) else yaml.safe_load((EXAMPLES / example).read_text())
    )
    claim_name = claim["metadata"]["name"]
    pod_name = f"workload-{claim_name}"
    pod = {
        "metadata": {"name": pod_name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "devices", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "devices"}]},
                }
            ],
        },
    }
    with cp.api_client() as api:
        resource = client.ResourceV1Api(api)
        core = client.CoreV1Api(api)
        resource.create_namespaced_resource_claim(ns, copy.deepcopy(claim))
        core.create_namespaced_pod(ns, pod)
        bound = wait_for(
            lambda: core.read_namespaced_pod(pod_name, ns).spec.node_name,
            timeout=60,
            what=f"pod with claim {example} scheduled",
        )
        assert bound == node
        allocated = resource.read_namespaced_resource_claim(claim_name, ns)
        slices = resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    results = {r.request: r for r in allocated.status.allocation.devices.results}
    for r in results.values():
        assert (r.driver, r.pool) == (DRIVER, node)
    devices = {d.name: d for s in slices for d in s.spec.devices or []}
    return results, devices


def _attr(device: Any, name: str) -> Any:
    a = device.attributes[name]
    return a.string if a.string is not None else a.int


def test_gpu_and_its_own_nic_share_the_outermost_bridge(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, hgx_node: str
) -> None:
    # Another workload already holds the NIC beside the first GPU, so the first GPU in name
    # order no longer has a NIC of its own free: only the constraint makes the scheduler pass
    # it over rather than pair it with some other NIC.
    ns = f"sched-{_suffix()}"
    control_plane.create_namespace(ns)
    taken = {
        "metadata": {"name": "first-nic"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "nic",
                        "exactly": {
                            "deviceClassName": "rdma.fabricdra.io",
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": FIRST_NIC_SELECTOR,
                                    }
                                }
                            ],
                        },
                    }
                ]
            }
        },
    }
    held, _ = _schedule(control_plane, hgx_node, taken, ns)
    assert held["nic"].device == "rdma-0000-19-00-0"
    results, devices = _schedule(control_plane, hgx_node, "gpu-nic-pxb.yaml", ns)
    gpu, nic = devices[results["gpu"].device], devices[results["nic"].device]
    assert results["gpu"].device != "gpu-0000-18-00-0"
    assert _attr(gpu, "type") == "gpu"
    assert _attr(nic, "type") == "rdma"
    assert _attr(gpu, "pciRoot") == _attr(nic, "pciRoot")
    # In the fixture a GPU at bus B+3 has its own NIC at B+4 behind root port B:01.0.
    bus = int(_attr(gpu, "resource.kubernetes.io/pciBusID").split(":")[1], 16)
    assert bus - 3 in HGX_BUSES
    assert _attr(nic, "resource.kubernetes.io/pciBusID") == f"0000:{bus + 1:02x}:00.0"
    assert _attr(gpu, "pciRoot") == f"0000:{bus - 3:02x}:01.0"


def test_eight_gpus_each_with_its_own_nic(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, hgx_node: str
) -> None:
    results, devices = _schedule(control_plane, hgx_node, "gpus-with-own-nics.yaml")
    gpus = {results[f"gpu{i}"].device for i in range(8)}
    nics = {results[f"nic{i}"].device for i in range(8)}
    assert len(gpus) == 8
    assert len(nics) == 8
    for i in range(8):
        gpu, nic = devices[results[f"gpu{i}"].device], devices[results[f"nic{i}"].device]
        assert _attr(gpu, "pciRoot") == _attr(nic, "pciRoot")


def test_gpu_and_nic_on_the_same_numa_node(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, hgx_node: str
) -> None:
    results, devices = _schedule(control_plane, hgx_node, "gpu-nic-numa.yaml")
    gpu, nic = devices[results["gpu"].device], devices[results["nic"].device]
    assert _attr(gpu, "resource.kubernetes.io/numaNode") == _attr(
        nic, "resource.kubernetes.io/numaNode"
    )


def test_two_gpus_joined_by_an_nvlink_bridge(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, tmp_path: Path
) -> None:
    # PCIe cards: the first GPU has no NVLink, the next ones are bridged crosswise (1-3, 2-4),
    # so the first two in slice order are never a pair: only the constraint gets one.
    name = f"sched-bridged-{_suffix()}"
    control_plane.create_node(name, labels={"kubernetes.io/hostname": name})
    b = SysfsBuilder(tmp_path / "sys")
    gpus = hgx_h100(b).gpus
    snap = nvlink_bridges(h100_snapshot(gpus), [(gpus[1], gpus[3]), (gpus[2], gpus[4])])
    readings = load_snapshot(write_json(tmp_path / "nvml.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    assert d.interfaces is not None
    assert d.accelerators is not None
    inventory = build_devices(d.interfaces, d.accelerators, gpu_info=gpu_info(d.nvml))
    with control_plane.api_client() as api:
        assert NodePublisher(api, name).sync(d, inventory).ok
    ns = f"sched-{_suffix()}"
    control_plane.create_namespace(ns)
    _, devices = _schedule(control_plane, name, "gpus-nvlink-pair.yaml", ns)
    with control_plane.api_client() as api:
        claim = client.ResourceV1Api(api).read_namespaced_resource_claim("gpus-nvlink-pair", ns)
    claimed = sorted(r.device for r in claim.status.allocation.devices.results)
    assert claimed == ["gpu-0000-3a-00-0", "gpu-0000-5c-00-0"]  # gpus[1] and gpus[3]
    assert {_attr(devices[n], "nvlinkGroup") for n in claimed} == {gpus[1]}
    assert "nvlinkGroup" not in devices["gpu-0000-18-00-0"].attributes
