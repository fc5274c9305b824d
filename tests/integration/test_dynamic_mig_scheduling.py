"""Dynamic MIG with a real kube-scheduler (issue 20 point 2): one H100 80GB in MIG mode with
no instances, published as the whole GPU and every profile placement on one counter set; the
scheduler hands out any mix of instances that fits, and never the whole GPU beside one."""

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
from fabricdra.kubeletplugin.devices import DeviceConfig, gpu_info
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.publisher import NodePublisher
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import h100_snapshot, hgx_h100, write_json

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("installed")]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def _suffix() -> str:
    return uuid.uuid4().hex[:8]


def _claim(name: str, cls: str, selector: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "dev",
                        "exactly": {
                            "deviceClassName": cls,
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


def _mig(name: str, profile: str) -> dict[str, Any]:
    return _claim(
        name,
        "mig.fabricdra.io",
        f'device.attributes["devices.fabricdra.io"].migProfile == "{profile}"',
    )


def _pod(name: str, node: str, claim: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "dev", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "dev"}]},
                }
            ],
        },
    }


def _submit(cp: ControlPlane, ns: str, node: str, claim: dict[str, Any]) -> str:
    name = claim["metadata"]["name"]
    with cp.api_client() as api:
        client.ResourceV1Api(api).create_namespaced_resource_claim(ns, copy.deepcopy(claim))
        client.CoreV1Api(api).create_namespaced_pod(ns, _pod(f"pod-{name}", node, name))
    return f"pod-{name}"


def _allocated(cp: ControlPlane, ns: str, pod: str, claim: str) -> str:
    with cp.api_client() as api:
        core = client.CoreV1Api(api)
        wait_for(
            lambda: core.read_namespaced_pod(pod, ns).spec.node_name,
            timeout=60,
            what=f"{pod} scheduled",
        )
        c = client.ResourceV1Api(api).read_namespaced_resource_claim(claim, ns)
    (result,) = c.status.allocation.devices.results
    return str(result.device)


def _unschedulable(cp: ControlPlane, ns: str, pod: str, claim: str) -> None:
    """The scheduler tried the pod and said it does not fit (its own verdict, not a timeout)."""
    with cp.api_client() as api:
        core = client.CoreV1Api(api)

        def refused() -> bool:
            conds = core.read_namespaced_pod(pod, ns).status.conditions or []
            return any(
                c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                for c in conds
            )

        wait_for(refused, timeout=60, what=f"{pod} found unschedulable")
        assert core.read_namespaced_pod(pod, ns).spec.node_name is None
        c = client.ResourceV1Api(api).read_namespaced_resource_claim(claim, ns)
    assert c.status is None or c.status.allocation is None


@pytest.fixture
def mig_node(control_plane: ControlPlane, tmp_path: Path) -> tuple[str, str]:
    """A Node (no kubelet) whose second GPU is an H100 80GB in MIG mode with no instances,
    published with dynamic MIG on. Returns the node's name and that GPU's device-name stem."""
    name = f"dynmig-{_suffix()}"
    control_plane.create_node(name, labels={"kubernetes.io/hostname": name})
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    snap = h100_snapshot(hgx.gpus, mig_gpu=1)
    snap[hgx.gpus[1]]["migDevices"] = []
    readings = load_snapshot(write_json(tmp_path / "nvml.json", snap))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    assert d.interfaces is not None
    assert d.accelerators is not None
    inv = build_devices(
        d.interfaces,
        d.accelerators,
        DeviceConfig(dynamic_mig=True),
        gpu_info=gpu_info(readings),
    )
    with control_plane.api_client() as api:
        result = NodePublisher(api, name).sync(d, inv)
        assert result.ok, result.errors
        slices = (
            client.ResourceV1Api(api)
            .list_resource_slice(field_selector=f"spec.nodeName={name}")
            .items
        )
    # The API server kept what was sent: the counter set and the devices' consumption.
    assert any(s.spec.shared_counters for s in slices)
    assert any(d.consumes_counters for s in slices for d in s.spec.devices or [])
    return name, hgx.gpus[1].replace(":", "-").replace(".", "-")


