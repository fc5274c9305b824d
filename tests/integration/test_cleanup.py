"""`fabricdra cleanup` (the chart's pre-delete hook) against a real API server, run as the
command, as a user holding exactly the chart's cleanup rules (rbac.CLEANUP cluster-wide,
rbac.CLEANUP_NAMESPACED in the release namespace).

The cleanup is cluster-wide by nature (every node's labels, every fabricdra slice), so this
module has its own control plane: the shared one holds other modules' objects. No kubelet and
no controller run here: a domain is never finalized by a controller (the cleanup finalizes it
itself), and a component pod, bound to a node without a kubelet, never terminates by itself
(the cleanup must refuse to go on while it is there)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.controlplane import ControlPlane
from e2e.harness.errors import HarnessError
from fabricdra.api import computedomain as cd
from fabricdra.api.nodedevices import API_VERSION as ND_API_VERSION
from fabricdra.controller import rbac
from fabricdra.controller.cleanup import DEPLOYMENTS
from fabricdra.controller.fabriccheckrun import RUN_LABEL
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    COMPUTE_DOMAINS,
    DAEMON_SETS,
    DEVICE_CLASSES,
    LEASES,
    NODE_DEVICES,
    NODES,
    PODS,
    SLICES,
    Kind,
    Rest,
)
from tests.integration.computedomain_helpers import CRDS, install_crd

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
REL, WORK = "fdra-release", "team-a"
CLUSTER_ROLES = Kind("rbac.authorization.k8s.io", "v1", "clusterroles", False)
CLUSTER_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False)
ROLES = Kind("rbac.authorization.k8s.io", "v1", "roles", True)
ROLE_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "rolebindings", True)
USER = "fabricdra-cleanup"


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("cleanup-plane"))
    try:
        plane.start()
    except HarnessError as e:
        pytest.fail(f"real control plane unavailable: {e}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


def _meta(name: str, labels: dict[str, str] | None = None, **more: Any) -> dict[str, Any]:
    return {"name": name, "labels": labels or {}, **more}


def _slice(name: str, driver: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "d0"}],
        },
    }


def _template(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _meta(name, labels),
        "spec": {"spec": {"devices": {"requests": []}}},
    }


def _workload(kind: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": _meta(name, labels),
        "spec": {"selector": {"matchLabels": labels}, "template": pod},
    }


def _release(component: str, instance: str = "fabricdra") -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "fabricdra",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
    }


def _grant(rest: Rest) -> None:
    rest.create(CLUSTER_ROLES, rbac.cluster_role(USER, rbac.CLEANUP))
    rest.create(CLUSTER_BINDINGS, rbac.binding_for_user(USER, USER, USER))
    role = {**rbac.cluster_role(USER, rbac.CLEANUP_NAMESPACED), "kind": "Role"}
    rest.create(ROLES, role, REL)
    binding = rbac.binding_for_user(USER, USER, USER)
    binding["kind"] = "RoleBinding"
    binding["roleRef"]["kind"] = "Role"
    rest.create(ROLE_BINDINGS, binding, REL)


def _cleanup(cp: ControlPlane, kubeconfig: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "fabricdra.cli", "cleanup", f"--kubeconfig={kubeconfig}"]
    argv += [f"--namespace={REL}", "--release=fabricdra", "--domain-timeout=2", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _names(rest: Rest, kind: Kind, namespace: str | None = None, **sel: str) -> list[str]:
    return sorted(i["metadata"]["name"] for i in rest.list(kind, namespace, **sel)["items"])


def _user_domain(rest: Rest, name: str) -> str:
    """A user's ComputeDomain in WORK with what the controller makes for it (its workload claim
    template there, the IMEX DaemonSet and its claim template in REL), never finalized (no
    controller here); its UID."""
    domain = rest.create(
        COMPUTE_DOMAINS,
        {
            "apiVersion": cd.API_VERSION,
            "kind": cd.KIND,
            "metadata": {"name": name, "finalizers": [cd.FINALIZER]},
            "spec": {"channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
        },
        WORK,
    )
    uid: str = domain["metadata"]["uid"]
    owned = {cd.DOMAIN_LABEL: uid}
    rest.create(CLAIM_TEMPLATES, _template(f"{name}-channel", owned), WORK)
    rest.create(CLAIM_TEMPLATES, _template(f"imex-{uid}", owned), REL)
    rest.create(DAEMON_SETS, _workload("DaemonSet", f"imex-{uid}", owned), REL)
    return uid


@pytest.fixture(scope="module")
def granted(cp: ControlPlane) -> ControlPlane:
    """The CRDs, the release's and a user's namespace, and the hook's rules for USER."""
    rest = Rest(cp.api_client())
    install_crd(rest)
    rest.create(CRDS, yaml.safe_load((ROOT / "api/crds/nodedevices.fabricdra.io.yaml").read_text()))
    for ns in (REL, WORK):
        cp.create_namespace(ns)
    _grant(rest)
    return cp


