"""Issue 28 point 6 against a real kube-apiserver 1.36 with the Workload API on (GenericWorkload,
GangScheduling, TopologyAwareWorkloadScheduling, DRAWorkloadResourceClaims and
`--runtime-config=scheduling.k8s.io/v1alpha2=true`): a ComputeDomain without numNodes whose pods
belong to a real PodGroup takes its gang size from the group's minCount and is placed where
the group's topology constraint (KEP-5732) can be kept. The controller runs as a non-admin
user bound to exactly rbac.CONTROLLER / CONTROLLER_NAMESPACED, so the new reads need their
rules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from e2e.harness.pytest_plugin import another_control_plane
from fabricdra.api.scaleout import TIER_LABELS
from fabricdra.controller import rbac, workloads
from fabricdra.controller.manager import Controller, ControllerConfig
from fabricdra.controller.objects import DaemonSettings
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    COMPUTE_DOMAINS,
    NODES,
    PODS,
    Kind,
    Rest,
)

from .computedomain_helpers import (
    condition,
    create_plugin_node,
    domain_body,
    install_crd,
    new_namespace,
    remove_new_objects,
    snapshot_objects,
    unique,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("own_objects_removed")]

GATES = (
    "GenericWorkload=true,GangScheduling=true,TopologyAwareWorkloadScheduling=true,"
    "DRAWorkloadResourceClaims=true"
)
RBAC_ROLES = Kind("rbac.authorization.k8s.io", "v1", "clusterroles", False)
RBAC_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False)
RBAC_NS_ROLES = Kind("rbac.authorization.k8s.io", "v1", "roles", True)
RBAC_NS_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "rolebindings", True)
TIER_1 = TIER_LABELS[0]


@pytest.fixture(scope="module")
def workload_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from another_control_plane(
        tmp_path_factory,
        "workload-api",
        f"--feature-gates={GATES}",
        "--runtime-config=scheduling.k8s.io/v1alpha2=true",
    )


@pytest.fixture(scope="module")
def rest(workload_cp: ControlPlane) -> Rest:
    r = Rest(workload_cp.api_client())
    install_crd(r)
    return r


@pytest.fixture
def own_objects_removed(workload_cp: ControlPlane, rest: Rest) -> Iterator[None]:
    """A test's racks and gang do not count in the next test's placement."""
    before = snapshot_objects(workload_cp)
    yield
    remove_new_objects(workload_cp, before)


def _controller(cp: ControlPlane, rest: Rest, **kw: Any) -> Controller:
    """The controller as a non-admin user with exactly the documented rules."""
    from kubernetes import config as kube_config

    user, driver_ns = unique("fabricdra-controller"), new_namespace(cp, "cd-system")
    rest.create(RBAC_ROLES, rbac.cluster_role(user, rbac.CONTROLLER))
    rest.create(RBAC_BINDINGS, rbac.binding_for_user(user, user, user))
    rest.create(RBAC_NS_ROLES, rbac.role(user, driver_ns, rbac.CONTROLLER_NAMESPACED), driver_ns)
    rest.create(
        RBAC_NS_BINDINGS, rbac.role_binding_for_user(user, driver_ns, user, user), driver_ns
    )
    api = kube_config.new_client_from_config(config_file=str(cp.kubeconfig_for(user, user)))
    cfg = ControllerConfig(
        namespace=driver_ns,
        daemon=DaemonSettings(namespace=driver_ns),
        resync_seconds=5.0,
        lease_name=unique("cd-wl"),
        leader_election=False,
        workload_api=workloads.served(Rest(api).call),
        **kw,
    )
    return Controller(api, cfg)


def _podgroup(name: str, min_count: int, key: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": spec,
    }


def _pod(name: str, group: str, template: str) -> dict[str, Any]:
    """A worker of the job: in PodGroup `group`, using the domain's channel claim template."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGroup": {"podGroupName": group},
            "containers": [
                {
                    "name": "w",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "ch"}]},
                }
            ],
            "resourceClaims": [{"name": "ch", "resourceClaimTemplateName": template}],
        },
    }


