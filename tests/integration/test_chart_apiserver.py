"""The chart against the real API server: every rendered manifest accepted (server-side dry-run),
and the admission policy holding a node agent to its own node, keyed on the node the API server
authenticated (`authentication.kubernetes.io/node-name` of a pod-bound service-account token)."""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness.controlplane import ControlPlane
from e2e.harness.helm import Chart
from fabricdra.api.nodedevices import API_VERSION as ND_API_VERSION
from fabricdra.api.nodedevices import NodeDevicesSpec

pytestmark = pytest.mark.integration

NODE_SA = "fabricdra-node"


def _kubectl(cp: ControlPlane, *args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cp.bin_dir / "kubectl"), f"--kubeconfig={cp.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@dataclass
class Installed:
    namespace: str
    node_a: str
    node_b: str


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane) -> Installed:
    """The chart's objects applied for real in a fresh namespace (no kubelet: the DaemonSet and
    Deployment exist but run nothing), and two nodes."""
    suffix = uuid.uuid4().hex[:6]
    ns = f"fdra-chart-{suffix}"
    control_plane.create_namespace(ns)
    manifests = Chart().render(namespace=ns)
    done = _kubectl(control_plane, "apply", "--server-side", "-f", "-", stdin=manifests)
    assert done.returncode == 0, done.stderr
    nodes = Installed(ns, f"chart-a-{suffix}", f"chart-b-{suffix}")
    control_plane.create_node(nodes.node_a)
    control_plane.create_node(nodes.node_b)
    return nodes


def test_every_rendered_manifest_passes_server_side_dry_run(control_plane: ControlPlane) -> None:
    ns = f"fdra-dry-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(ns)
    for values in ({}, {"gpus": {"enabled": False}, "rdma": {"mode": "shared"}}):
        manifests = Chart().render(values, namespace=ns)
        done = _kubectl(
            control_plane, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=manifests
        )
        assert done.returncode == 0, done.stderr
        assert "DaemonSet" not in done.stderr
        assert "daemonset.apps/fabricdra-node serverside-applied (server dry run)" in done.stdout


def _token(cp: ControlPlane, ns: str, pod: dict[str, Any] | None) -> str:
    with cp.api_client() as api:
        spec: dict[str, Any] = {"audiences": [], "expirationSeconds": 600}
        if pod is not None:
            spec["boundObjectRef"] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            }
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        out = client.CoreV1Api(api).create_namespaced_service_account_token(NODE_SA, ns, body)
        return str(out.status.token)


def _agent_on(cp: ControlPlane, inst: Installed, node: str | None) -> client.ApiClient:
    """An API client holding what the node agent's pod on `node` holds: its service account's
    token, bound to that pod (or, with node None, a token bound to no pod)."""
    pod = None
    if node is not None:
        with cp.api_client() as api:
            pod = (
                client.CoreV1Api(api)
                .create_namespaced_pod(
                    inst.namespace,
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": f"agent-{uuid.uuid4().hex[:6]}"},
                        "spec": {
                            "nodeName": node,
                            "serviceAccountName": NODE_SA,
                            "containers": [{"name": "agent", "image": "localhost/busybox:e2e"}],
                        },
                    },
                )
                .to_dict()
            )
            pod = {"metadata": {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}}
    token = _token(cp, inst.namespace, pod)
    conf = client.Configuration()
    conf.host = cp.server
    conf.ssl_ca_cert = str(cp.pki.ca.cert)
    conf.api_key = {"authorization": token}
    conf.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(conf)


