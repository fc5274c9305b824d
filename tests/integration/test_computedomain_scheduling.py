"""One ComputeDomain per node, as the real kube-scheduler sees it (fake Nodes; the controller
publishes their compute-domain ResourceSlices)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.controller.objects import slice_name
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    COMPUTE_DOMAINS,
    EVENTS,
    NODES,
    PODS,
    SLICES,
    Rest,
)

from .computedomain_helpers import (
    condition,
    create_plugin_node,
    domain_body,
    give_addresses,
    install_crd,
    report_daemon,
    running_controller,
    unique,
    wait_gone,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("leaves_nothing_behind")]


def _pod(name: str, template: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "cd-test"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/none",
                    "resources": {"claims": [{"name": "imex"}]},
                }
            ],
            "resourceClaims": [{"name": "imex", "resourceClaimTemplateName": template}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def _node_of(rest: Rest, ns: str, pod: str) -> str | None:
    return rest.get(PODS, pod, ns).get("spec", {}).get("nodeName")


def _unschedulable(rest: Rest, ns: str, pod: str) -> str | None:
    for c in rest.get(PODS, pod, ns).get("status", {}).get("conditions", []) or []:
        if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
    return None


def test_one_domain_per_node(
    control_plane: ControlPlane, kube_scheduler: Any, kube_controller_manager: Any
) -> None:
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, driver_ns = unique("cd-sched"), unique("cd-system")
    control_plane.create_namespace(ns)
    node = unique("nvl-node")
    create_plugin_node(control_plane, node, fabric="clique-a")
    with running_controller(control_plane, driver_ns):
        wait_for(lambda: rest.get_or_none(SLICES, slice_name(node)), what="node slice")
        rest.create(COMPUTE_DOMAINS, domain_body("alpha", rct="alpha-imex"), ns)
        rest.create(COMPUTE_DOMAINS, domain_body("beta", rct="beta-imex"), ns)
        alpha = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "alpha", ns)).get("status", {}).get("channels")
                and o
            ),
            what="alpha",
        )
        beta = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "beta", ns)).get("status", {}).get("channels") and o
            ),
            what="beta",
        )
        assert alpha["status"]["channels"] != beta["status"]["channels"]

        # Two pods of one domain share the node, each with its own claim from the template.
        # Pinned to this test's node: other tests' plugin nodes share the control plane.
        rest.create(PODS, _pinned_pod("alpha-0", "alpha-imex", node), ns)
        rest.create(PODS, _pinned_pod("alpha-1", "alpha-imex", node), ns)
        wait_for(lambda: _node_of(rest, ns, "alpha-0") == node, what="alpha-0 bound", timeout=60)
        wait_for(lambda: _node_of(rest, ns, "alpha-1") == node, what="alpha-1 bound", timeout=60)

        # The node now says who holds it, to the scheduler (slice) and to people (label).
        uid = alpha["metadata"]["uid"]
        sl = rest.get(SLICES, slice_name(node))
        channel = next(d for d in sl["spec"]["devices"] if d["name"] == cd.CHANNEL_DEVICE)
        assert channel["attributes"][cd.ATTR_OWNER] == {"string": uid}
        assert rest.get(NODES, node)["metadata"]["labels"][cd.DOMAIN_LABEL] == uid

        # A pod of the second domain stays Pending, unschedulable: never ContainerCreating.
        rest.create(PODS, _pinned_pod("beta-0", "beta-imex", node), ns)
        message = wait_for(
            lambda: _unschedulable(rest, ns, "beta-0"), what="beta-0 unschedulable", timeout=60
        )
        assert "cannot allocate all claims" in message
        assert _node_of(rest, ns, "beta-0") is None

        # alpha's status lists the node; its daemon's report makes it Ready.
        row = wait_for(
            lambda: (
                rest.get(COMPUTE_DOMAINS, "alpha", ns).get("status", {}).get("nodes") or [None]
            )[0],
            what="node row",
        )
        assert (row["name"], row["fabricDomain"], row["index"]) == (node, "clique-a", 0)
        give_addresses(control_plane, node, "10.0.0.7")  # a report names its Node's own IP
        report_daemon(rest, driver_ns, uid, node, ready=True, ip="10.0.0.7")
        done = wait_for(
            lambda: (
                (o := rest.get(COMPUTE_DOMAINS, "alpha", ns))
                and (condition(o, cd.READY) or {}).get("status") == "True"
                and o
            ),
            what="alpha Ready",
        )
        assert done["status"]["nodes"][0]["ipAddress"] == "10.0.0.7"
        assert done["status"]["fabricDomain"] == "clique-a"
        # An IMEX failure surfaces as Degraded with the daemon's words.
        report_daemon(rest, driver_ns, uid, node, ready=False, message="nvidia-imex exited: 1")
        degraded = wait_for(
            lambda: (
                (c := condition(rest.get(COMPUTE_DOMAINS, "alpha", ns), cd.DEGRADED))
                and c["status"] == "True"
                and c
            ),
            what="Degraded",
        )
        assert "nvidia-imex exited" in degraded["message"]

        # Once alpha's pods are gone the node is free again and beta's pod lands there.
        for pod in ("alpha-0", "alpha-1"):
            rest.delete(PODS, pod, ns)
        wait_for(lambda: _node_of(rest, ns, "beta-0") == node, what="beta-0 bound", timeout=90)
        assert (
            rest.get(NODES, node)["metadata"]["labels"][cd.DOMAIN_LABEL] == beta["metadata"]["uid"]
        )

        rest.delete(PODS, "beta-0", ns)
        for name in ("alpha", "beta"):
            rest.delete(COMPUTE_DOMAINS, name, ns)
        for name in ("alpha", "beta"):
            wait_gone(
                lambda name=name: rest.get_or_none(COMPUTE_DOMAINS, name, ns),
                f"{name} deleted",
                timeout=60,
            )


def _pinned_pod(name: str, template: str, node: str) -> dict[str, Any]:
    pod = _pod(name, template)
    # By name (fake nodes carry no hostname label): the scheduler still decides, on one node.
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    return pod


def test_simultaneous_domains_on_a_free_node_and_fabric_boundaries(
    control_plane: ControlPlane, kube_scheduler: Any, kube_controller_manager: Any
) -> None:
    """Pods of two domains created in the same instant for one free node: exactly one domain
    gets it (binding conditions: the loser's allocation is dropped, its pod stays Pending).
    Then a pod of the winner pinned to a node of another NVLink fabric domain stays Pending
    (Unschedulable): once pinned, the winner's template selects only its fabric domain.
    (The refusal at binding time of a claim made before the pin is covered by
    test_computedomain_decisions.py::test_fabric_conflict_reaches_status.)"""
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, driver_ns = unique("cd-race"), unique("cd-system")
    control_plane.create_namespace(ns)
    node, far = unique("rack1-n"), unique("rack2-n")
    create_plugin_node(control_plane, node, fabric="rack-1")
    create_plugin_node(control_plane, far, fabric="rack-2")
    for n in (node, far):
        rest.patch(NODES, n, {"metadata": {"labels": {"kubernetes.io/hostname": n}}})
    with running_controller(control_plane, driver_ns):
        for n in (node, far):
            wait_for(lambda n=n: rest.get_or_none(SLICES, slice_name(n)), what="slice")
        for name in ("red", "blue"):
            rest.create(COMPUTE_DOMAINS, domain_body(name, rct=f"{name}-imex"), ns)
        for name in ("red", "blue"):
            wait_for(
                lambda name=name: (
                    rest.get(COMPUTE_DOMAINS, name, ns).get("status", {}).get("channels")
                ),
                what=f"{name} has a channel",
            )
        for name in ("red", "blue"):
            wait_for(
                lambda name=name: rest.get_or_none(CLAIM_TEMPLATES, f"{name}-imex", ns),
                what="template",
            )
        for i in range(2):
            rest.create(PODS, _pinned_pod(f"red-{i}", "red-imex", node), ns)
            rest.create(PODS, _pinned_pod(f"blue-{i}", "blue-imex", node), ns)

        def settled() -> tuple[str, str] | None:
            bound = {p: _node_of(rest, ns, p) for p in ("red-0", "red-1", "blue-0", "blue-1")}
            red = bound["red-0"] and bound["red-1"]
            blue = bound["blue-0"] and bound["blue-1"]
            if red and not (bound["blue-0"] or bound["blue-1"]):
                return "red", "blue"
            if blue and not (bound["red-0"] or bound["red-1"]):
                return "blue", "red"
            assert not (red and blue), f"two domains on one node: {bound}"
            return None

        winner, loser = wait_for(settled, what="one domain holds the node", timeout=90)
        wait_for(lambda: _unschedulable(rest, ns, f"{loser}-0"), what="loser unschedulable")
        time.sleep(3)  # and it stays that way
        assert _node_of(rest, ns, f"{loser}-0") is None
        assert _node_of(rest, ns, f"{loser}-1") is None

        # The winner's domain is now in rack-1: its template selects only rack-1 nodes, so a
        # pod of it pinned to rack-2 stays quietly Pending (it is never placed there to fail
        # binding over and over), and says why.
        wait_for(
            lambda: (
                "fabricDomain == 'rack-1'"
                in str(rest.get(CLAIM_TEMPLATES, f"{winner}-imex", ns)["spec"]["spec"])
            ),
            what="template pinned to rack-1",
        )
        rest.create(PODS, _pinned_pod(f"{winner}-far", f"{winner}-imex", far), ns)
        uid = rest.get(COMPUTE_DOMAINS, winner, ns)["metadata"]["uid"]
        wait_for(lambda: _unschedulable(rest, ns, f"{winner}-far"), what="far pod unschedulable")
        time.sleep(2)
        assert _node_of(rest, ns, f"{winner}-far") is None
        assert not any(
            e["reason"] == "NodeConflict"
            for e in rest.list(EVENTS, ns)["items"]
            if e["involvedObject"].get("uid") == uid
        ), "the pod reached binding on another fabric"
        assert rest.get(COMPUTE_DOMAINS, winner, ns)["status"]["fabricDomain"] == "rack-1"

        for p in ("red-0", "red-1", "blue-0", "blue-1", f"{winner}-far"):
            rest.delete(PODS, p, ns)
        for name in ("red", "blue"):
            rest.delete(COMPUTE_DOMAINS, name, ns)
        for name in ("red", "blue"):
            wait_gone(
                lambda name=name: rest.get_or_none(COMPUTE_DOMAINS, name, ns),
                f"{name} deleted",
                timeout=60,
            )


def _job_pod(name: str, template: str, job: str) -> dict[str, Any]:
    """A pod of a multi-node job as users write it: kept in one NVLink fabric domain by
    podAffinity, one per node by anti-affinity."""
    pod = _pod(name, template)
    pod["metadata"]["labels"] = {"job": job}
    same_job = {"matchLabels": {"job": job}}
    pod["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": same_job, "topologyKey": "fabricdra.io/fabric.domain"}
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": same_job, "topologyKey": "kubernetes.io/hostname"}
            ]
        },
    }
    return pod


def _pinned_fabric(rest: Rest, ns: str, template: str) -> str | None:
    spec = str(rest.get(CLAIM_TEMPLATES, template, ns)["spec"]["spec"])
    match = re.search(r"fabricDomain == '([^']*)'", spec)
    return match.group(1) if match else None


def test_two_gangs_are_placed_in_separate_fabric_domains_before_their_pods_schedule(
    control_plane: ControlPlane, kube_scheduler: Any, kube_controller_manager: Any
) -> None:
    """Issue 11 (gangs at scale): two fabric domains of 2 free nodes, two jobs of numNodes=2
    created at once. With the scheduler alone deciding, both jobs' first pods could land in
    one fabric domain and split it: neither reaches 2 nodes, both wait at binding until the
    gang timeout, and may pile up again (bench/scale.py, 200 nodes: 8 of 10 Ready after
    900 s). Now each gang is placed in a fabric domain with room before its claim template
    exists, so the two templates select different fabric domains and all four pods bind,
    each job inside its own."""
    rest = Rest(control_plane.api_client())
    install_crd(rest)
    ns, driver_ns = unique("cd-gangs"), unique("cd-system")
    control_plane.create_namespace(ns)
    # Fabric names that sort first: placement is first fit in name order, and other tests'
    # fabric domains share this API server.
    racks = [unique("0gang"), unique("0gang")]
    nodes = {rack: [unique("gn"), unique("gn")] for rack in racks}
    for rack, names in nodes.items():
        for n in names:
            create_plugin_node(control_plane, n, fabric=rack)
            rest.patch(NODES, n, {"metadata": {"labels": {"kubernetes.io/hostname": n}}})
    jobs = ("east", "west")
    with running_controller(control_plane, driver_ns):
        for names in nodes.values():
            for n in names:
                wait_for(lambda n=n: rest.get_or_none(SLICES, slice_name(n)), what="slice")
        for job in jobs:
            rest.create(
                COMPUTE_DOMAINS, domain_body(job, rct=f"{job}-imex", mode="host", num_nodes=2), ns
            )
        for job in jobs:
            wait_for(
                lambda job=job: rest.get_or_none(CLAIM_TEMPLATES, f"{job}-imex", ns),
                what=f"{job} template",
            )
        # Placed before any pod exists: each template selects one fabric domain, not the same.
        placed = {job: _pinned_fabric(rest, ns, f"{job}-imex") for job in jobs}
        assert None not in placed.values(), f"templates not pinned to a fabric domain: {placed}"
        assert placed["east"] != placed["west"], f"both gangs placed together: {placed}"
        for job in jobs:  # recorded before the template was made from it (issue 22)
            assert rest.get(COMPUTE_DOMAINS, job, ns)["status"]["fabricDomain"] == placed[job]
        pods = [f"{job}-{i}" for job in jobs for i in range(2)]
        for pod in pods:
            job = pod.split("-")[0]
            rest.create(PODS, _job_pod(pod, f"{job}-imex", job), ns)
        bound = {
            pod: wait_for(lambda pod=pod: _node_of(rest, ns, pod), what=f"{pod} bound", timeout=90)
            for pod in pods
        }
        fabric_of = {n: rack for rack, names in nodes.items() for n in names}
        for pod, node in bound.items():
            job = pod.split("-")[0]
            got = fabric_of.get(node) or rest.get(NODES, node)["metadata"]["labels"].get(
                "fabricdra.io/fabric.domain"
            )
            assert got == placed[job], f"{pod} bound on {node} in {got}, placed in {placed[job]}"

        for pod in pods:
            rest.delete(PODS, pod, ns)
        for job in jobs:
            rest.delete(COMPUTE_DOMAINS, job, ns)
        for job in jobs:
            wait_gone(
                lambda job=job: rest.get_or_none(COMPUTE_DOMAINS, job, ns),
                f"{job} deleted",
                timeout=60,
            )