def _whole_gpu_claim(g: str) -> dict[str, Any]:
    """A claim for GPU `g` (its device-name form, 0000-18-00-0) whole, by its PCI bus id."""
    return _claim(
        "whole",
        "gpu.fabricdra.io",
        f'device.attributes["resource.kubernetes.io"].pciBusID == '
        f'"{g[:4]}:{g[5:7]}:{g[8:10]}.{g[11]}"',
    )


def test_3g_and_4g_fit_a_third_does_not_and_the_whole_gpu_waits(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, mig_node: tuple[str, str]
) -> None:
    node, g = mig_node
    ns = f"dynmig-{_suffix()}"
    control_plane.create_namespace(ns)
    whole = _whole_gpu_claim(g)

    three = _submit(control_plane, ns, node, _mig("three", "3g.40gb"))
    assert _allocated(control_plane, ns, three, "three") == f"mig-{g}-3g-40gb-m4"
    four = _submit(control_plane, ns, node, _mig("four", "4g.40gb"))
    assert _allocated(control_plane, ns, four, "four") == f"mig-{g}-4g-40gb-m0"

    one = _submit(control_plane, ns, node, _mig("one", "1g.10gb"))
    _unschedulable(control_plane, ns, one, "one")
    gpu = _submit(control_plane, ns, node, whole)
    _unschedulable(control_plane, ns, gpu, "whole")


def test_whole_gpu_does_not_fit_beside_one_instance(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, mig_node: tuple[str, str]
) -> None:
    node, g = mig_node
    ns = f"dynmig-{_suffix()}"
    control_plane.create_namespace(ns)
    one = _submit(control_plane, ns, node, _mig("one", "1g.10gb"))
    assert _allocated(control_plane, ns, one, "one") == f"mig-{g}-1g-10gb-m6"
    whole = _whole_gpu_claim(g)
    gpu = _submit(control_plane, ns, node, whole)
    _unschedulable(control_plane, ns, gpu, "whole")


def test_whole_gpu_allocates_alone_and_then_no_instance_fits(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, mig_node: tuple[str, str]
) -> None:
    node, g = mig_node
    ns = f"dynmig-{_suffix()}"
    control_plane.create_namespace(ns)
    whole = _whole_gpu_claim(g)
    gpu = _submit(control_plane, ns, node, whole)
    assert _allocated(control_plane, ns, gpu, "whole") == f"gpu-{g}"
    one = _submit(control_plane, ns, node, _mig("one", "1g.10gb"))
    _unschedulable(control_plane, ns, one, "one")


def test_docs_example_and_a_claim_by_mig_class_get_placements(
    control_plane: ControlPlane, kube_scheduler: KubeScheduler, mig_node: tuple[str, str]
) -> None:
    """docs/examples/mig-3g-40gb.yaml gets the top 3g.40gb placement; a claim naming the MIG
    class (`deviceClass == "h100-mig-3g-40gb"`, as for a static instance) gets the other one.
    Before, a placement carried its GPU's class (`h100-80gb-sxm`): the class claim found
    nothing."""
    node, g = mig_node
    ns = f"dynmig-{_suffix()}"
    control_plane.create_namespace(ns)
    example = yaml.safe_load((EXAMPLES / "mig-3g-40gb.yaml").read_text())
    name = example["metadata"]["name"]
    pod = _submit(control_plane, ns, node, example)
    assert _allocated(control_plane, ns, pod, name) == f"mig-{g}-3g-40gb-m4"
    by_class = _claim(
        "by-class",
        "mig.fabricdra.io",
        'device.attributes["devices.fabricdra.io"].deviceClass == "h100-mig-3g-40gb"',
    )
    pod = _submit(control_plane, ns, node, by_class)
    assert _allocated(control_plane, ns, pod, "by-class") == f"mig-{g}-3g-40gb-m0"