def test_cleanup_removes_what_fabricdra_made_and_nothing_else(granted: ControlPlane) -> None:
    cp = granted
    rest = Rest(cp.api_client())

    # A domain the controller made objects for, and never finalized (no controller here).
    uid = _user_domain(rest, "job")
    owned = {cd.DOMAIN_LABEL: uid}
    # A domain the release made itself: the controller's multi-node NVLink check (deleted).
    rest.create(
        COMPUTE_DOMAINS,
        {
            "apiVersion": cd.API_VERSION,
            "kind": cd.KIND,
            "metadata": {
                "name": "fabric-check-x",
                "finalizers": [cd.FINALIZER],
                "labels": {RUN_LABEL: "fabric-check-x"},
            },
            "spec": {"channel": {"resourceClaimTemplate": {"name": "fabric-check-x"}}},
        },
        REL,
    )
    rest.create(CLAIM_TEMPLATES, _template("users-own", {}), WORK)
    # The release's components, and another release's (left alone).
    rest.create(DAEMON_SETS, _workload("DaemonSet", "fabricdra-node", _release("node")), REL)
    rest.create(
        DEPLOYMENTS, _workload("Deployment", "fabricdra-controller", _release("controller")), REL
    )
    rest.create(DAEMON_SETS, _workload("DaemonSet", "other-node", _release("node", "other")), REL)
    for node in ("n1", "n2"):
        cp.create_node(
            node,
            {
                "fabricdra.io/rdma.capable": "true",
                "fabricdra.io/fabric.domain": "rack-1",
                cd.PLUGIN_NODE_LABEL: "true",
                "example.com/rack": "r1",
            },
        )
        rest.create(SLICES, _slice(f"{node}-devices", "devices.fabricdra.io", node))
        rest.create(SLICES, _slice(f"{node}-compute-domain", cd.DRIVER, node))
        rest.create(SLICES, _slice(f"{node}-other", "gpu.example.com", node))
        rest.create(
            NODE_DEVICES,
            {
                "apiVersion": ND_API_VERSION,
                "kind": "NodeDevices",
                "metadata": {"name": node},
                "spec": {},
            },
        )
    rest.patch(NODES, "n1", {"metadata": {"labels": {cd.DOMAIN_LABEL: uid}}})
    for name, labels in (
        ("fabricdra-compute-domain-controller", {}),
        ("imex-host-n1", {cd.DOMAIN_LABEL: "host"}),
        (f"imex-{uid}-n1", owned),
        ("someone-elses", {}),
    ):
        rest.create(LEASES, {"metadata": _meta(name, labels), "spec": {}}, REL)
    for name in (cd.CHANNEL_CLASS, cd.DAEMON_CLASS, "gpu.example.com"):
        rest.create(DEVICE_CLASSES, {"metadata": {"name": name}, "spec": {}})
    # A component pod on a node without a kubelet: deleted, it never goes away by itself.
    pod = {
        "metadata": _meta("fabricdra-node-x", _release("node")),
        "spec": {"nodeName": "n2", "containers": [{"name": "c", "image": "x"}]},
    }
    rest.create(PODS, pod, REL)

    kubeconfig = cp.kubeconfig_for(USER, USER)
    first = _cleanup(cp, kubeconfig, "--stop-timeout=3")
    published_meanwhile = _names(rest, SLICES)
    rest.call(
        "DELETE",
        PODS.path(REL, "fabricdra-node-x"),
        body={"gracePeriodSeconds": 0},
    )
    second = _cleanup(cp, kubeconfig, "--stop-timeout=30")
    report = json.loads(second.stdout)

    # Refused while a component pod was still there, naming it; nothing published was touched.
    assert first.returncode == 1, first.stderr
    assert "fabricdra-node-x" in first.stderr
    assert "n1-devices" in published_meanwhile
    # The domains were already done then: the user's released (what the release made for it
    # deleted, the finalizer dropped), the release's own fabric check domain deleted.
    assert json.loads(first.stdout)["releasedDomains"] == [f"{REL}/fabric-check-x", f"{WORK}/job"]
    assert second.returncode == 0, second.stderr
    assert report["releasedDomains"] == []
    # The user's ComputeDomain is kept (users' objects outlive the release), with nothing of
    # ours left on it: a later CRD deletion or a reinstall finds no finalizer to wait on.
    kept = rest.list(COMPUTE_DOMAINS)["items"]
    assert [(d["metadata"]["namespace"], d["metadata"]["name"]) for d in kept] == [(WORK, "job")]
    assert cd.FINALIZER not in (kept[0]["metadata"].get("finalizers") or [])
    assert _names(rest, CLAIM_TEMPLATES, WORK) == ["users-own"]
    assert _names(rest, CLAIM_TEMPLATES, REL) == []
    assert _names(rest, DAEMON_SETS, REL) == ["other-node"]
    assert _names(rest, DEPLOYMENTS, REL) == []
    assert _names(rest, SLICES) == ["n1-other", "n2-other"]
    assert rest.list(NODE_DEVICES)["items"] == []
    for node in rest.list(NODES)["items"]:
        labels = node["metadata"]["labels"]
        assert not [k for k in labels if "fabricdra.io/" in k], node["metadata"]["name"]
        assert labels["example.com/rack"] == "r1"
    assert _names(rest, LEASES, REL) == ["someone-elses"]
    assert _names(rest, DEVICE_CLASSES) == ["gpu.example.com"]
    # A second run finds nothing to do and succeeds (a retried hook).
    again = _cleanup(cp, kubeconfig)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["removed"] == {}


