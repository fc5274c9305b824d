"""The chart against the real API server: every rendered manifest accepted (server-side dry-run),
the admission policy holding a node agent to its own node, keyed on the node the API server
authenticated (`authentication.kubernetes.io/node-name` of a pod-bound service-account token),
the verification override settable only by the configured admins (never by a node agent), and
claims refused a toleration of `fabricdra.io/unverified` unless they ask for admin access."""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.harness.controlplane import ControlPlane
from e2e.harness.helm import Chart
from e2e.harness.poll import wait_for
from fabricdra.api import computedomain as cd
from fabricdra.api.nodedevices import API_VERSION as ND_API_VERSION
from fabricdra.api.nodedevices import NodeDevicesSpec

pytestmark = pytest.mark.integration

NODE_SA = "fabricdra-node"
IMEX_SA = "fabricdra-imex-daemon"
OVERRIDE = "fabricdra.io/verification-override"
UNVERIFIED = "fabricdra.io/unverified"
# The chart's override admins for these tests: system:masters (the default) plus a group and a
# user from the values, as an operator would list them.
OPS_GROUP = "fdra-test-ops"
ONCALL_USER = "oncall@example.test"
USERS_GROUP = "fdra-test-users"  # RBAC lets it (and OPS_GROUP) write nodes and NodeDevices


def _values(ns: str) -> dict[str, Any]:
    # The node agent's own account listed too, as a careless operator might: it still may not.
    agent = f"system:serviceaccount:{ns}:{NODE_SA}"
    admins = {"groups": ["system:masters", OPS_GROUP], "users": [ONCALL_USER, agent]}
    return {"admissionPolicy": {"overrideAdmins": admins}}


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
    manifests = Chart().render(_values(ns), namespace=ns)
    done = _kubectl(control_plane, "apply", "--server-side", "-f", "-", stdin=manifests)
    assert done.returncode == 0, done.stderr
    nodes = Installed(ns, f"chart-a-{suffix}", f"chart-b-{suffix}")
    control_plane.create_node(nodes.node_a)
    control_plane.create_node(nodes.node_b)
    with control_plane.api_client() as api:
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_cluster_role(
            {
                "metadata": {"name": f"fdra-test-writers-{suffix}"},
                "rules": [
                    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
                    {
                        "apiGroups": ["fabricdra.io"],
                        "resources": ["nodedevices"],
                        "verbs": ["get", "create", "patch"],
                    },
                ],
            }
        )
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": f"fdra-test-writers-{suffix}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": f"fdra-test-writers-{suffix}",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}
                    for g in (USERS_GROUP, OPS_GROUP)
                ],
            }
        )
    _wait_for_policies(control_plane, nodes)
    return nodes


def _wait_for_policies(cp: ControlPlane, inst: Installed) -> None:
    """The API server enforces a new ValidatingAdmissionPolicy once it has loaded it, a moment
    after the create: a test run first would race it (and pass a write the policy refuses).
    Probe each policy family with a dry run until it refuses."""

    def refused(call: Any, *args: Any) -> bool:
        try:
            call(*args, dry_run="All")
        except ApiException as e:
            return e.status == 403
        return False

    label = {"metadata": {"labels": {"example.com/probe": "x"}}}
    override = {"metadata": {"annotations": {OVERRIDE: json.dumps({"reason": "probe"})}}}
    with _agent_on(cp, inst, inst.node_a) as agent, _as(cp, "probe", USERS_GROUP) as user:
        probes = [
            (client.CoreV1Api(agent).patch_node, inst.node_a, label),
            (client.CoreV1Api(user).patch_node, inst.node_a, override),
            # Each policy is loaded on its own: the report Leases' too (a full run once met it
            # not yet in force, and node a's agent wrote node b's report).
            (
                client.CoordinationV1Api(agent).create_namespaced_lease,
                inst.namespace,
                _report(inst.namespace, inst.node_b),
            ),
        ]
        with cp.api_client() as admin:
            claim = _claim(_exactly([GATE]))
            create = client.ResourceV1Api(admin).create_namespaced_resource_claim
            probes.append((create, inst.namespace, claim))
            for call, *args in probes:
                wait_for(lambda c=call, a=args: refused(c, *a), what="the policies in force")


