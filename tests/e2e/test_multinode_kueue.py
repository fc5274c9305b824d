"""Kueue's topology-aware scheduling on fabricdra's labels, for real (issue 28 point 5).

Kueue's manager (built from its Go module, e2e/harness/kueue.py) runs against the multi-node
harness: real kube-scheduler, KCM (the Job controller) and three kubelets. Its `Topology` is the
one fabricdra publishes for Kueue (fabricdra.api.kueue.topology_object): tier-2 switch, tier-1
switch, NVLink domain, node. The nodes are labelled as the controller and node agent would:

    node 0: spine-1 / leaf-a / nvl-a
    node 1: spine-1 / leaf-a / nvl-a
    node 2: spine-1 / leaf-b / nvl-b

Pods ask only for CPU (what Kueue counts; it does not count DRA devices, kueue#10548), sized
from the nodes' allocatable CPU so that a node holds exactly one (60 %) or two (40 %) of them.

- a Job of 2 with `podset-required-topology: fabricdra.io/network.tier-1` runs both pods under
  leaf-a (kube-scheduler alone spreads them; Kueue's node selectors keep them under one switch);
- a Job of 3 with the same annotation waits whole (3 free nodes, but no switch has 3): its Job
  stays suspended, no pod is created, and its Workload says why;
- a Job of 4 in slices of 2 (`podset-slice-required-topology: fabricdra.io/fabric.domain`,
  `podset-slice-size: 2`) with one of nvl-a's four places taken by another pod lands two pods
  in each NVLink domain; with one of nvl-b's two taken as well, 5 places are free but no
  second domain holds a slice: the Job waits whole (without the slice annotations Kueue admits
  it: 4 pods fit);
- a one-pod Job under leaf-a whose node is lost runs again on leaf-a's other node, and Kueue
  never evicts its workload.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness.controlplane import wait_for
from e2e.harness.images import TEST_IMAGE
from e2e.harness.kueue import API_GROUP, API_VERSION, METRICS_CERT_DIR, Kueue, create_objects
from e2e.harness.multinode import MultiNodeCluster
from fabricdra.api.kueue import topology_object
from fabricdra.api.labels import FABRIC_DOMAIN
from fabricdra.api.scaleout import TIER_LABELS

pytestmark = [pytest.mark.e2e, pytest.mark.multinode]

TIER1, TIER2 = TIER_LABELS[0], TIER_LABELS[1]
LAYOUT = [  # per node: tier-2, tier-1, NVLink domain
    ("spine-1", "leaf-a", "nvl-a"),
    ("spine-1", "leaf-a", "nvl-a"),
    ("spine-1", "leaf-b", "nvl-b"),
]
QUEUE = "fabric-jobs"
FLAVOR_LABEL = "e2e.fabricdra.io/flavor"  # the ResourceFlavor's nodes (test-only, not published)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
TIMEOUT = 180.0  # a loaded 2-core machine: Kueue admits, the KCM creates pods, kubelets run them


@dataclass
class Env:
    cluster: MultiNodeCluster
    kueue: Kueue
    namespace: str
    millicpu: int  # each node's allocatable CPU, in millicores

    @property
    def nodes(self) -> list[str]:
        return [n.node_name for n in self.cluster.nodes]

    def labels(self, node: str) -> tuple[str, str, str]:
        return LAYOUT[self.nodes.index(node)]


def kueue_objects(namespace: str) -> list[dict[str, Any]]:
    """The Topology, a flavor over the test's nodes, a ClusterQueue with CPU quota and the
    namespace's LocalQueue."""
    return [
        topology_object("fabric"),
        {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "ResourceFlavor",
            "metadata": {"name": "fabric-nodes"},
            "spec": {"nodeLabels": {FLAVOR_LABEL: "kueue"}, "topologyName": "fabric"},
        },
        {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "ClusterQueue",
            "metadata": {"name": "fabric"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {
                                "name": "fabric-nodes",
                                "resources": [{"name": "cpu", "nominalQuota": "100"}],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": "fabric"},
        },
    ]


@pytest.fixture(scope="module")
def env(multi_node_cluster: MultiNodeCluster) -> Iterator[Env]:
    cluster = multi_node_cluster
    cp = cluster.control_plane
    with cp.api_client() as api:
        core = client.CoreV1Api(api)
        for node, (tier2, tier1, domain) in zip(cluster.nodes, LAYOUT, strict=True):
            labels = {TIER2: tier2, TIER1: tier1, FABRIC_DOMAIN: domain, FLAVOR_LABEL: "kueue"}
            core.patch_node(node.node_name, {"metadata": {"labels": labels}})
        allocatable = {
            _millicpu(core.read_node(n.node_name).status.allocatable["cpu"]) for n in cluster.nodes
        }
    assert len(allocatable) == 1, f"the harness's nodes differ in CPU: {allocatable}"
    kueue = Kueue(cp)
    made_dirs = [p for p in (METRICS_CERT_DIR, *METRICS_CERT_DIR.parents) if not p.exists()]
    kueue.start()
    namespace = f"kueue-{uuid.uuid4().hex[:6]}"
    cp.create_namespace(namespace)
    create_objects(cp, kueue_objects(namespace))
    e = Env(cluster, kueue, namespace, allocatable.pop())
    with e.cluster.api_client() as api:
        wait_for(lambda: queue_active(api), timeout=TIMEOUT, what="the ClusterQueue Active")
    try:
        yield e
    finally:
        kueue.stop()
    # The metrics certificate Kueue insists on (a fixed host path) leaves with it, and so do
    # the folders the harness made for it.
    assert not (METRICS_CERT_DIR / "tls.key").exists()
    assert not any(p.exists() for p in made_dirs), made_dirs


def _millicpu(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def queue_active(api: Any) -> bool:
    cq = client.CustomObjectsApi(api).get_cluster_custom_object(
        API_GROUP, API_VERSION, "clusterqueues", "fabric"
    )
    conditions = {c["type"]: c["status"] for c in cq.get("status", {}).get("conditions", [])}
    return conditions.get("Active") == "True"


def _job(e: Env, name: str, pods: int, share: float, annotations: dict[str, str]) -> None:
    """A Job of `pods` pods in the queue, each asking for `share` of a node's CPU."""
    cpu = f"{int(e.millicpu * share)}m"
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: QUEUE}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "c",
                            "image": TEST_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                            "resources": {"requests": {"cpu": cpu}},
                        }
                    ],
                },
            },
        },
    }
    with e.cluster.api_client() as api:
        client.BatchV1Api(api).create_namespaced_job(e.namespace, body)