def _racks(cp: ControlPlane, rest: Rest, prefix: str) -> tuple[str, str]:
    """Two NVLink fabric domains. The first (sorts first) has 3 nodes under two tier-1
    switches (2 + 1), the second 4 (3 + 1). Best fit for a gang of 3 is the first (no node
    left over); only the second has 3 nodes under one tier-1 switch."""
    a, b = unique(f"0000{prefix}a"), unique(f"0000{prefix}b")
    for rack, switches in ((a, ["s1", "s1", "s2"]), (b, ["s3", "s3", "s3", "s4"])):
        for switch in switches:
            name = unique(prefix)
            create_plugin_node(cp, name, rack)
            rest.patch(NODES, name, {"metadata": {"labels": {TIER_1: f"{rack}-{switch}"}}})
    return a, b


def _status(rest: Rest, ns: str, name: str) -> dict[str, Any]:
    return dict(rest.get(COMPUTE_DOMAINS, name, ns).get("status") or {})


def test_the_api_server_serves_podgroups(workload_cp: ControlPlane, rest: Rest) -> None:
    assert workloads.served(rest.call)


def test_a_domain_without_numnodes_takes_its_gang_from_its_podgroup(
    workload_cp: ControlPlane, rest: Rest
) -> None:
    """No numNodes, three pods in PodGroup `job` (gang minCount 3): the domain is a gang of 3,
    recorded in status.podGroup, placed by best fit (the first rack) before its claim template
    exists. Before: a domain without numNodes was elastic, never placed."""
    ns = new_namespace(workload_cp, "wl-gang")
    first, _ = _racks(workload_cp, rest, "wlg")
    rest.create(workloads.PODGROUPS, _podgroup("job", 3), ns)
    controller = _controller(workload_cp, rest)
    controller.start()
    try:
        rest.create(COMPUTE_DOMAINS, domain_body("gang", mode="host"), ns)
        # No pod yet: the template waits for one to show its group (claims made from an
        # unplaced template could never follow the gang's placement).
        ready = wait_for(
            lambda: condition(rest.get(COMPUTE_DOMAINS, "gang", ns), "Ready"),
            what="the domain's Ready",
        )
        assert ready["reason"] == "WaitingForPods", ready
        assert rest.get_or_none(CLAIM_TEMPLATES, "gang-channel", ns) is None
        for i in range(3):
            rest.create(PODS, _pod(f"worker-{i}", "job", "gang-channel"), ns)
        status = wait_for(
            lambda: (s := _status(rest, ns, "gang")).get("fabricDomain") and s,
            what="the gang placed",
            timeout=60,
        )
        assert status["podGroup"] == {"name": "job", "minCount": 3, "topologyKey": ""}
        assert status["fabricDomain"] == first
        # Recorded first, then made from the record (records.py): the template follows.
        template = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, "gang-channel", ns),
            what="the claim template",
        )
        assert first in str(template["spec"])  # pinned to the placement
    finally:
        controller.stop()


def test_a_podgroup_topology_constraint_narrows_placement(
    workload_cp: ControlPlane, rest: Rest
) -> None:
    """The same gang with a KEP-5732 constraint on the tier-1 label: the first rack has no 3
    nodes under one tier-1 switch, so the gang goes to the second, where the scheduler can
    keep the constraint. Before: not a gang at all; counting whole racks it went to the first,
    where the scheduler could never place it."""
    ns = new_namespace(workload_cp, "wl-topo")
    _, second = _racks(workload_cp, rest, "wlt")
    rest.create(workloads.PODGROUPS, _podgroup("job", 3, TIER_1), ns)
    for i in range(3):  # the pods exist before the controller starts (a restart, say)
        rest.create(PODS, _pod(f"worker-{i}", "job", "gang-channel"), ns)
    rest.create(COMPUTE_DOMAINS, domain_body("gang", mode="host"), ns)
    controller = _controller(workload_cp, rest)
    controller.start()
    try:
        status = wait_for(
            lambda: (s := _status(rest, ns, "gang")).get("fabricDomain") and s,
            what="the gang placed",
            timeout=60,
        )
        assert status["podGroup"] == {"name": "job", "minCount": 3, "topologyKey": TIER_1}
        assert status["fabricDomain"] == second
    finally:
        controller.stop()


