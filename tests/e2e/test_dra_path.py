"""The node cluster's DRA path, before any driver exists: the KCM creates the claim from its
template, the scheduler allocates a device from a ResourceSlice on the node and binds the pod,
and the kubelet then asks for the (absent) driver by name. A DRA kubelet plugin registered
with this kubelet is what would let the pod start."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.existing import ExistingCluster
from e2e.harness.images import TEST_IMAGE
from e2e.harness.nodecluster import NodeCluster

pytestmark = pytest.mark.e2e


def test_claim_is_allocated_and_kubelet_asks_for_the_driver(
    node_cluster: NodeCluster | ExistingCluster,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    driver, ns, node = f"smoke-{suffix}.e2e.example.com", f"dra-{suffix}", node_cluster.node_name
    with node_cluster.api_client() as api:
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        core.create_namespace({"metadata": {"name": ns}})
        resource.create_device_class(
            {
                "metadata": {"name": driver},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
            }
        )
        resource.create_resource_slice(
            {
                "metadata": {"name": f"{driver}-{suffix}"},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": f"pool-{suffix}", "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "dev0"}],
                },
            }
        )
        resource.create_namespaced_resource_claim_template(
            ns,
            {
                "metadata": {"name": "one"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [{"name": "r", "exactly": {"deviceClassName": driver}}]
                        }
                    }
                },
            },
        )
        wait_for(lambda: core.read_namespaced_service_account("default", ns), what="default SA")
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": "p"},
                "spec": {
                    "hostNetwork": True,
                    "restartPolicy": "Never",
                    "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "one"}],
                    "containers": [
                        {
                            "name": "c",
                            "image": TEST_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["true"],
                            "resources": {"claims": [{"name": "dev"}]},
                        }
                    ],
                },
            },
        )

        def kubelet_event() -> Any:
            events = core.list_namespaced_event(ns, field_selector="involvedObject.name=p").items
            return next((e for e in events if e.reason == "FailedPrepareDynamicResources"), None)

        event = wait_for(kubelet_event, timeout=90, what="the kubelet to ask for the driver")
        pod = core.read_namespaced_pod("p", ns)
        claims = resource.list_namespaced_resource_claim(ns).items
        core.delete_namespace(ns)
        resource.delete_resource_slice(f"{driver}-{suffix}")
        resource.delete_device_class(driver)

    assert pod.spec.node_name == node
    assert pod.status.phase == "Pending"
    [claim] = claims
    [result] = claim.status.allocation.devices.results
    assert (result.driver, result.pool, result.device) == (driver, f"pool-{suffix}", "dev0")
    assert event.source.component == "kubelet"
    assert f"DRA driver {driver} is not registered" in event.message