def test_every_rendered_manifest_passes_server_side_dry_run(control_plane: ControlPlane) -> None:
    ns = f"fdra-dry-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(ns)
    # The third: the lifecycle values (issue 30 points 2, 8, 9) as the API server takes them
    # (the ServiceMonitor needs the Prometheus Operator's CRD, not installed here).
    lifecycle = {
        "fullnameOverride": "acme",
        "image": {"digest": "sha256:" + "ab" * 32},
        "podAnnotations": {"example.com/owner": "gpu-team"},
        "podLabels": {"team": "gpu"},
        "serviceAccount": {"annotations": {"example.com/role": "arn:x"}},
        "networkPolicy": {
            "enabled": True,
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        },
        "node": {"maxSurge": 0, "maxUnavailable": "5%"},
        "controller": {"replicas": 3, "podDisruptionBudget": {"minAvailable": "50%"}},
    }
    for values, stem in (
        ({}, "fabricdra"),
        ({"gpus": {"enabled": False}, "rdma": {"mode": "shared"}}, "fabricdra"),
        (lifecycle, "acme"),
    ):
        manifests = Chart().render(values, namespace=ns)
        done = _kubectl(
            control_plane, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=manifests
        )
        assert done.returncode == 0, done.stderr
        assert "DaemonSet" not in done.stderr
        assert f"daemonset.apps/{stem}-node serverside-applied (server dry run)" in done.stdout
    assert "networkpolicy.networking.k8s.io/acme-controller serverside-applied" in done.stdout
    assert "poddisruptionbudget.policy/acme-controller serverside-applied" in done.stdout


@pytest.mark.parametrize(
    "node",
    [
        {"maxSurge": 1, "maxUnavailable": 1},
        {"maxSurge": 0, "maxUnavailable": 0},
        {"maxSurge": "150%", "maxUnavailable": 0},
        {"maxSurge": -1, "maxUnavailable": 0},
        {"maxSurge": "abc", "maxUnavailable": 0},
    ],
)
def test_the_rollouts_the_schema_refuses_are_those_the_api_server_rejects(
    control_plane: ControlPlane, node: dict[str, Any]
) -> None:
    """values.schema.json mirrors the API server's DaemonSet validation: each rollout the
    schema refuses (tests/integration/test_chart_lifecycle.py), rendered past the schema, is
    rejected by the server, which helm would only have met part way through an upgrade."""
    chart = Chart()
    ns = f"fdra-roll-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(ns)
    manifests = chart.run(
        "template",
        "fabricdra",
        str(chart.chart_dir),
        f"--namespace={ns}",
        "--skip-schema-validation",
        "--show-only=templates/node-daemonset.yaml",
        f"--set-json=node={json.dumps(node)}",
        # `run` passes its arguments as they are, without the harness's base values.
        f"--set-json=devicePlugins={json.dumps(chart.base_values.get('devicePlugins', {}))}",
    )
    done = _kubectl(
        control_plane, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=manifests
    )
    assert done.returncode != 0, done.stdout
    assert "spec.updateStrategy.rollingUpdate" in done.stderr


def _token(cp: ControlPlane, ns: str, pod: dict[str, Any] | None, sa: str = NODE_SA) -> str:
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
        out = client.CoreV1Api(api).create_namespaced_service_account_token(sa, ns, body)
        return str(out.status.token)


def _agent_on(
    cp: ControlPlane, inst: Installed, node: str | None, sa: str = NODE_SA
) -> client.ApiClient:
    """An API client holding what the node agent's pod on `node` holds: its service account's
    token, bound to that pod (or, with node None, a token bound to no pod). `sa`: another
    node component's account (the IMEX daemon's)."""
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
                            "serviceAccountName": sa,
                            "containers": [{"name": "agent", "image": "localhost/busybox:e2e"}],
                        },
                    },
                )
                .to_dict()
            )
            pod = {"metadata": {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}}
    token = _token(cp, inst.namespace, pod, sa)
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