def test_a_domain_whose_pods_are_in_no_group_stays_elastic(
    workload_cp: ControlPlane, rest: Rest
) -> None:
    """Pods that name the domain's template but belong to no PodGroup: the domain is elastic
    as before (its template created, unpinned; no podGroup, no placement)."""
    ns = new_namespace(workload_cp, "wl-elastic")
    _racks(workload_cp, rest, "wle")
    controller = _controller(workload_cp, rest)
    controller.start()
    try:
        rest.create(COMPUTE_DOMAINS, domain_body("pool", mode="host"), ns)
        pod = _pod("alone", "unused", "pool-channel")
        del pod["spec"]["schedulingGroup"]
        rest.create(PODS, pod, ns)
        template = wait_for(
            lambda: rest.get_or_none(CLAIM_TEMPLATES, "pool-channel", ns),
            what="the claim template",
        )
        assert "fabricDomain ==" not in str(template["spec"])  # not pinned
        status = _status(rest, ns, "pool")
        assert "podGroup" not in status
        assert not status.get("fabricDomain")
    finally:
        controller.stop()


def test_a_claim_reserved_for_a_podgroup_links_to_its_pods_own_claims(
    workload_cp: ControlPlane, rest: Rest
) -> None:
    """KEP-5729 in the real API's shape: a claim whose status.reservedFor names a PodGroup
    (what the 1.36 API server stores with DRAWorkloadResourceClaims on) is read by prepare's
    NCCL widening as the group's, and linked to the own claim of a pod of that group, so both
    carry one NCCL_IB_HCA list (tests/unit/test_prepare.py has the widening itself)."""
    from fabricdra.kube.rest import CLAIMS
    from fabricdra.kubeletplugin.kinds.rdma import ncclenv

    ns = new_namespace(workload_cp, "wl-claims")
    group = rest.create(workloads.PODGROUPS, _podgroup("job", 2), ns)
    pod = rest.create(PODS, _pod("worker-0", "job", "unused"), ns)

    def reserved(name: str, entry: dict[str, Any]) -> dict[str, Any]:
        request = {"name": "nic", "exactly": {"deviceClassName": "rdma.fabricdra.io"}}
        claim = rest.create(
            CLAIMS, {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}, ns
        )
        result = {"request": "nic", "driver": "devices.fabricdra.io", "pool": "n", "device": name}
        status = {"allocation": {"devices": {"results": [result]}}, "reservedFor": [entry]}
        meta = {"resourceVersion": claim["metadata"]["resourceVersion"]}
        return rest.patch(CLAIMS, name, {"metadata": meta, "status": status}, ns, sub="status")

    shared = reserved(
        "shared",
        {
            "apiGroup": "scheduling.k8s.io",
            "resource": "podgroups",
            "name": "job",
            "uid": group["metadata"]["uid"],
        },
    )
    own = reserved("own", {"resource": "pods", "name": "worker-0", "uid": pod["metadata"]["uid"]})
    assert ncclenv.reserved_groups(shared) == [f"{ns}/job"]
    assert ncclenv.reserved_pods(shared) == []
    # prepare reads the pod for its group (spec.schedulingGroup.podGroupName, as stored)
    stored = rest.get(PODS, "worker-0", ns)
    groups = {"worker-0": workloads.group_name(stored)}
    assert groups == {"worker-0": "job"}
    assert ncclenv.linked(ncclenv.consumers(shared, {}), ncclenv.consumers(own, groups))
