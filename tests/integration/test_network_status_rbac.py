"""The chart's RBAC lets the node agent write its driver's network status into a claim
allocated on its own node (1.36 granular status authorization: `resourceclaims/driver`
`associated-node:patch`), and not into one on another node (that would take
`arbitrary-node:patch`, which only controllers hold). The chart applied for real, the
agent's own pod-bound token, a real kube-apiserver."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import ControlPlane
from fabricdra.kube.rest import CLAIMS, ApiError, Rest
from fabricdra.kubeletplugin.networkstatus import DRIVER
from fabricdra.kubeletplugin.prepare import ApiClaimReader
from tests.integration.test_chart_apiserver import Installed, _agent_on, installed  # noqa: F401

pytestmark = pytest.mark.integration


def _claim_on(cp: ControlPlane, ns: str, node: str) -> str:
    name = f"nic-{uuid.uuid4().hex[:6]}"
    with cp.api_client() as api:
        resource = client.ResourceV1Api(api)
        resource.create_namespaced_resource_claim(
            ns,
            {
                "metadata": {"name": name},
                "spec": {
                    "devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "x"}}]}
                },
            },
        )
        selector = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
        result = {"request": "nic", "driver": DRIVER, "pool": node, "device": "rdma-0"}
        resource.patch_namespaced_resource_claim_status(
            name,
            ns,
            {
                "status": {
                    "allocation": {"devices": {"results": [result]}, "nodeSelector": selector}
                }
            },
        )
    return name


def _apply(api: Any, ns: str, name: str, node: str) -> None:
    entry = {
        "driver": DRIVER,
        "pool": node,
        "device": "rdma-0",
        "networkData": {"interfaceName": "ens0np0", "ips": ["192.0.2.10/24"]},
    }
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "status": {"devices": [entry]},
    }
    Rest(api).apply(CLAIMS, name, body, ns, field_manager=DRIVER, sub="status")


def test_the_agent_writes_network_status_on_its_own_node_only(
    control_plane: ControlPlane,
    installed: Installed,  # noqa: F811 - the chart-applying fixture imported above
) -> None:
    ns = f"netrbac-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(ns)
    mine = _claim_on(control_plane, ns, installed.node_a)
    theirs = _claim_on(control_plane, ns, installed.node_b)
    with _agent_on(control_plane, installed, installed.node_a) as api:
        _apply(api, ns, mine, installed.node_a)
        with pytest.raises(ApiError) as denied:
            _apply(api, ns, theirs, installed.node_b)
    # Another node's claim: refused by the granular status check (which answers 422).
    assert denied.value.status == 422, denied.value.message
    assert "arbitrary-node:patch" in denied.value.message
    with control_plane.api_client() as api:
        claim = client.ResourceV1Api(api).read_namespaced_resource_claim(mine, ns)
    assert claim.status.devices[0].network_data.ips == ["192.0.2.10/24"]


def test_the_agent_may_read_the_pods_a_claim_is_reserved_for(
    control_plane: ControlPlane,
    installed: Installed,  # noqa: F811 - the chart-applying fixture imported above
) -> None:
    """Issue 32 point 4: prepare reads an RDMA claim's pods for their PodGroup (KEP-5729)."""
    ns = f"podrbac-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(ns)
    pod = {
        "metadata": {"name": "trainer-0"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x"}]},
    }
    with control_plane.api_client() as api:
        client.CoreV1Api(api).create_namespaced_pod(ns, pod)
    with _agent_on(control_plane, installed, installed.node_a) as api:
        got = ApiClaimReader(api).read_pod(ns, "trainer-0", timeout=30)
    assert got["metadata"]["name"] == "trainer-0"
