"""Issue 29 point 3, the chart's admission policies against the real API server, for what RBAC
lets the node agent do beyond its own node:

- ResourceClaim status (RBAC: `resourceclaims/status` patch on every claim): only claims
  allocated on its own node, and there only its own devices' entries of `status.devices`
  (the network status it writes), never the allocation, `reservedFor` or another node's or
  driver's entries;
- verification pods (RBAC: pods and their logs in the release namespace): only literal env
  values, so no Secret or ConfigMap of the release namespace reaches a pod log the agent reads.

The agent is a pod-bound service-account token of the node agent's account, as in
test_chart_apiserver.py (the node is the one the API server authenticated)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness.controlplane import ControlPlane
from e2e.harness.helm import Chart
from e2e.harness.poll import wait_for
from e2e.harness.pytest_plugin import another_control_plane
from fabricdra.kube.rest import CLAIMS, ApiError, Rest
from fabricdra.kubeletplugin.verification.podrun import pod_manifest, pod_name

from .computedomain_helpers import write_allocation
from .test_chart_apiserver import Installed, _agent_on, _kubectl

pytestmark = pytest.mark.integration

DRIVER = "devices.fabricdra.io"
OTHER_DRIVER = "gpu.example.com"
IMAGE = "localhost/verification:e2e"


# Kubernetes 1.34/1.35 (the devices part runs there): no granular status authorization, so
# RBAC's `resourceclaims/status` patch reaches every claim's status and the policy is all that
# confines the agent. The 1.36 binary serving as 1.35 (compatibility versions, KEP-4330).
EMULATED_135 = "--emulated-version=1.35"


def _install(
    cp: ControlPlane, values: dict[str, Any], kube_version: str | None = None
) -> Installed:
    """The chart's objects applied in a fresh namespace (no kubelet: nothing runs), and two
    nodes."""
    suffix = uuid.uuid4().hex[:6]
    ns = f"fdra-agent-{suffix}"
    cp.create_namespace(ns)
    extra = {"kube_version": kube_version} if kube_version else {}
    manifests = Chart().render(values, namespace=ns, **extra)
    done = _kubectl(cp, "apply", "--server-side", "-f", "-", stdin=manifests)
    assert done.returncode == 0, done.stderr
    nodes = Installed(ns, f"agent-a-{suffix}", f"agent-b-{suffix}")
    cp.create_node(nodes.node_a)
    cp.create_node(nodes.node_b)
    return nodes


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane) -> Installed:
    """With a verification image: its pod policy exists only then."""
    return _install(control_plane, {"verification": {"image": IMAGE}})


@pytest.fixture(scope="module")
def cp_135(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from another_control_plane(tmp_path_factory, "emulated-135", EMULATED_135)


@pytest.fixture(scope="module")
def installed_135(cp_135: ControlPlane) -> Installed:
    # As installed on 1.35: the chart refuses ComputeDomains below 1.36.
    return _install(cp_135, {"computeDomains": {"enabled": False}}, "1.35.0")


def _claim_on(rest: Rest, ns: str, node: str, *, selector: bool = True) -> str:
    """A claim allocated one GPU of `node`'s pool and a device of another driver there, as
    kube-scheduler writes it."""
    name = f"c-{uuid.uuid4().hex[:6]}"
    requests = [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.fabricdra.io"}},
        {"name": "other", "exactly": {"deviceClassName": "other.example.com"}},
    ]
    rest.create(
        CLAIMS, {"metadata": {"name": name}, "spec": {"devices": {"requests": requests}}}, ns
    )
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"},
        {"request": "other", "driver": OTHER_DRIVER, "pool": node, "device": "gpu-0"},
    ]
    write_allocation(rest, ns, name, node if selector else None, {"results": results})
    return name


def _network_status(ns: str, name: str, pool: str, driver: str = DRIVER) -> dict[str, Any]:
    """What the agent applies (networkstatus.py): its device's entry of status.devices."""
    entry = {
        "driver": driver,
        "pool": pool,
        "device": "gpu-0",
        "networkData": {"interfaceName": "ib0", "ips": ["10.1.0.7/24"]},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "status": {"devices": [entry]},
    }


def _refused(call: Any) -> str:
    with pytest.raises(ApiError) as e:
        call()
    assert e.value.status == 403, e.value
    return e.value.message


