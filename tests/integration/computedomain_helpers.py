"""Helpers shared by the ComputeDomain integration tests and bench/controller.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.controlplane import ControlPlane, wait_for
from fabricdra.api import computedomain as cd
from fabricdra.controller.manager import Controller, ControllerConfig
from fabricdra.controller.objects import DaemonSettings
from fabricdra.kube.rest import (
    CLAIMS,
    COMPUTE_DOMAINS,
    NODES,
    STRATEGIC_PATCH,
    ApiError,
    Conflict,
    Kind,
    NotFound,
    Rest,
)
from fabricdra.kubeletplugin.kubelet import ClaimRef

CRD_FILE = Path(__file__).resolve().parents[2] / "api" / "crds" / "computedomains.fabricdra.io.yaml"
CRDS = Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", False)
POLICIES = Kind("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", False)
POLICY_BINDINGS = Kind(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", False
)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def snapshot_objects(cp: ControlPlane) -> dict[str, set[str]]:
    """The UIDs of every ComputeDomain and Node now (`remove_new_objects` keeps these)."""
    with cp.api_client() as api:
        rest = Rest(api)
        out = {"nodes": {n["metadata"]["uid"] for n in rest.list(NODES)["items"]}}
        try:
            domains = rest.list(COMPUTE_DOMAINS)["items"]
        except NotFound:
            domains = []  # the CRD is not installed yet
        out["domains"] = {d["metadata"]["uid"] for d in domains}
    return out


def remove_new_objects(cp: ControlPlane, before: dict[str, set[str]]) -> None:
    """Delete the ComputeDomains and Nodes made since `before` (a test's). No controller runs
    any more to finalize the domains: their finalizer is dropped (what they made stays, named
    after them and unused)."""
    with cp.api_client() as api:
        rest = Rest(api)
        try:
            domains = rest.list(COMPUTE_DOMAINS)["items"]
        except NotFound:
            domains = []
        for d in domains:
            meta = d["metadata"]
            if meta["uid"] in before["domains"]:
                continue
            ns, name = meta["namespace"], meta["name"]
            try:
                if meta.get("finalizers"):
                    rest.patch(COMPUTE_DOMAINS, name, {"metadata": {"finalizers": None}}, ns)
                rest.delete(COMPUTE_DOMAINS, name, ns)
            except NotFound:
                pass
        for n in rest.list(NODES)["items"]:
            if n["metadata"]["uid"] not in before["nodes"]:
                rest.delete(NODES, n["metadata"]["name"])
        wait_for(
            lambda: (
                not {d["metadata"]["uid"] for d in rest.list(COMPUTE_DOMAINS)["items"]}
                - before["domains"]
            ),
            what="the test's ComputeDomains gone",
            timeout=30,
        )


def install_crd(rest: Rest) -> None:
    body = yaml.safe_load(CRD_FILE.read_text())
    with suppress(Conflict):
        rest.create(CRDS, body)

    def established() -> bool:
        crd = rest.get(CRDS, body["metadata"]["name"])
        conds = crd.get("status", {}).get("conditions", [])
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    wait_for(established, what="ComputeDomain CRD established", timeout=30)
    # The CRD's REST endpoint needs a moment after Established on a busy machine.
    wait_for(lambda: rest.list(COMPUTE_DOMAINS, "default") is not None, what="CRD served")


def domain_body(
    name: str, *, rct: str | None = None, mode: str = "managed", num_nodes: int | None = None
) -> dict[str, Any]:
    template = {"name": rct or f"{name}-channel"}
    spec: dict[str, Any] = {"channel": {"resourceClaimTemplate": template}, "imexMode": mode}
    if num_nodes is not None:
        spec["numNodes"] = num_nodes
    return {"apiVersion": cd.API_VERSION, "kind": cd.KIND, "metadata": {"name": name}, "spec": spec}


@contextmanager
def running_controller(cp: ControlPlane, namespace: str, **kw: Any) -> Iterator[Controller]:
    fabric_runner = kw.pop("fabric_runner", None)  # how the fabric check runs (--fabric-check)
    cfg = ControllerConfig(
        namespace=namespace,
        daemon=DaemonSettings(namespace=namespace),
        resync_seconds=kw.pop("resync_seconds", 5.0),
        lease_name=unique("cd-controller"),
        **kw,
    )
    controller = Controller(cp.api_client(), cfg, fabric_runner=fabric_runner)
    controller.start()
    try:
        if controller.elector is not None:
            assert controller.elector.leading.wait(30), "the controller never became leader"
        yield controller
    finally:
        controller.stop()


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c["type"] == type_:
            return dict(c)
    return None


def wait_gone(check: Callable[[], Any], what: str, timeout: float = 30) -> None:
    wait_for(lambda: check() is None, what=what, timeout=timeout)


def create_plugin_node(cp: ControlPlane, name: str, fabric: str | None = None) -> None:
    labels = {cd.PLUGIN_NODE_LABEL: "true"}
    if fabric is not None:
        labels["fabricdra.io/fabric.domain"] = fabric
    cp.create_node(name, labels)


def new_namespace(cp: ControlPlane, prefix: str) -> str:
    """A namespace of its own for one test (a unique name from `prefix`)."""
    name = unique(prefix)
    cp.create_namespace(name)
    return name


def give_addresses(cp: ControlPlane, node: str, *ips: str) -> None:
    """The Node's InternalIP addresses, as a kubelet would list them (the controller takes a
    report's IP only if it is one of them)."""
    from kubernetes import client

    with cp.api_client() as api:
        core = client.CoreV1Api(api)
        obj = core.read_node_status(node)
        obj.status.addresses = [client.V1NodeAddress(type="Hostname", address=node)] + [
            client.V1NodeAddress(type="InternalIP", address=ip) for ip in ips
        ]
        core.replace_node_status(node, obj)


def report_daemon(
    rest: Rest,
    namespace: str,
    domain_uid: str,
    node: str,
    *,
    ready: bool,
    message: str = "",
    ip: str = "",
) -> None:
    """What `fabricdra imex-daemon` writes: its report Lease (used by tests and the bench)."""
    from fabricdra.kubeletplugin.computedomain.report import write_report

    write_report(rest, namespace, domain_uid, node, ready=ready, message=message, ip=ip)


def settle(seconds: float = 0.5) -> None:
    time.sleep(seconds)


def allocate_claim(
    rest: Rest,
    ns: str,
    template: dict[str, Any],
    node: str,
    name: str,
    *,
    binding_conditions: bool = False,
    allocated_at: float | None = None,
) -> ClaimRef:
    """A claim made from `template` and allocated on `node`, as the KCM's claim controller and
    kube-scheduler would make it (for tests that run without them)."""
    body = {
        "metadata": {"name": name, "labels": template["spec"]["metadata"]["labels"]},
        "spec": template["spec"]["spec"],
    }
    created = rest.create(CLAIMS, body, ns)
    allocate(rest, ns, name, node, binding_conditions=binding_conditions, at=allocated_at)
    return ClaimRef(ns, name, created["metadata"]["uid"])


def allocate(
    rest: Rest,
    ns: str,
    name: str,
    node: str,
    *,
    binding_conditions: bool,
    at: float | None = None,
) -> None:
    """Allocate the existing claim `name` on `node`, as kube-scheduler would (its
    `allocationTimestamp` now, or `at`, epoch seconds: a claim allocated that long ago)."""
    spec = rest.get(CLAIMS, name, ns)["spec"]
    request = spec["devices"]["requests"][0]
    device = cd.CHANNEL_DEVICE if request["name"] == "channel" else cd.DAEMON_DEVICE
    config = [{"source": "FromClaim", **c} for c in spec["devices"].get("config") or []]
    result: dict[str, Any] = {
        "request": request["name"],
        "driver": cd.DRIVER,
        "pool": node,
        "device": device,
        "shareID": str(uuid.uuid4()),
    }
    if binding_conditions:
        result["bindingConditions"] = [cd.ADMITTED_CONDITION]
        result["bindingFailureConditions"] = [cd.CONFLICT_CONDITION]
    write_allocation(rest, ns, name, node, {"results": [result], "config": config}, at=at)


def write_allocation(
    rest: Rest,
    ns: str,
    name: str,
    node: str | None,
    devices: dict[str, Any],
    *,
    at: float | None = None,
) -> None:
    """Write the claim's allocation of `devices` (results, config), on `node` (None: no node
    selector), as kube-scheduler would: its `allocationTimestamp` now, or `at` (epoch
    seconds)."""
    allocation: dict[str, Any] = {
        "devices": devices,
        "allocationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
    }
    if node is not None:
        allocation["nodeSelector"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    rest.patch(
        CLAIMS,
        name,
        {"status": {"allocation": allocation}},
        ns,
        sub="status",
        content_type=STRATEGIC_PATCH,
    )


@contextmanager
def refused_status_writes(rest: Rest, namespace: str, refuse_when: str) -> Iterator[str]:
    """While inside: the API server refuses every ComputeDomain status write in `namespace`
    whose new object matches the CEL expression `refuse_when` (over `object`). A
    ValidatingAdmissionPolicy, so no webhook and nothing of the code under test changes: it
    stops the controller between two of its writes, as a crash there would. Yields the
    refusal's message (unique: a test can wait for the controller to have hit it). Returns
    once the policy is in force, probed with a domain of its own (so: enter it before a
    controller runs, or the probe may get a finalizer)."""
    name = unique("refuse-status")
    probe = unique("probe")
    marker = f"status write refused by test policy {name}"
    rest.create(
        POLICIES,
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [cd.GROUP],
                            "apiVersions": ["*"],
                            "operations": ["UPDATE"],
                            "resources": ["computedomains/status"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": f"object.metadata.name != '{probe}' && !({refuse_when})",
                        "message": marker,
                    }
                ],
            },
        },
    )
    rest.create(
        POLICY_BINDINGS,
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    )
    rest.create(COMPUTE_DOMAINS, domain_body(probe, mode="host"), namespace)

    def in_force() -> bool:
        try:
            rest.patch(
                COMPUTE_DOMAINS,
                probe,
                {"status": {"fabricDomain": unique("probe")}},
                namespace,
                sub="status",
            )
        except ApiError as e:
            return marker in e.message
        return False

    wait_for(in_force, what="the status-refusing policy in force")
    rest.delete(COMPUTE_DOMAINS, probe, namespace)  # before any controller gives it a finalizer
    try:
        yield marker
    finally:
        rest.delete(POLICY_BINDINGS, name)
        rest.delete(POLICIES, name)