def test_the_agent_may_not_write_the_controllers_scale_out_tiers(
    control_plane: ControlPlane, installed: Installed
) -> None:
    """The tier labels are the controller's (it joins every node's cabling): an agent that
    could set its own would claim closeness nothing checked (issue 27 point 3)."""
    with _agent_on(control_plane, installed, installed.node_a) as api:
        core = client.CoreV1Api(api)
        tier = {"metadata": {"labels": {"fabricdra.io/network.tier-1": "leaf-1"}}}
        body = _denied(core.patch_node, installed.node_a, tier)
        assert "not the controller's fabricdra.io/network. scale-out tiers" in body
        # Its own labels still pass.
        core.patch_node(installed.node_a, {"metadata": {"labels": {"fabricdra.io/test": "ok"}}})


def test_a_token_bound_to_no_pod_names_no_node_and_writes_nothing(
    control_plane: ControlPlane, installed: Installed
) -> None:
    with _agent_on(control_plane, installed, None) as api:
        body = _denied(client.ResourceV1Api(api).create_resource_slice, _slice(installed.node_a))
        assert "name no node" in body


# --- report Leases: a node writes only its own, and only in the release namespace -----------


def _report(ns: str, node: str, *, holder: str | None = None) -> dict[str, Any]:
    """A report Lease as kubeletplugin/computedomain/report.py writes it."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": f"imex-{uuid.uuid4()}-{node}",
            "namespace": ns,
            "labels": {cd.DOMAIN_LABEL: "d1"},
            "annotations": {cd.REPORT_NODE: node, cd.REPORT_IP: "10.0.0.1"},
        },
        "spec": {"holderIdentity": holder or node},
    }


@pytest.mark.parametrize("sa", [NODE_SA, IMEX_SA])
def test_a_node_writes_only_its_own_report_leases(
    control_plane: ControlPlane, installed: Installed, sa: str
) -> None:
    ns, a, b = installed.namespace, installed.node_a, installed.node_b
    with control_plane.api_client() as admin:
        theirs = client.CoordinationV1Api(admin).create_namespaced_lease(ns, _report(ns, b))
    with _agent_on(control_plane, installed, a, sa) as api:
        leases = client.CoordinationV1Api(api)
        mine = leases.create_namespaced_lease(ns, _report(ns, a))
        ip = {"metadata": {"annotations": {cd.REPORT_IP: "10.0.0.2"}}}
        leases.patch_namespaced_lease(mine.metadata.name, ns, ip)
        body = _denied(leases.create_namespaced_lease, ns, _report(ns, b))
        assert "only its own node's report Leases" in body
        _denied(leases.create_namespaced_lease, ns, _report(ns, a, holder=b))
        # Another node's report: neither its IP redirected nor taken over by renaming the node.
        _denied(leases.patch_namespaced_lease, theirs.metadata.name, ns, ip)
        takeover = {"metadata": {"annotations": {cd.REPORT_NODE: a}}, "spec": {"holderIdentity": a}}
        _denied(leases.patch_namespaced_lease, theirs.metadata.name, ns, takeover)
        # A Lease that is no report (the controller's leader Lease) is not a node's to write.
        plain = {"metadata": {"name": f"fabricdra-leader-{uuid.uuid4().hex[:6]}"}}
        _denied(leases.create_namespaced_lease, ns, {**plain, "spec": {"holderIdentity": a}})
        if sa == IMEX_SA:
            _denied(leases.delete_namespaced_lease, theirs.metadata.name, ns)
            leases.delete_namespaced_lease(mine.metadata.name, ns)


@pytest.mark.parametrize("sa", [NODE_SA, IMEX_SA])
def test_a_node_writes_no_lease_outside_the_release_namespace(
    control_plane: ControlPlane, installed: Installed, sa: str
) -> None:
    victim = f"fdra-victim-{uuid.uuid4().hex[:6]}"
    with control_plane.api_client() as admin:
        client.CoordinationV1Api(admin).create_namespaced_lease(
            "kube-system", {"metadata": {"name": victim}, "spec": {"holderIdentity": "x"}}
        )
    a = installed.node_a
    with _agent_on(control_plane, installed, a, sa) as api:
        leases = client.CoordinationV1Api(api)
        # Even a well-formed report of its own node: RBAC grants Leases in no other namespace.
        body = _denied(leases.create_namespaced_lease, "kube-system", _report("kube-system", a))
        assert "cannot create resource" in body
        _denied(
            leases.patch_namespaced_lease, victim, "kube-system", {"spec": {"holderIdentity": a}}
        )
        _denied(leases.read_namespaced_lease, victim, "kube-system")


# --- the verification override: admins only -------------------------------------------------


def _as(cp: ControlPlane, user: str, *groups: str) -> client.ApiClient:
    """The admin's client impersonating `user` in `groups` (the admission policy sees them)."""
    api = cp.api_client()
    api.set_default_header("Impersonate-User", user)
    # one group per header is what the API server reads; the client sends one value per key
    assert len(groups) == 1
    api.set_default_header("Impersonate-Group", groups[0])
    return api