def test_the_agent_writes_the_status_only_of_claims_on_its_own_node(
    cp_135: ControlPlane, installed_135: Installed
) -> None:
    control_plane, installed = cp_135, installed_135
    admin = Rest(control_plane.api_client())
    ns = f"tenant-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(ns)
    mine = _claim_on(admin, ns, installed.node_a)
    mine_by_pool = _claim_on(admin, ns, installed.node_a, selector=False)
    theirs = _claim_on(admin, ns, installed.node_b)
    with _agent_on(control_plane, installed, installed.node_a) as api:
        agent = Rest(api)

        def apply(name: str, pool: str, driver: str = DRIVER) -> Any:
            body = _network_status(ns, name, pool, driver)
            return agent.apply(CLAIMS, name, body, ns, field_manager=DRIVER, sub="status")

        # Another node's claim: refused (policies load a moment after they are created).
        def refused_now() -> str | None:
            try:
                apply(theirs, installed.node_b)
            except ApiError as e:
                return e.message if e.status == 403 else None
            return None

        why = wait_for(refused_now, what="the claim-status policy in force")
        assert "allocated on its own node" in why, why
        # (Writes before the policy loaded may have passed: judge a claim made after.)
        another = _claim_on(admin, ns, installed.node_b)
        assert "allocated on its own node" in _refused(lambda: apply(another, installed.node_b))
        assert not admin.get(CLAIMS, another, ns)["status"].get("devices")

        # Its own node's claims (by node selector, or by its pool alone): its entries pass.
        apply(mine, installed.node_a)
        apply(mine_by_pool, installed.node_a)
        got = admin.get(CLAIMS, mine, ns)["status"]["devices"]
        assert [(d["driver"], d["pool"]) for d in got] == [(DRIVER, installed.node_a)]

        # On its own node's claim: another driver's entry, the allocation and reservedFor stay
        # out of reach (another pool's entry is no allocated device: the API server refuses it).
        _refused(lambda: apply(mine, installed.node_a, OTHER_DRIVER))
        _refused(
            lambda: agent.patch(CLAIMS, mine, {"status": {"allocation": None}}, ns, sub="status")
        )
        consumer = {"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}
        _refused(
            lambda: agent.patch(
                CLAIMS, mine, {"status": {"reservedFor": [consumer]}}, ns, sub="status"
            )
        )
        assert admin.get(CLAIMS, mine, ns)["status"]["allocation"]


def _pod(installed: Installed, **container: Any) -> dict[str, Any]:
    """The agent's own verification pod (podrun.py), its container given `container`."""
    name = pod_name(installed.node_a)
    pod = pod_manifest(name, installed.namespace, installed.node_a, IMAGE, "true", 60)
    pod["spec"]["containers"][0].update(container)
    return pod


def test_a_verification_pod_gets_no_secret_or_config_map_through_its_env(
    control_plane: ControlPlane, installed: Installed
) -> None:
    with control_plane.api_client() as admin:
        client.CoreV1Api(admin).create_namespaced_secret(
            installed.namespace,
            {"metadata": {"name": "release-secret"}, "stringData": {"token": "s3cret"}},
        )
    with _agent_on(control_plane, installed, installed.node_a) as api:
        core = client.CoreV1Api(api)

        def create(pod: dict[str, Any]) -> Any:
            return core.create_namespaced_pod(installed.namespace, pod, dry_run="All")

        secret_ref = {"secretKeyRef": {"name": "release-secret", "key": "token"}}
        config_ref = {"configMapKeyRef": {"name": "kube-root-ca.crt", "key": "ca.crt"}}
        refused = [
            {"envFrom": [{"secretRef": {"name": "release-secret"}}]},
            {"envFrom": [{"configMapRef": {"name": "kube-root-ca.crt"}}]},
            {"env": [{"name": "T", "valueFrom": secret_ref}]},
            {"env": [{"name": "C", "valueFrom": config_ref}]},
        ]

        def denied(pod: dict[str, Any]) -> str | None:
            try:
                create(pod)
            except ApiException as e:
                return str(e.body) if e.status == 403 else None
            return None

        # The policy loads a moment after it is created.
        why = wait_for(lambda: denied(_pod(installed, **refused[0])), what="the pod policy")
        assert "only literal env values" in why, why
        for container in refused[1:]:
            body = denied(_pod(installed, **container))
            assert body is not None, container
            assert "only literal env values" in body, body
        # The agent's own pod as it makes it (literal env values) passes.
        create(_pod(installed))


def test_on_136_the_api_server_itself_refuses_another_nodes_claim_status(
    control_plane: ControlPlane, installed: Installed
) -> None:
    """1.36's granular status authorization (`resourceclaims/driver` associated-node, and
    `resourceclaims/binding` for the allocation) refuses these writes before any admission
    policy is asked: the policy is what holds on 1.34/1.35."""
    admin = Rest(control_plane.api_client())
    ns = f"tenant-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(ns)
    theirs = _claim_on(admin, ns, installed.node_b)
    with _agent_on(control_plane, installed, installed.node_a) as api:
        agent = Rest(api)
        body = _network_status(ns, theirs, installed.node_b)
        with pytest.raises(ApiError) as e:
            agent.apply(CLAIMS, theirs, body, ns, field_manager=DRIVER, sub="status")
        assert "resourceclaims/driver" in e.value.message, e.value
        with pytest.raises(ApiError) as e:
            agent.patch(CLAIMS, theirs, {"status": {"allocation": None}}, ns, sub="status")
        assert "resourceclaims/binding" in e.value.message, e.value