def test_cleanup_lists_in_pages(granted: ControlPlane) -> None:
    """Slices, NodeDevices and Nodes are listed a page at a time (limit/continue), as the
    informer does: at 5,000 nodes one unpaged list of each passed the Job's memory limit."""
    cp = granted
    rest = Rest(cp.api_client())
    nodes = [f"paged-{i}" for i in range(5)]
    for node in nodes:
        cp.create_node(node, {"fabricdra.io/gpu.present": "true"})
        rest.create(SLICES, _slice(f"{node}-devices", "devices.fabricdra.io", node))
        nd = {"apiVersion": ND_API_VERSION, "kind": "NodeDevices", "metadata": {"name": node}}
        rest.create(NODE_DEVICES, {**nd, "spec": {}})

    kubeconfig = cp.kubeconfig_for(USER, USER)
    earlier = len(cp.audit_events(user_agent="fabricdra-cleanup", verbs=["list"]))
    done = _cleanup(cp, kubeconfig, "--page-size=2")

    assert done.returncode == 0, done.stderr
    removed = json.loads(done.stdout)["removed"]
    assert sorted(removed["nodedevices"]) == nodes
    assert sorted(removed["resourceslices"]) == [f"{n}-devices" for n in nodes]
    assert [f"{n}:fabricdra.io/gpu.present" for n in nodes] == sorted(removed["nodes/labels"])
    lists = [
        e["requestURI"]
        for e in cp.audit_events(user_agent="fabricdra-cleanup", verbs=["list"])[earlier:]
        if e["user"]["username"] == USER
    ]
    for plural in ("resourceslices", "nodedevices", "nodes"):
        of_kind = [u for u in lists if u.split("?")[0].endswith(f"/{plural}")]
        assert of_kind, plural
        # Every list of the kind in pages; five objects need three pages of two.
        assert all("limit=2" in u for u in of_kind), of_kind
        assert sum("continue=" in u for u in of_kind) >= 2, of_kind
    # And every list the command made, of any kind, is paged.
    assert lists
    assert all("limit=" in u for u in lists), [u for u in lists if "limit=" not in u]