def _slice(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-devices-{uuid.uuid4().hex[:4]}"},
        "spec": {
            "driver": "devices.fabricdra.io",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def _node_devices(node: str) -> dict[str, Any]:
    # An empty but valid record: the schema is checked before the admission policy runs.
    spec = NodeDevicesSpec(interfaces=[], groups=[]).model_dump(mode="json")
    return {
        "apiVersion": ND_API_VERSION,
        "kind": "NodeDevices",
        "metadata": {"name": node},
        "spec": spec,
    }


def _denied(call: Any, *args: Any) -> str:
    with pytest.raises(ApiException) as e:
        call(*args)
    assert e.value.status == 403, e.value.body
    return str(e.value.body)


def test_token_carries_node_name_and_own_node_writes_pass(
    control_plane: ControlPlane, installed: Installed
) -> None:
    with _agent_on(control_plane, installed, installed.node_a) as api:
        review = client.AuthenticationV1Api(api).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        extra = review.status.user_info.extra or {}
        assert extra.get("authentication.kubernetes.io/node-name") == [installed.node_a]
        created = client.ResourceV1Api(api).create_resource_slice(_slice(installed.node_a))
        client.ResourceV1Api(api).delete_resource_slice(created.metadata.name)
        custom = client.CustomObjectsApi(api)
        custom.create_cluster_custom_object(
            "fabricdra.io",
            ND_API_VERSION.split("/")[1],
            "nodedevices",
            _node_devices(installed.node_a),
        )
        client.CoreV1Api(api).patch_node(
            installed.node_a, {"metadata": {"labels": {"fabricdra.io/test": "yes"}}}
        )


def test_cross_node_writes_are_denied(control_plane: ControlPlane, installed: Installed) -> None:
    with _agent_on(control_plane, installed, installed.node_a) as api:
        body = _denied(client.ResourceV1Api(api).create_resource_slice, _slice(installed.node_b))
        assert "spec.nodeName is its own node" in body
        custom = client.CustomObjectsApi(api)
        body = _denied(
            custom.create_cluster_custom_object,
            "fabricdra.io",
            "v1alpha1",
            "nodedevices",
            _node_devices(installed.node_b),
        )
        assert "NodeDevices named after its own node" in body
        label = {"metadata": {"labels": {"fabricdra.io/test": "yes"}}}
        _denied(client.CoreV1Api(api).patch_node, installed.node_b, label)


def test_own_node_labels_outside_fabricdra_and_spec_are_denied(
    control_plane: ControlPlane, installed: Installed
) -> None:
    with _agent_on(control_plane, installed, installed.node_a) as api:
        core = client.CoreV1Api(api)
        body = _denied(core.patch_node, installed.node_a, {"metadata": {"labels": {"team": "x"}}})
        assert "only the fabricdra.io/ and compute-domain.fabricdra.io/ labels" in body
        _denied(core.patch_node, installed.node_a, {"spec": {"unschedulable": True}})


def test_a_token_bound_to_no_pod_names_no_node_and_writes_nothing(
    control_plane: ControlPlane, installed: Installed
) -> None:
    with _agent_on(control_plane, installed, None) as api:
        body = _denied(client.ResourceV1Api(api).create_resource_slice, _slice(installed.node_a))
        assert "name no node" in body


def test_own_node_annotations_and_finalizers_are_denied(
    control_plane: ControlPlane, installed: Installed
) -> None:
    """Issue 19 point 7: the node policy covers annotations and finalizers too: an agent that
    could annotate its own node could set its own verification override
    (fabricdra.io/verification-override), and a finalizer would hold its Node's deletion."""
    with _agent_on(control_plane, installed, installed.node_a) as api:
        core = client.CoreV1Api(api)
        for prefix in ("fabricdra.io", "example.com"):
            note = {"metadata": {"annotations": {f"{prefix}/verification-override": "pass"}}}
            body = _denied(core.patch_node, installed.node_a, note)
            assert "no annotation" in body
        fin = {"metadata": {"finalizers": ["fabricdra.io/hold"]}}
        body = _denied(core.patch_node, installed.node_a, fin)
        assert "no finalizer" in body
        # Its own labels still pass alongside (the rule is not a blanket denial).
        core.patch_node(installed.node_a, {"metadata": {"labels": {"fabricdra.io/test": "ok"}}})