def _pods(e: Env, job: str) -> list[Any]:
    with e.cluster.api_client() as api:
        return list(
            client.CoreV1Api(api)
            .list_namespaced_pod(e.namespace, label_selector=f"job-name={job}")
            .items
        )


def _running_nodes(e: Env, job: str, pods: int) -> list[str]:
    """The nodes of the Job's pods once all `pods` run."""

    def running() -> list[str] | None:
        found = _pods(e, job)
        if len(found) != pods or any(p.status.phase != "Running" for p in found):
            return None
        return sorted(p.spec.node_name for p in found)

    nodes: list[str] = wait_for(running, timeout=TIMEOUT, what=f"{pods} pods of {job} running")
    return nodes


def _workload(e: Env, job: str) -> dict[str, Any] | None:
    with e.cluster.api_client() as api:
        listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
            API_GROUP, API_VERSION, e.namespace, "workloads"
        )
    for wl in listed["items"]:
        owners = wl["metadata"].get("ownerReferences", [])
        if any(o["kind"] == "Job" and o["name"] == job for o in owners):
            return dict(wl)
    return None


def _delete_job(e: Env, job: str) -> None:
    with e.cluster.api_client() as api:
        try:
            client.BatchV1Api(api).delete_namespaced_job(
                job, e.namespace, propagation_policy="Background"
            )
        except ApiException as err:
            if err.status != 404:
                raise
    # Its places are free again only once its pods are gone (Kueue and kube-scheduler both
    # count pods still on a node).
    wait_for(lambda: not _pods(e, job), timeout=TIMEOUT, what=f"{job}'s pods gone")


