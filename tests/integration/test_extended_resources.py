"""Extended resources backed by DRA (KEP-5004, beta and on by default in 1.36): a pod asking
`resources.limits: {fabricdra.io/gpu: 1}` with no resourceClaims is served from our published
slices by the real kube-scheduler, which writes a ResourceClaim of its own and names it in
`pod.status.extendedResourceClaimStatus` (PreBind, before the pod is bound; kubelet only reads
it). A node whose device plugin advertises the same name keeps being served by that plugin.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.harness.controlplane import ControlPlane, KubeScheduler, wait_for
from tests.integration.dra_setup import installed  # noqa: F401 - a fixture
from tests.integration.test_scheduling import hgx_node  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("installed")]

DRIVER = "devices.fabricdra.io"
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "pod-extended-gpu.yaml"
POD = "one-gpu"  # the example's name
# Set by the scheduler on the claims it writes for extended resources (KEP-5004).
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"


def _suffix() -> str:
    return uuid.uuid4().hex[:8]


def _raw(response: Any) -> dict[str, Any]:
    # The JSON as served: fields newer than the generated client's models are kept.
    return dict(json.loads(response.data))


def _run_pod(
    cp: ControlPlane, node: str, limits: dict[str, str] | None = None
) -> tuple[str, dict[str, Any]]:
    """The docs' example pod (asking `limits` instead of its own when given, no claims) pinned
    to `node`; returns its namespace and the pod as the API server has it once bound."""
    ns = f"extres-{_suffix()}"
    cp.create_namespace(ns)
    pod = yaml.safe_load(EXAMPLE.read_text())
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    if limits is not None:
        pod["spec"]["containers"][0]["resources"] = {"limits": limits}
    # Quantities as strings: the generated client refuses the YAML's plain `1`.
    wanted = {k: str(v) for k, v in pod["spec"]["containers"][0]["resources"]["limits"].items()}
    pod["spec"]["containers"][0]["resources"]["limits"] = wanted
    with cp.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(ns, pod)
        bound = wait_for(
            lambda: core.read_namespaced_pod(POD, ns).spec.node_name,
            timeout=60,
            what=f"pod asking {wanted} scheduled",
        )
        assert bound == node
        return ns, _raw(core.read_namespaced_pod(POD, ns, _preload_content=False))


def _claims(cp: ControlPlane, ns: str) -> list[dict[str, Any]]:
    with cp.api_client() as api:
        resource = client.ResourceV1Api(api)
        found = _raw(resource.list_namespaced_resource_claim(ns, _preload_content=False))
    return list(found["items"])


def _devices(cp: ControlPlane, node: str) -> dict[str, dict[str, Any]]:
    with cp.api_client() as api:
        resource = client.ResourceV1Api(api)
        slices = _raw(
            resource.list_resource_slice(
                field_selector=f"spec.nodeName={node}", _preload_content=False
            )
        )
    return {d["name"]: d for s in slices["items"] for d in s["spec"].get("devices") or []}


def _type(device: dict[str, Any]) -> str:
    return str(device["attributes"]["type"]["string"])


def test_a_pod_asking_fabricdra_gpu_gets_one_gpu_through_a_generated_claim(
    control_plane: ControlPlane,
    kube_scheduler: KubeScheduler,
    hgx_node: str,  # noqa: F811
) -> None:
    ns, pod = _run_pod(control_plane, hgx_node)
    status = pod["status"].get("extendedResourceClaimStatus")
    assert status is not None, "the scheduler named no claim in the pod's status"
    [claim] = _claims(control_plane, ns)
    assert claim["metadata"]["name"] == status["resourceClaimName"]
    assert claim["metadata"]["annotations"][EXTENDED_CLAIM] == "true"
    # The claim belongs to the pod: it goes when the pod goes.
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Pod", POD)
    [mapping] = status["requestMappings"]
    assert (mapping["containerName"], mapping["resourceName"]) == ("main", "fabricdra.io/gpu")
    allocation = claim["status"]["allocation"]
    [result] = allocation["devices"]["results"]
    assert result["request"] == mapping["requestName"]
    assert (result["driver"], result["pool"]) == (DRIVER, hgx_node)
    assert _type(_devices(control_plane, hgx_node)[result["device"]]) == "gpu"
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [POD]


def test_gpus_and_rdma_endpoints_by_count_in_one_container(
    control_plane: ControlPlane,
    kube_scheduler: KubeScheduler,
    hgx_node: str,  # noqa: F811
) -> None:
    ns, pod = _run_pod(control_plane, hgx_node, {"fabricdra.io/gpu": "2", "fabricdra.io/rdma": "1"})
    status = pod["status"]["extendedResourceClaimStatus"]
    by_resource = {m["resourceName"]: m["requestName"] for m in status["requestMappings"]}
    assert sorted(by_resource) == ["fabricdra.io/gpu", "fabricdra.io/rdma"]
    [claim] = _claims(control_plane, ns)
    devices = _devices(control_plane, hgx_node)
    got: dict[str, list[str]] = {}
    for r in claim["status"]["allocation"]["devices"]["results"]:
        assert r["driver"] == DRIVER
        got.setdefault(r["request"], []).append(_type(devices[r["device"]]))
    assert got == {
        by_resource["fabricdra.io/gpu"]: ["gpu", "gpu"],
        by_resource["fabricdra.io/rdma"]: ["rdma"],
    }


@pytest.mark.parametrize(("advertised", "by_dra"), [("8", False), ("0", True)])
def test_a_node_whose_device_plugin_advertises_the_name_keeps_the_device_plugin(
    control_plane: ControlPlane,
    kube_scheduler: KubeScheduler,
    hgx_node: str,  # noqa: F811
    advertised: str,
    by_dra: bool,
) -> None:
    # The same node, as if a device plugin also advertised fabricdra.io/gpu there: with a count
    # the scheduler counts the node's allocatable and writes no claim (KEP-5004). A plugin that
    # has gone leaves 0 behind, which counts as absent: DRA serves the pod (docs/install.md,
    # moving off NVIDIA's device plugin).
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        node = core.read_node_status(hgx_node)
        resources = {**node.status.allocatable, "fabricdra.io/gpu": advertised}
        core.patch_node_status(
            hgx_node, {"status": {"capacity": resources, "allocatable": resources}}
        )
    ns, pod = _run_pod(control_plane, hgx_node, {"fabricdra.io/gpu": "1"})
    claims = _claims(control_plane, ns)
    if by_dra:
        [claim] = claims
        named = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        assert named == claim["metadata"]["name"]
    else:
        assert pod["status"].get("extendedResourceClaimStatus") is None
        assert claims == []


def test_every_class_answers_to_its_implicit_name(
    control_plane: ControlPlane,
    kube_scheduler: KubeScheduler,
    hgx_node: str,  # noqa: F811
) -> None:
    # deviceclass.resource.kubernetes.io/<class> needs no extendedResourceName on the class.
    ns, _ = _run_pod(
        control_plane, hgx_node, {"deviceclass.resource.kubernetes.io/rdma.fabricdra.io": "1"}
    )
    [claim] = _claims(control_plane, ns)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert _type(_devices(control_plane, hgx_node)[result["device"]]) == "rdma"
