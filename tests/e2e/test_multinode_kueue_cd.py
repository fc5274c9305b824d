"""A ComputeDomain follows the nodes Kueue assigned (issue 28 point 5), for real.

Kueue v0.17.0's manager (e2e/harness/kueue.py) with the Topology fabricdra publishes, the
compute-domain plugin as a process per node and `fabricdra controller` as a process (host IMEX
mode, as in test_multinode_computedomain.py, whose helpers this module reuses), on the
multi-node harness labelled as test_multinode_kueue.py labels it:

    node 0: spine-1 / leaf-a / nvl-a
    node 1: spine-1 / leaf-a / nvl-a
    node 2: spine-1 / leaf-b / nvl-b

A Kueue Job of 2 pods with `podset-required-topology: fabricdra.io/network.tier-1`, each pod
using the channel claim of a ComputeDomain with `numNodes: 2` annotated
`fabricdra.io/placed-by: kueue`: both pods run under leaf-a, on the nodes Kueue's Workload
assigned; the domain lists exactly those nodes, is Ready, and was never placed by the
controller: its claim template was made before any pod, unpinned (no status.fabricDomain),
and the fabric domain it records afterwards is the one of Kueue's nodes.

Then Kueue's replacement of a lost node: a one-pod Job under leaf-a (leaf-b's node filled by a
pod outside Kueue) with an elastic domain (no numNodes); its node dies (plugin killed, kubelet
stopped, Node removed, pod force-deleted as the pod GC would): the Job's new pod runs on
leaf-a's other node and the domain follows it: the old node leaves its status, the new one
joins, and it is Ready again. Runs last: it takes a node away for good.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.images import TEST_IMAGE
from e2e.harness.kueue import Kueue, create_objects
from e2e.harness.multinode import MultiNodeCluster
from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import CLAIM_TEMPLATES, COMPUTE_DOMAINS, PODS
from tests.e2e import test_multinode_computedomain as cdtest
from tests.e2e.test_multinode_kueue import (
    FLAVOR_LABEL,
    LAYOUT,
    QUEUE,
    QUEUE_LABEL,
    REQUIRED,
    TIER1,
    TIER2,
    _blocker,
    _millicpu,
    _wait_gone,
    kueue_objects,
    queue_active,
)
from tests.integration.computedomain_helpers import condition, domain_body

pytestmark = [pytest.mark.e2e, pytest.mark.multinode]

TIMEOUT = 180.0  # a loaded 2-core machine: Kueue admits, the KCM creates pods, kubelets run them


@dataclass
class Env:
    cd: cdtest.Env
    namespace: str
    millicpu: int

    @property
    def nodes(self) -> list[str]:
        return self.cd.names

    @property
    def cluster(self) -> MultiNodeCluster:  # what test_multinode_kueue's helpers read
        return self.cd.cluster

    def labels(self, node: str) -> tuple[str, str, str]:
        return LAYOUT[self.nodes.index(node)]


@pytest.fixture(scope="module")
def env(
    multi_node_cluster: MultiNodeCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Env]:
    cluster = multi_node_cluster
    cp = cluster.control_plane
    with cp.api_client() as api:
        core = client.CoreV1Api(api)
        for node, (tier2, tier1, _) in zip(cluster.nodes, LAYOUT, strict=True):
            labels = {TIER2: tier2, TIER1: tier1, FLAVOR_LABEL: "kueue"}
            core.patch_node(node.node_name, {"metadata": {"labels": labels}})
        allocatable = {
            _millicpu(core.read_node(n.node_name).status.allocatable["cpu"]) for n in cluster.nodes
        }
    assert len(allocatable) == 1, f"the harness's nodes differ in CPU: {allocatable}"
    tmp = tmp_path_factory.mktemp("cd-hosts")
    # open_env labels each node's NVLink domain (the plugin reads it at start).
    with cdtest.open_env(cluster, tmp, [domain for _, _, domain in LAYOUT]) as cde:
        kueue = Kueue(cp)
        kueue.start()
        try:
            namespace = f"kueue-cd-{uuid.uuid4().hex[:6]}"
            cp.create_namespace(namespace)
            create_objects(cp, kueue_objects(namespace))
            with cluster.api_client() as api:
                wait_for(lambda: queue_active(api), timeout=TIMEOUT, what="the ClusterQueue")
            ctl = cdtest._controller(cde, "kueue-cd")
            try:
                cdtest._wait_leading(cde, ctl)
                yield Env(cde, namespace, allocatable.pop())
            finally:
                ctl.stop()
        finally:
            kueue.stop()


def _domain(e: Env, name: str, num_nodes: int) -> dict[str, Any]:
    body = domain_body(name, rct=f"{name}-imex", mode="host", num_nodes=num_nodes)
    body["metadata"]["annotations"] = {cd.PLACED_BY: cd.PLACED_BY_KUEUE}
    e.cd.rest.create(COMPUTE_DOMAINS, body, e.namespace)
    wait_for(
        lambda: e.cd.rest.get_or_none(CLAIM_TEMPLATES, f"{name}-imex", e.namespace),
        timeout=TIMEOUT,
        what=f"{name}'s claim template",
    )
    obj: dict[str, Any] = wait_for(
        lambda: (
            (o := e.cd.rest.get(COMPUTE_DOMAINS, name, e.namespace))
            .get("status", {})
            .get("channels")
            and o
        ),
        timeout=TIMEOUT,
        what=f"{name}'s channel",
    )
    return obj


def _elastic_domain(e: Env, name: str) -> dict[str, Any]:
    e.cd.rest.create(
        COMPUTE_DOMAINS, domain_body(name, rct=f"{name}-imex", mode="host"), e.namespace
    )
    wait_for(
        lambda: e.cd.rest.get_or_none(CLAIM_TEMPLATES, f"{name}-imex", e.namespace),
        timeout=TIMEOUT,
        what=f"{name}'s claim template",
    )
    return e.cd.rest.get(COMPUTE_DOMAINS, name, e.namespace)


def _ready_on(e: Env, name: str, nodes: list[str]) -> dict[str, Any]:
    """The domain once Ready with exactly `nodes` in its status."""
    obj: dict[str, Any] = wait_for(
        lambda: (
            (o := e.cd.rest.get(COMPUTE_DOMAINS, name, e.namespace))
            and (condition(o, cd.READY) or {}).get("status") == "True"
            and sorted(r["name"] for r in o["status"].get("nodes", [])) == nodes
            and o
        ),
        timeout=TIMEOUT,
        what=f"{name} Ready on {nodes}",
    )
    return obj


def _job(e: Env, name: str, pods: int, share: float, template: str) -> None:
    """A Kueue Job of `pods` pods under one leaf switch, each asking for `share` of a node's
    CPU (what Kueue counts) and for the domain's channel through its claim template."""
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: QUEUE}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"annotations": {REQUIRED: TIER1}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "c",
                            "image": TEST_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", cdtest.SHOW],
                            "resources": {
                                "requests": {"cpu": f"{int(e.millicpu * share)}m"},
                                "claims": [{"name": "imex"}],
                            },
                        }
                    ],
                    "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": template}],
                },
            },
        },
    }
    with e.cd.cluster.api_client() as api:
        client.BatchV1Api(api).create_namespaced_job(e.namespace, body)