@pytest.fixture
def jobs(env: Env) -> Iterator[list[str]]:
    """Names of the Jobs a test made, deleted after it (pods gone) whatever its outcome."""
    made: list[str] = []
    yield made
    for job in made:
        _delete_job(env, job)


def test_required_tier1_job_lands_under_one_switch(env: Env, jobs: list[str]) -> None:
    jobs.append("under-one-leaf")
    _job(env, "under-one-leaf", 2, 0.6, {REQUIRED: TIER1})
    nodes = _running_nodes(env, "under-one-leaf", 2)
    assert len(set(nodes)) == 2  # one pod per node: each asks for 60 % of one
    assert {env.labels(n)[1] for n in nodes} == {"leaf-a"}, nodes
    # Kueue's record of the placement: both pods in leaf-a's domains, by node.
    wl = _workload(env, "under-one-leaf")
    assert wl is not None
    assignment = wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert assignment["levels"] == ["kubernetes.io/hostname"], assignment


def test_required_tier1_job_larger_than_any_switch_waits_whole(env: Env, jobs: list[str]) -> None:
    """Three nodes are free, but no leaf switch has three: nothing starts."""
    jobs.append("too-big-for-a-leaf")
    _job(env, "too-big-for-a-leaf", 3, 0.6, {REQUIRED: TIER1})

    message = wait_for(
        lambda: _pending_reason(env, "too-big-for-a-leaf"),
        timeout=TIMEOUT,
        what="the Workload pending",
    )
    assert "topology" in message.lower() or "fit" in message.lower(), message
    with env.cluster.api_client() as api:
        job = client.BatchV1Api(api).read_namespaced_job("too-big-for-a-leaf", env.namespace)
    assert job.spec.suspend is True
    assert _pods(env, "too-big-for-a-leaf") == []
    wl = _workload(env, "too-big-for-a-leaf")
    assert wl is not None
    assert not wl["status"].get("admission")


def test_slices_stay_inside_nvlink_domains(env: Env, jobs: list[str]) -> None:
    """Two places per node (40 % each), some taken by pods outside Kueue (Kueue counts them).

    With one of node 0's places taken (nvl-a 3 free, nvl-b 2), 4 pods in slices of 2 run two
    in each domain. With one of node 2's taken too (nvl-a 3 free, nvl-b 1), 5 places are free
    and 4 pods would fit, but two slices of 2 do not (nvl-a holds one, nvl-b none): the Job
    waits whole."""
    slices = {REQUIRED: TIER2, SLICE_REQUIRED: FABRIC_DOMAIN, SLICE_SIZE: "2"}
    blockers: list[str] = []
    try:
        blockers.append(_blocker(env, "holds-a-place-0", env.nodes[0]))
        jobs.append("in-slices")
        _job(env, "in-slices", 4, 0.4, slices)
        nodes = _running_nodes(env, "in-slices", 4)
        assert Counter(env.labels(n)[2] for n in nodes) == {"nvl-a": 2, "nvl-b": 2}, nodes
        _delete_job(env, "in-slices")

        blockers.append(_blocker(env, "holds-a-place-2", env.nodes[2]))
        jobs.append("slices-do-not-fit")
        _job(env, "slices-do-not-fit", 4, 0.4, slices)
        message = wait_for(
            lambda: _pending_reason(env, "slices-do-not-fit"),
            timeout=TIMEOUT,
            what="the Workload pending",
        )
        assert "fit" in message.lower(), message
        assert _pods(env, "slices-do-not-fit") == []
    finally:
        for job in jobs:  # first: a waiting Job would start once the blockers are gone
            _delete_job(env, job)
        for blocker in blockers:
            with env.cluster.api_client() as api:
                client.CoreV1Api(api).delete_namespaced_pod(blocker, env.namespace)
        for blocker in blockers:
            _wait_gone(env, blocker)


