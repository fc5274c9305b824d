"""The single-node cluster is real: a pod runs to completion on the node and its logs come back
through the API (apiserver -> kubelet -> containerd)."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.existing import ExistingCluster
from e2e.harness.images import TEST_IMAGE
from e2e.harness.nodecluster import NodeCluster

pytestmark = pytest.mark.e2e


def test_pod_runs_to_completion_and_logs_are_read(
    node_cluster: NodeCluster | ExistingCluster,
) -> None:
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    marker = uuid.uuid4().hex
    with node_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})
        wait_for(
            lambda: core.read_namespaced_service_account("default", name),
            what="the namespace's default ServiceAccount",
        )
        core.create_namespaced_pod(
            name,
            {
                "metadata": {"name": "smoke"},
                "spec": {
                    "hostNetwork": True,
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": TEST_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", f"echo {marker}; uname -s"],
                        }
                    ],
                },
            },
        )
        phase = wait_for(
            lambda: (
                (p := core.read_namespaced_pod("smoke", name).status.phase)
                in ("Succeeded", "Failed")
                and p
            ),
            timeout=120,
            what="the pod to finish",
        )
        pod = core.read_namespaced_pod("smoke", name)
        logs = core.read_namespaced_pod_log("smoke", name, container="c")
        core.delete_namespace(name)
    assert phase == "Succeeded"
    assert pod.spec.node_name == node_cluster.node_name
    assert logs.splitlines() == [marker, "Linux"]


def test_cluster_exposes_kubelet_paths(node_cluster: NodeCluster | ExistingCluster) -> None:
    """The DRA plugin tests find the kubelet's plugin folders through these attributes."""
    assert node_cluster.plugins_registry_dir == node_cluster.kubelet_root / "plugins_registry"
    assert node_cluster.plugins_dir == node_cluster.kubelet_root / "plugins"
    if node_cluster.is_local:
        # The kubelet created its plugin-watcher folder: it watches this very path.
        assert node_cluster.plugins_registry_dir.is_dir()
        assert node_cluster.cdi_dir.is_dir()