def _pods(e: Env, job: str) -> list[dict[str, Any]]:
    listed = e.cd.rest.list(PODS, e.namespace, label_selector=f"job-name={job}")
    return list(listed["items"])


def _running_nodes(e: Env, job: str, pods: int) -> list[str]:
    def running() -> list[str] | None:
        found = _pods(e, job)
        if len(found) != pods or any(p["status"].get("phase") != "Running" for p in found):
            return None
        return sorted(p["spec"]["nodeName"] for p in found)

    nodes: list[str] = wait_for(running, timeout=TIMEOUT, what=f"{pods} pods of {job} running")
    return nodes


def _assigned_nodes(e: Env, job: str) -> list[str]:
    """The nodes Kueue assigned the Job's pods: the hostname node selector it gave each pod
    when it lifted the pod's topology scheduling gate (its Workload's assignment is at the
    hostname level, the Topology's last)."""
    return sorted(
        p["spec"].get("nodeSelector", {}).get("kubernetes.io/hostname", "") for p in _pods(e, job)
    )


def _clean_up(e: Env, jobs: list[str], domains: list[str]) -> None:
    """The Jobs (pods gone) and then the domains, while the controller runs (finalizer)."""
    with e.cd.cluster.api_client() as api:
        for job in jobs:
            client.BatchV1Api(api).delete_namespaced_job(
                job, e.namespace, propagation_policy="Background"
            )
    for job in jobs:
        wait_for(lambda job=job: not _pods(e, job), timeout=TIMEOUT, what=f"{job}'s pods gone")
    for name in domains:
        e.cd.rest.delete(COMPUTE_DOMAINS, name, e.namespace)
    for name in domains:
        wait_for(
            lambda name=name: e.cd.rest.get_or_none(COMPUTE_DOMAINS, name, e.namespace) is None,
            timeout=TIMEOUT,
            what=f"{name} deleted",
        )