def test_lost_node_pod_runs_again_under_the_same_switch(env: Env, jobs: list[str]) -> None:
    """A one-pod Job held to one leaf switch runs on a leaf-a node; that node is lost (kubelet
    stopped, Node removed, its pod force-deleted as the pod GC would): the Job's new pod runs
    on leaf-a's other node, and Kueue never evicted the workload. (Checked by hand: the same
    happens with Kueue's node-replacement gates off, `TASFailedNodeReplacement` and its
    three companions, so this proves the outcome, not which Kueue mechanism gives it.) Runs
    last in this module: it takes a node away for good."""
    # leaf-b's only node keeps 40 % free: the Job's 60 % pod fits only under leaf-a.
    blockers = [_blocker(env, "fills-leaf-b", env.nodes[2], share=0.6)]
    try:
        jobs.append("survives-a-node")
        _job(env, "survives-a-node", 1, 0.6, {REQUIRED: TIER1})
        (dead,) = _running_nodes(env, "survives-a-node", 1)
        assert env.labels(dead)[1] == "leaf-a"
        (spare,) = [n for n in env.nodes[:2] if n != dead]

        env.cluster.node(dead).stop_kubelet()
        with env.cluster.api_client() as api:
            core = client.CoreV1Api(api)
            core.delete_node(dead)
            for pod in _pods(env, "survives-a-node"):
                core.delete_namespaced_pod(pod.metadata.name, env.namespace, grace_period_seconds=0)

        def replaced() -> str | None:
            # The dead pod lingers, deleted, until the Job controller drops its finalizer.
            live = [p for p in _pods(env, "survives-a-node") if not p.metadata.deletion_timestamp]
            running = [p.spec.node_name for p in live if p.status.phase == "Running"]
            return running[0] if len(live) == 1 and running else None

        assert wait_for(replaced, timeout=TIMEOUT, what="the Job's pod running again") == spare
        # Kueue kept the workload admitted throughout: no eviction, no requeue.
        wl = _workload(env, "survives-a-node")
        assert wl is not None
        assert not wl["status"].get("schedulingStats", {}).get("evictions"), wl["status"]
    finally:
        for job in jobs:
            _delete_job(env, job)
        for blocker in blockers:
            with env.cluster.api_client() as api:
                client.CoreV1Api(api).delete_namespaced_pod(blocker, env.namespace)
        for blocker in blockers:
            _wait_gone(env, blocker)


def _wait_gone(e: Env, pod: str) -> None:
    wait_for(lambda: _phase(e, pod) is None, timeout=TIMEOUT, what=f"{pod} gone")


def _blocker(e: Env, name: str, node: str, share: float = 0.4) -> str:
    """A pod outside Kueue, bound to `node`, asking for `share` of its CPU; once running."""
    with e.cluster.api_client() as api:
        client.CoreV1Api(api).create_namespaced_pod(
            e.namespace,
            {
                "metadata": {"name": name},
                "spec": {
                    "nodeName": node,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "c",
                            "image": TEST_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                            "resources": {"requests": {"cpu": f"{int(e.millicpu * share)}m"}},
                        }
                    ],
                },
            },
        )
    wait_for(lambda: _phase(e, name) == "Running", timeout=TIMEOUT, what=f"{name} running")
    return name


def _pending_reason(e: Env, job: str) -> str | None:
    """Why Kueue has not admitted the Job's Workload (QuotaReserved False), once it says."""
    wl = _workload(e, job)
    if wl is None:
        return None
    for c in wl.get("status", {}).get("conditions", []):
        if c["type"] == "QuotaReserved" and c["status"] == "False" and c.get("message"):
            return str(c["message"])
    return None


def _phase(e: Env, pod: str) -> str | None:
    with e.cluster.api_client() as api:
        try:
            found = client.CoreV1Api(api).read_namespaced_pod(pod, e.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
    return str(found.status.phase)
