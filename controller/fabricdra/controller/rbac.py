"""The permissions each compute-domain component needs, as RBAC PolicyRules (data only).

docs/compute-domains.md lists the same rules; tests run the controller under exactly these
(a non-admin identity against the real API server), so a missing rule fails a test.
"""

from __future__ import annotations

from typing import Any

from fabricdra.api import computedomain as cd

Rule = dict[str, Any]

CONTROLLER: list[Rule] = [
    {
        "apiGroups": [cd.GROUP],
        "resources": ["computedomains"],
        "verbs": ["get", "list", "watch", "patch"],
    },
    {"apiGroups": [cd.GROUP], "resources": ["computedomains/status"], "verbs": ["get", "patch"]},
    # The fleet metrics (fleetmetrics.py) read every node's verification record; the fabric
    # check (--fabric-check) watches them for the nodes' hardware fingerprints.
    {"apiGroups": [cd.GROUP], "resources": ["nodedevices"], "verbs": ["list", "watch"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaimtemplates"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims"],
        "verbs": ["get", "list", "watch"],
    },
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims/status"],
        "verbs": ["get", "patch", "update"],
    },
    # Kubernetes 1.36 (DRAResourceClaimGranularStatusAuthorization): writing status.devices of
    # claims on any node, for this driver only.
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims/driver"],
        "resourceNames": [cd.DRIVER],
        "verbs": ["arbitrary-node:update", "arbitrary-node:patch"],
    },
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["get", "list", "watch", "create", "update", "delete"],
    },
    {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["get", "create"]},
    # Its own two DeviceClasses are brought up to date at start (an upgrade may change them).
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["deviceclasses"],
        "resourceNames": [cd.CHANNEL_CLASS, cd.DAEMON_CLASS],
        "verbs": ["update"],
    },
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    # The Workload API (workloads.py; read only where the API server serves PodGroups): the
    # pods naming a domain's claim template, for their PodGroup, and the PodGroups' gang size
    # and topology constraint.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {"apiGroups": ["scheduling.k8s.io"], "resources": ["podgroups"], "verbs": ["list", "watch"]},
]

# The controller's own namespace (a Role there, not cluster-wide): the IMEX DaemonSets, the
# Leases (leader election, daemon reports) and a read of the namespace itself, which must exist
# (the chart's release namespace).
CONTROLLER_NAMESPACED: list[Rule] = [
    {
        "apiGroups": ["apps"],
        "resources": ["daemonsets"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
    },
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
    # The multi-node NVLink check (--fabric-check, fabriccheckrun.py), only here: its own
    # ComputeDomain, worker and launcher pods (and the launcher's log), the headless Service
    # and the SSH key Secret. The Service and Secret are owned by the ComputeDomain, so the
    # garbage collector deletes them: create only (no read of any Secret).
    {"apiGroups": [cd.GROUP], "resources": ["computedomains"], "verbs": ["create", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["services", "secrets"], "verbs": ["create"]},
    # The ibnetdiscover dumps the fabric Jobs write (tierlabels.py, --scale-out-tiers).
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]},
]

NODE_PLUGIN: list[Rule] = [
    {"apiGroups": [cd.GROUP], "resources": ["computedomains"], "verbs": ["get"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
]

IMEX_DAEMON: list[Rule] = [
    # list/watch: the daemon watches its one domain (field selector on the name).
    {"apiGroups": [cd.GROUP], "resources": ["computedomains"], "verbs": ["get", "list", "watch"]},
]

# Leases, only ever in the release namespace (a Role + RoleBinding there, never a ClusterRole:
# cluster-wide, a node's identity could patch kube-system's node heartbeats and leader locks).
# The controller's (its leader Lease, the daemons' reports) are in CONTROLLER_NAMESPACED above.
# The node plugin and the IMEX daemon write their node's report Leases; admission-policy.yaml
# narrows that to their own node's reports.
NODE_PLUGIN_NAMESPACED: list[Rule] = [
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "create", "patch"],
    },
]

IMEX_DAEMON_NAMESPACED: list[Rule] = [
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "create", "patch", "delete"],
    },
]


# `fabricdra cleanup`, the chart's pre-delete hook (controller/…/cleanup.py): cluster-wide, what
# it lists and deletes; in the release namespace (CLEANUP_NAMESPACED, a Role), the components it
# stops and the Leases there.
CLEANUP: list[Rule] = [
    {
        "apiGroups": [cd.GROUP],
        "resources": ["computedomains"],
        "verbs": ["get", "list", "delete", "patch"],
    },
    {"apiGroups": [cd.GROUP], "resources": ["nodedevices"], "verbs": ["list", "delete"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices", "resourceclaimtemplates"],
        "verbs": ["list", "delete"],
    },
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["deviceclasses"],
        "resourceNames": [cd.CHANNEL_CLASS, cd.DAEMON_CLASS],
        "verbs": ["get", "delete"],
    },
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]},
]

CLEANUP_NAMESPACED: list[Rule] = [
    {
        "apiGroups": ["apps"],
        "resources": ["daemonsets", "deployments"],
        "verbs": ["list", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "verbs": ["get", "list", "delete"],
    },
]


def role(name: str, namespace: str, rules: list[Rule]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": rules,
    }


def cluster_role(name: str, rules: list[Rule]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": rules,
    }


def role_binding_for_user(name: str, namespace: str, role: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }


def binding_for_user(name: str, role: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