def test_domain_follows_the_nodes_kueue_assigned(env: Env) -> None:
    """Both pods (60 % of a node's CPU each: one per node) under leaf-a, as Kueue assigned
    them; the domain's nodes are exactly those, it is Ready, each pod sees its channel, and
    the controller never placed it (no fabric domain recorded before its pods ran)."""
    jobs, domains = ["kueue-gang"], ["kueue-cd"]
    try:
        obj = _domain(env, "kueue-cd", 2)
        channel = obj["status"]["channels"][0]
        assert not obj["status"].get("fabricDomain"), obj["status"]
        _job(env, "kueue-gang", 2, 0.6, "kueue-cd-imex")
        nodes = _running_nodes(env, "kueue-gang", 2)
        assert len(set(nodes)) == 2, nodes
        assert {env.labels(n)[1] for n in nodes} == {"leaf-a"}, nodes
        assert nodes == _assigned_nodes(env, "kueue-gang")

        ready: dict[str, Any] = wait_for(
            lambda: (
                (o := env.cd.rest.get(COMPUTE_DOMAINS, "kueue-cd", env.namespace))
                and (condition(o, cd.READY) or {}).get("status") == "True"
                and o
            ),
            timeout=TIMEOUT,
            what="kueue-cd Ready",
        )
        rows = ready["status"]["nodes"]
        assert sorted(r["name"] for r in rows) == nodes
        assert {r["fabricDomain"] for r in rows} == {"nvl-a"}
        # The fabric domain of its first admission, where Kueue put it (an elastic domain's
        # pin, records.py), not a placement of the controller's.
        assert ready["status"]["fabricDomain"] == "nvl-a", ready["status"]
        for node in nodes:  # held for it
            assert cdtest._owner(env.cd, node) == ready["metadata"]["uid"]
        for pod in _pods(env, "kueue-gang"):
            out = cdtest._pod_output(env.cd, env.namespace, pod["metadata"]["name"])
            assert out == [f"channel{channel}", f"CHANNEL={channel}", "DOMAIN=kueue-cd"], out
    finally:
        _clean_up(env, jobs, domains)


def test_domain_follows_kueues_replacement_of_a_lost_node(env: Env) -> None:
    jobs, domains = ["kueue-swap"], ["kueue-swap-cd"]
    blockers = [_blocker(env, "fills-leaf-b", env.nodes[2], share=0.6)]
    try:
        _elastic_domain(env, "kueue-swap-cd")
        _job(env, "kueue-swap", 1, 0.6, "kueue-swap-cd-imex")
        (dead,) = _running_nodes(env, "kueue-swap", 1)
        assert env.labels(dead)[1] == "leaf-a"
        (spare,) = [n for n in env.nodes[:2] if n != dead]
        _ready_on(env, "kueue-swap-cd", [dead])

        # As on a node that lost power, then removed from the cluster.
        env.cd.plugins[dead].kill()
        env.cluster.node(dead).stop_kubelet()
        with env.cluster.api_client() as api:
            core = client.CoreV1Api(api)
            core.delete_node(dead)
            for pod in _pods(env, "kueue-swap"):
                core.delete_namespaced_pod(
                    pod["metadata"]["name"], env.namespace, grace_period_seconds=0
                )

        def replaced() -> str | None:
            live = [
                p for p in _pods(env, "kueue-swap") if not p["metadata"].get("deletionTimestamp")
            ]
            running = [p["spec"]["nodeName"] for p in live if p["status"].get("phase") == "Running"]
            return running[0] if len(live) == 1 and running else None

        assert wait_for(replaced, timeout=TIMEOUT, what="the Job's pod running again") == spare
        assert _assigned_nodes(env, "kueue-swap") == [spare]
        obj = _ready_on(env, "kueue-swap-cd", [spare])  # the dead node left, the spare joined
        assert obj["status"]["fabricDomain"] == "nvl-a"
    finally:
        _clean_up(env, jobs, domains)
        for blocker in blockers:
            env.cd.rest.delete(PODS, blocker, env.namespace)
        for blocker in blockers:
            _wait_gone(env, blocker)
