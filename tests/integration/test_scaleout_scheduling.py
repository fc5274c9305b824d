"""The scale-out example claims (docs/examples/, issue 27 point 6) allocated by a real
kube-scheduler from ResourceSlices published for kernel-shaped nodes: one NIC per rail
(distinctAttribute on `rail`), compute NICs only (`netRole`), a GPU and its rail's NIC."""

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
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.publisher import NodePublisher
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import Hgx, dgx_h100, h100_snapshot, hgx_h100, write_json

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("installed")]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
DRIVER = "devices.fabricdra.io"


def _publish(cp: ControlPlane, tmp_path: Path, build: Any) -> tuple[str, Hgx]:
    name = f"rails-{uuid.uuid4().hex[:8]}"
    cp.create_node(name, labels={"kubernetes.io/hostname": name})
    b = SysfsBuilder(tmp_path / "sys")
    node: Hgx = build(b)
    readings = load_snapshot(write_json(tmp_path / "nvml.json", h100_snapshot(node.gpus)))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    assert d.interfaces is not None
    assert d.accelerators is not None
    with cp.api_client() as api:
        assert NodePublisher(api, name).sync(d, build_devices(d.interfaces, d.accelerators)).ok
    return name, node


def _schedule(cp: ControlPlane, node: str, example: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The example claim and a pod using it, pinned to `node`, until bound: the claim's
    allocated devices by request (lists), and the node's devices by name."""
    ns = f"rails-{uuid.uuid4().hex[:8]}"
    cp.create_namespace(ns)
    claim = yaml.safe_load((EXAMPLES / example).read_text())
    name = claim["metadata"]["name"]
    pod = {
        "metadata": {"name": "workload"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "devices", "resourceClaimName": name}],
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
        resource, core = client.ResourceV1Api(api), client.CoreV1Api(api)
        resource.create_namespaced_resource_claim(ns, copy.deepcopy(claim))
        core.create_namespaced_pod(ns, pod)
        bound = wait_for(
            lambda: core.read_namespaced_pod("workload", ns).spec.node_name,
            timeout=60,
            what=f"pod with claim {example} scheduled",
        )
        assert bound == node
        allocated = resource.read_namespaced_resource_claim(name, ns)
        slices = resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    results: dict[str, list[str]] = {}
    for r in allocated.status.allocation.devices.results:
        assert (r.driver, r.pool) == (DRIVER, node)
        results.setdefault(r.request, []).append(r.device)
    devices = {d.name: d for s in slices for d in s.spec.devices or []}
    return results, devices


def _attr(device: Any, name: str) -> Any:
    a = device.attributes.get(name)
    if a is None:
        return None
    return a.string if a.string is not None else a.int


def test_one_nic_per_rail_takes_vfs_of_two_pfs(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, tmp_path: Path
) -> None:
    """NICs 6 and 7 carry four VFs each; VFs of one PF share its rail. The first two VFs in
    name order are both NIC 6's: only distinctAttribute makes the scheduler take one of each."""
    node, _ = _publish(
        control_plane, tmp_path, lambda b: hgx_h100(b, vf_nics=(6, 7), vfs_per_nic=4)
    )
    results, devices = _schedule(control_plane, node, "nics-one-per-rail.yaml")
    rails = sorted(_attr(devices[d], "rail") for d in results["nics"])
    assert rails == [6, 7]


def test_compute_nics_only_passes_over_the_storage_nics(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, tmp_path: Path
) -> None:
    """A DGX H100: the storage NICs (0000:2b:00.x) come first in name order; the claim gets
    the eight compute HCAs, one per rail."""
    node, dgx = _publish(control_plane, tmp_path, dgx_h100)
    results, devices = _schedule(control_plane, node, "compute-nics-only.yaml")
    got = [devices[d] for d in results["nics"]]
    assert {_attr(d, "netRole") for d in got} == {"compute"}
    assert sorted(_attr(d, "rail") for d in got) == list(range(8))
    assert sorted(_attr(d, "resource.kubernetes.io/pciBusID") for d in got) == sorted(dgx.nics)


def test_a_gpu_gets_its_rails_nic(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, tmp_path: Path
) -> None:
    node, dgx = _publish(control_plane, tmp_path, dgx_h100)
    results, devices = _schedule(control_plane, node, "gpu-and-its-rail-nic.yaml")
    (gpu_name,) = results["gpu"]
    (nic_name,) = results["nic"]
    gpu, nic = devices[gpu_name], devices[nic_name]
    rail = sorted(dgx.gpus).index(_attr(gpu, "resource.kubernetes.io/pciBusID"))
    assert _attr(nic, "rail") == rail
    assert _attr(nic, "netRole") == "compute"
