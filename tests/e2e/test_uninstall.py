"""In-cluster scenario 8 of the install: `helm uninstall` leaves nothing the release made but the
CRDs it keeps (`crds.keep`), and keeps what the user made: the ComputeDomain, released.

The release is installed (`installed`), a ComputeDomain with a running pod makes the controller
create its objects and hold the node, then the release is uninstalled and every kind fabricdra
writes is listed: what the chart made, what the components published, what the controller made
for the domain. The next test that needs the release installs it again."""

from __future__ import annotations

import contextlib
import uuid

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from fabricdra.api import computedomain as cd
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
    NotFound,
    Rest,
)
from tests.e2e.installkit import NAMESPACE, Installed, offered_untainted, wait_running
from tests.e2e.test_install_computedomain import create_domain, domain_pod

pytestmark = pytest.mark.e2e

PREFIXES = ("fabricdra.io/", "compute-domain.fabricdra.io/")
CRDS = Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", False)
DEPLOYMENTS = Kind("apps", "v1", "deployments", True)
JOBS = Kind("batch", "v1", "jobs", True)
SERVICES = Kind("", "v1", "services", True)
CONFIG_MAPS = Kind("", "v1", "configmaps", True)
SERVICE_ACCOUNTS = Kind("", "v1", "serviceaccounts", True)
PDBS = Kind("policy", "v1", "poddisruptionbudgets", True)
ROLES = Kind("rbac.authorization.k8s.io", "v1", "roles", True)
ROLE_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "rolebindings", True)
CLUSTER_ROLES = Kind("rbac.authorization.k8s.io", "v1", "clusterroles", False)
CLUSTER_ROLE_BINDINGS = Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False)
POLICIES = Kind("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", False)
POLICY_BINDINGS = Kind(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", False
)


def names(rest: Rest, kind: Kind, namespace: str | None = None, **selectors: str) -> list[str]:
    try:
        items = rest.list(kind, namespace, **selectors)["items"]
    except NotFound:  # the kind is not served any more (its CRD is gone)
        return []
    return sorted(
        f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}".lstrip("/") for i in items
    )


def leftovers(rest: Rest) -> dict[str, list[str]]:
    """Everything fabricdra made that is still there, by kind (empty lists dropped)."""
    fabricdra = [
        # What the chart made (its objects carry the release's labels).
        *(
            (k.plural, names(rest, k, ns, label_selector="app.kubernetes.io/name=fabricdra"))
            for k, ns in (
                (DAEMON_SETS, NAMESPACE),
                (DEPLOYMENTS, NAMESPACE),
                (JOBS, NAMESPACE),
                (PODS, NAMESPACE),
                (SERVICES, NAMESPACE),
                (CONFIG_MAPS, NAMESPACE),
                (SERVICE_ACCOUNTS, NAMESPACE),
                (PDBS, NAMESPACE),
                (ROLES, NAMESPACE),
                (ROLE_BINDINGS, NAMESPACE),
                (CLUSTER_ROLES, None),
                (CLUSTER_ROLE_BINDINGS, None),
                (POLICIES, None),
                (POLICY_BINDINGS, None),
            )
        ),
        ("crds", [n for n in names(rest, CRDS) if n.endswith(".fabricdra.io")]),
        ("deviceclasses", [n for n in names(rest, DEVICE_CLASSES) if n.endswith(".fabricdra.io")]),
        # What the components published.
        *(
            (f"resourceslices {d}", names(rest, SLICES, field_selector=f"spec.driver={d}"))
            for d in ("devices.fabricdra.io", cd.DRIVER)
        ),
        ("nodedevices", names(rest, NODE_DEVICES)),
        (
            "node labels",
            [
                f"{n['metadata']['name']}:{k}"
                for n in rest.list(NODES)["items"]
                for k in n["metadata"].get("labels", {})
                if k.startswith(PREFIXES)
            ],
        ),
        # What the controller made for domains, and the reports and leader lease.
        ("computedomains", names(rest, COMPUTE_DOMAINS)),
        ("resourceclaimtemplates", names(rest, CLAIM_TEMPLATES, label_selector=cd.DOMAIN_LABEL)),
        ("imex daemonsets", names(rest, DAEMON_SETS, label_selector=cd.DOMAIN_LABEL)),
        ("imex pods", names(rest, PODS, label_selector=cd.DOMAIN_LABEL)),
        ("leases", names(rest, LEASES, NAMESPACE)),
    ]
    return {what: found for what, found in fabricdra if found}


def test_helm_uninstall_leaves_nothing_fabricdra_made(installed: Installed) -> None:
    node = installed.cluster.node_name
    ns = f"uninstall-{uuid.uuid4().hex[:6]}"
    with installed.cluster.api_client() as api:
        core, rest = client.CoreV1Api(api), Rest(api)
        wait_for(lambda: offered_untainted(api, node), timeout=120, what="untainted devices")
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), what="default SA")
        try:
            domain = create_domain(rest, ns, "job")
            domain_pod(core, ns, "worker", "job")
            wait_running(core, ns, "worker")
            uid = domain["metadata"]["uid"]
            before = leftovers(rest)
            # The user's pod goes first, as docs/install.md asks; its domain stays for uninstall.
            core.delete_namespaced_pod("worker", ns)
            wait_for(
                lambda: not names(rest, PODS, ns), timeout=60, what="the domain's pod to terminate"
            )

            installed.uninstall()

            # helm --wait returns once its own objects are gone; pods of its DaemonSets may still
            # be terminating. What is left after that is what the assertion below lists.
            with contextlib.suppress(AssertionError):
                wait_for(
                    lambda: set(leftovers(rest)) <= {"crds", "computedomains"},
                    timeout=60,
                    what="nothing left but the CRDs and the user's domain",
                )
            after = leftovers(rest)
            namespace_left = names(rest, CLAIM_TEMPLATES, ns)
            kept = rest.get_or_none(COMPUTE_DOMAINS, "job", ns) or {"metadata": {}}
            kept_finalizers = kept["metadata"].get("finalizers") or []
        finally:
            # A failure must not leave the node held for the next scenario.
            with contextlib.suppress(Exception):
                core.delete_namespace(ns)

    # What the test made was really there before uninstall (the assertions below could fail).
    assert before["resourceslices devices.fabricdra.io"]
    assert before[f"resourceslices {cd.DRIVER}"]
    assert before["nodedevices"] == [node]
    assert f"{node}:{cd.DOMAIN_LABEL}" in before["node labels"]
    assert f"{node}:{cd.PLUGIN_NODE_LABEL}" in before["node labels"]
    assert before["resourceclaimtemplates"] == sorted(
        [f"{ns}/job-channel", f"{NAMESPACE}/imex-{uid}"]
    )
    assert before["imex daemonsets"] == [f"{NAMESPACE}/imex-{uid}"]
    assert before["computedomains"] == [f"{ns}/job"]
    assert before["crds"]
    assert before["clusterroles"]
    # The CRDs stay (crds.keep, the default) and the user's ComputeDomain with them, released:
    # nothing the release made for it is left, and no finalizer waits on a controller.
    assert after == {"crds": before["crds"], "computedomains": [f"{ns}/job"]}
    assert cd.FINALIZER not in kept_finalizers
    assert namespace_left == []