def test_compute_domains_turned_off_release_what_the_controller_made(granted: ControlPlane) -> None:
    """`--scope=compute-domains`, the pre-upgrade hook of an upgrade turning
    `computeDomains.enabled` off: the controller stopped, the user's domain released (kept),
    what the controller made removed; the node pods, their devices and labels untouched."""
    cp = granted
    rest = Rest(cp.api_client())
    uid = _user_domain(rest, "off-job")
    owned = {cd.DOMAIN_LABEL: uid}
    rest.create(DAEMON_SETS, _workload("DaemonSet", "fabricdra-node", _release("node")), REL)
    rest.create(
        DEPLOYMENTS, _workload("Deployment", "fabricdra-controller", _release("controller")), REL
    )
    node = "off-n1"
    cp.create_node(
        node,
        {
            "fabricdra.io/gpu.present": "true",
            "fabricdra.io/fabric-verified": "true",
            cd.PLUGIN_NODE_LABEL: "true",
            cd.DOMAIN_LABEL: uid,
        },
    )
    rest.create(SLICES, _slice(f"{node}-devices", "devices.fabricdra.io", node))
    rest.create(SLICES, _slice(f"{node}-compute-domain", cd.DRIVER, node))
    nd = {"apiVersion": ND_API_VERSION, "kind": "NodeDevices", "metadata": {"name": node}}
    rest.create(NODE_DEVICES, {**nd, "spec": {}})
    for name, labels in (
        ("fabricdra-compute-domain-controller", {}),
        (f"imex-{uid}-{node}", owned),
    ):
        rest.create(LEASES, {"metadata": _meta(name, labels), "spec": {}}, REL)
    for name in (cd.CHANNEL_CLASS, cd.DAEMON_CLASS):
        rest.create(DEVICE_CLASSES, {"metadata": {"name": name}, "spec": {}})

    done = _cleanup(cp, cp.kubeconfig_for(USER, USER), "--scope=compute-domains")

    assert done.returncode == 0, done.stderr
    assert f"{WORK}/off-job" in json.loads(done.stdout)["releasedDomains"]
    kept = rest.get(COMPUTE_DOMAINS, "off-job", WORK)
    assert cd.FINALIZER not in (kept["metadata"].get("finalizers") or [])
    assert "off-job-channel" not in _names(rest, CLAIM_TEMPLATES, WORK)
    assert _names(rest, CLAIM_TEMPLATES, REL) == []
    assert "fabricdra-node" in _names(rest, DAEMON_SETS, REL)
    assert f"imex-{uid}" not in _names(rest, DAEMON_SETS, REL)
    assert _names(rest, DEPLOYMENTS, REL) == []
    slices = _names(rest, SLICES)
    assert f"{node}-devices" in slices
    assert f"{node}-compute-domain" not in slices
    assert node in _names(rest, NODE_DEVICES)
    labels = rest.get(NODES, node)["metadata"]["labels"]
    assert labels["fabricdra.io/gpu.present"] == "true"
    # The plugin's own label stays: the plugin sets it while it runs (until its pod goes).
    assert labels[cd.PLUGIN_NODE_LABEL] == "true"
    assert cd.DOMAIN_LABEL not in labels
    assert "fabricdra.io/fabric-verified" not in labels
    leases = _names(rest, LEASES, REL)
    assert "fabricdra-compute-domain-controller" not in leases
    assert f"imex-{uid}-{node}" not in leases
    classes = _names(rest, DEVICE_CLASSES)
    assert cd.CHANNEL_CLASS not in classes
    assert cd.DAEMON_CLASS not in classes
