"""Never hand out a device twice, in-cluster (issue 30 point 1): the chart installed on the
harness's node, whose kubelet then advertises `nvidia.com/gpu` in the Node's capacity as NVIDIA's
device plugin would (an extended resource patched into the Node's status, the way Kubernetes
documents advertising one): the node agent withdraws its GPUs from the node's ResourceSlices
and says so with a Warning event on the Node; once the count is gone they come back."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from tests.e2e.installkit import Installed, own_slices

pytestmark = pytest.mark.e2e


def _types(api: Any, node: str) -> set[str]:
    return {
        d.attributes["type"].string for s in own_slices(api, node) for d in s.spec.devices or []
    }


def test_a_gpu_device_plugin_on_the_node_withdraws_our_gpus(installed: Installed) -> None:
    node = installed.cluster.node_name
    with installed.cluster.api_client() as api:
        core = client.CoreV1Api(api)
        wait_for(lambda: {"gpu", "rdma"} <= _types(api, node), timeout=120, what="our devices")
        core.patch_node_status(node, {"status": {"capacity": {"nvidia.com/gpu": "8"}}})
        try:
            wait_for(
                lambda: "gpu" not in _types(api, node) and "rdma" in _types(api, node),
                timeout=120,
                what="the GPUs withdrawn, the NICs kept",
            )
            selector = f"involvedObject.name={node},reason=DevicesWithheld"
            events = wait_for(
                lambda: core.list_namespaced_event("default", field_selector=selector).items,
                timeout=60,
                what="the DevicesWithheld event",
            )
            assert "nvidia.com/gpu=8" in events[0].message
            assert events[0].involved_object.kind == "Node"
        finally:
            core.patch_node_status(node, {"status": {"capacity": {"nvidia.com/gpu": None}}})
        wait_for(lambda: "gpu" in _types(api, node), timeout=120, what="the GPUs offered again")