def _override_patch(reason: str | None) -> dict[str, Any]:
    value = None if reason is None else json.dumps({"reason": reason})
    return {"metadata": {"annotations": {OVERRIDE: value}}}


def test_only_the_configured_admins_may_set_or_clear_the_override(
    control_plane: ControlPlane, installed: Installed
) -> None:
    node = installed.node_a
    with _as(control_plane, "alice", USERS_GROUP) as api:
        core = client.CoreV1Api(api)
        # RBAC lets alice patch nodes: other annotations pass, the override does not
        core.patch_node(node, {"metadata": {"annotations": {"example.test/note": "x"}}})
        body = _denied(core.patch_node, node, _override_patch("alice says so"))
        assert "verification override" in body
    with _as(control_plane, "bob", OPS_GROUP) as api:  # a group the values list
        client.CoreV1Api(api).patch_node(node, _override_patch("bob"))
    with _as(control_plane, "alice", USERS_GROUP) as api:  # nor may alice change or clear it
        core = client.CoreV1Api(api)
        _denied(core.patch_node, node, _override_patch("alice"))
        _denied(core.patch_node, node, _override_patch(None))
        # an update that leaves the override as it is passes
        core.patch_node(node, {"metadata": {"annotations": {"example.test/note": "y"}}})
    with _as(control_plane, ONCALL_USER, USERS_GROUP) as api:  # a user the values list
        client.CoreV1Api(api).patch_node(node, _override_patch(None))
    with control_plane.api_client() as api:  # system:masters, the default
        client.CoreV1Api(api).patch_node(node, _override_patch("admin"))
        client.CoreV1Api(api).patch_node(node, _override_patch(None))


def test_a_node_agent_may_not_override_its_own_node(
    control_plane: ControlPlane, installed: Installed
) -> None:
    with _agent_on(control_plane, installed, installed.node_a) as api:
        core = client.CoreV1Api(api)
        body = _denied(core.patch_node, installed.node_a, _override_patch("I am fine"))
        # refused by the override policy, the node-label policy (no annotation), or both
        assert "verification override" in body or "verification-override is the admin" in body
        # what the agent does write to its Node still passes: labels, the reverify request
        core.patch_node(installed.node_a, {"metadata": {"labels": {"fabricdra.io/t": "1"}}})
        core.patch_node(
            installed.node_a, {"metadata": {"annotations": {"fabricdra.io/reverify": None}}}
        )
        custom = client.CustomObjectsApi(api)
        nd = _node_devices(installed.node_a)
        nd["metadata"]["annotations"] = {OVERRIDE: '{"reason": "me"}'}
        body = _denied(
            custom.create_cluster_custom_object, "fabricdra.io", "v1alpha1", "nodedevices", nd
        )
        assert "verification override" in body


def test_the_override_on_nodedevices_is_admins_only_too(
    control_plane: ControlPlane, installed: Installed
) -> None:
    name = installed.node_b
    with control_plane.api_client() as api:
        custom = client.CustomObjectsApi(api)
        try:
            custom.create_cluster_custom_object(
                "fabricdra.io", "v1alpha1", "nodedevices", _node_devices(name)
            )
        except ApiException as e:
            if e.status != 409:
                raise
    with _as(control_plane, "alice", USERS_GROUP) as api:
        custom = client.CustomObjectsApi(api)
        body = _denied(
            custom.patch_cluster_custom_object,
            "fabricdra.io",
            "v1alpha1",
            "nodedevices",
            name,
            _override_patch("alice"),
        )
        assert "verification override" in body
    with _as(control_plane, "bob", OPS_GROUP) as api:
        client.CustomObjectsApi(api).patch_cluster_custom_object(
            "fabricdra.io", "v1alpha1", "nodedevices", name, _override_patch("bob")
        )


