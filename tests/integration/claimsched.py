"""Claims for one GPU and pods pinned to a node with no kubelet, scheduled by the real
kube-scheduler: what the GPU sharing and NVML selector tests submit and read back."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.kubeletplugin.assembly import build_devices
from fabricdra.kubeletplugin.devices import DeviceConfig, gpu_info
from fabricdra.kubeletplugin.discovery.node import discover
from fabricdra.kubeletplugin.discovery.nvml import load_snapshot
from fabricdra.kubeletplugin.discovery.sysfs import SysfsTree
from fabricdra.kubeletplugin.publisher import NodePublisher
from tests.sysfs.builder import SysfsBuilder
from tests.sysfs.nodes import h100_snapshot, hgx_h100, write_json

DRIVER = "devices.fabricdra.io"


def publish_hgx(cp: ControlPlane, tmp_path: Path, prefix: str, config: DeviceConfig) -> str:
    """A Node (no kubelet) whose HGX devices, read from the recorded NVML answers every test
    replays, are published through NodePublisher as `config` offers them; its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cp.create_node(name, labels={"kubernetes.io/hostname": name})
    b = SysfsBuilder(tmp_path / "sys")
    hgx = hgx_h100(b)
    readings = load_snapshot(write_json(tmp_path / "nvml.json", h100_snapshot(hgx.gpus)))
    d = discover(SysfsTree(str(b.root)), nvml_source=lambda: readings)
    inventory = build_devices(
        d.interfaces or [], d.accelerators or [], config, gpu_info=gpu_info(d.nvml)
    )
    with cp.api_client() as api:
        result = NodePublisher(api, name).sync(d, inventory)
    assert result.ok, result.errors
    return name


def claim_for(name: str, capacity: dict[str, str] | None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.fabricdra.io"}
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod_for(name: str, claim: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _raw_claim(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    # Raw JSON: the client's models may predate shareID / consumedCapacity.
    resp = client.ResourceV1Api(api).read_namespaced_resource_claim(
        name, ns, _preload_content=False
    )
    return dict(json.loads(resp.data))


class Workloads:
    def __init__(self, cp: ControlPlane, node: str) -> None:
        self.cp, self.node = cp, node
        self.ns = f"share-{uuid.uuid4().hex[:8]}"
        cp.create_namespace(self.ns)

    def submit(self, name: str, capacity: dict[str, str] | None) -> None:
        """A claim `name` for one GPU (asking `capacity`) and a pod `name` using it."""
        self.submit_claim(claim_for(name, capacity))

    def submit_claim(self, claim: dict[str, Any]) -> None:
        """`claim` and a pod of the same name using it, pinned to the node."""
        name = claim["metadata"]["name"]
        with self.cp.api_client() as api:
            client.ResourceV1Api(api).create_namespaced_resource_claim(self.ns, claim)
            client.CoreV1Api(api).create_namespaced_pod(self.ns, pod_for(name, name, self.node))

    def bound(self, name: str) -> dict[str, Any]:
        """The claim's one allocation result, once its pod is bound to the node."""
        with self.cp.api_client() as api:
            core = client.CoreV1Api(api)
            node = wait_for(
                lambda: core.read_namespaced_pod(name, self.ns).spec.node_name,
                timeout=60,
                what=f"pod {name} scheduled",
            )
            assert node == self.node
            results = _raw_claim(api, self.ns, name)["status"]["allocation"]["devices"]["results"]
        assert len(results) == 1
        result = dict(results[0])
        assert (result["driver"], result["pool"]) == (DRIVER, self.node)
        return result

    def unschedulable(self, name: str) -> str:
        """Why the scheduler leaves the pod Pending (its PodScheduled condition's message)."""

        def reason() -> str | None:
            with self.cp.api_client() as api:
                pod = client.CoreV1Api(api).read_namespaced_pod(name, self.ns)
            assert pod.spec.node_name is None
            for c in pod.status.conditions or []:
                if c.type == "PodScheduled" and c.reason == "Unschedulable":
                    return str(c.message)
            return None

        return str(wait_for(reason, timeout=60, what=f"pod {name} found unschedulable"))