# --- claims may tolerate the verification gate only with admin access -----------------------


def _claim(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"generateName": "tolerates-"},
        "spec": {"devices": {"requests": [request]}},
    }


def _exactly(tolerations: list[dict[str, Any]], admin: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.fabricdra.io", "tolerations": tolerations}
    if admin:
        exactly["adminAccess"] = True
    return {"name": "gpu", "exactly": exactly}


GATE = {"key": UNVERIFIED, "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def claims_ns(control_plane: ControlPlane, installed: Installed) -> str:
    ns = f"fdra-claims-{uuid.uuid4().hex[:6]}"
    control_plane.create_namespace(ns)
    with control_plane.api_client() as api:  # admin access needs the namespace's consent
        client.CoreV1Api(api).patch_namespace(
            ns, {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}}
        )
    return ns


def test_a_claim_tolerating_the_gate_without_admin_access_is_refused(
    control_plane: ControlPlane, claims_ns: str
) -> None:
    with control_plane.api_client() as api:  # even the cluster admin's claims
        resource = client.ResourceV1Api(api)
        create = resource.create_namespaced_resource_claim
        body = _denied(create, claims_ns, _claim(_exactly([GATE])))
        assert UNVERIFIED in body
        # an empty key with Exists tolerates every taint, the gate's too
        _denied(create, claims_ns, _claim(_exactly([{"operator": "Exists"}])))
        sub = {"name": "g", "deviceClassName": "gpu.fabricdra.io", "tolerations": [GATE]}
        _denied(create, claims_ns, _claim({"name": "gpu", "firstAvailable": [sub]}))
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "tolerates"},
            "spec": {"spec": {"devices": {"requests": [_exactly([GATE])]}}},
        }
        _denied(resource.create_namespaced_resource_claim_template, claims_ns, template)


def test_admin_access_claims_and_other_tolerations_pass(
    control_plane: ControlPlane, claims_ns: str
) -> None:
    with control_plane.api_client() as api:
        resource = client.ResourceV1Api(api)
        made = resource.create_namespaced_resource_claim(
            claims_ns, _claim(_exactly([GATE], admin=True))
        )
        tolerations = made.spec.devices.requests[0].exactly.tolerations
        assert [t.key for t in tolerations] == [UNVERIFIED]  # the field reached the server
        unhealthy = {"key": "fabricdra.io/unhealthy", "operator": "Exists"}
        resource.create_namespaced_resource_claim(claims_ns, _claim(_exactly([unhealthy])))
        resource.create_namespaced_resource_claim(
            claims_ns,
            _claim({"name": "gpu", "exactly": {"deviceClassName": "gpu.fabricdra.io"}}),
        )


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
            # fabricdra.io's override is refused by the override policy too: the API server
            # names one of the refusing policies, in no fixed order
            assert "no other annotation" in body or (
                prefix == "fabricdra.io" and "verification override" in body
            )
        fin = {"metadata": {"finalizers": ["fabricdra.io/hold"]}}
        body = _denied(core.patch_node, installed.node_a, fin)
        assert "no finalizer" in body
        # Its own labels still pass alongside (the rule is not a blanket denial).
        core.patch_node(installed.node_a, {"metadata": {"labels": {"fabricdra.io/test": "ok"}}})
        # It removes a re-verification request it has served (issue 18), and never sets one.
        reverify = "fabricdra.io/reverify"
        with control_plane.api_client() as admin:
            client.CoreV1Api(admin).patch_node(
                installed.node_a, {"metadata": {"annotations": {reverify: "after-repair"}}}
            )
        core.patch_node(installed.node_a, {"metadata": {"annotations": {reverify: None}}})
        again = {"metadata": {"annotations": {reverify: "again"}}}
        assert "no other annotation" in _denied(core.patch_node, installed.node_a, again)
