"""In-cluster scenario 4 of the install: ComputeDomains with the chart's own controller and
compute-domain plugin (their pods, their RBAC), on the harness's node made IMEX-capable
through chart values only (tests/e2e/imexnode.py; installkit.py says how the rest is made).

A node belongs to one ComputeDomain at a time: two pods of one domain share the node, a pod of a
second domain waits (unschedulable) until the first domain and its pods are gone."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.images import TEST_IMAGE
from fabricdra.api import computedomain as cd
from fabricdra.kube.rest import CLAIM_TEMPLATES, COMPUTE_DOMAINS, SLICES, Rest
from tests.e2e.imexnode import IMEX_CHANNELS_MAJOR
from tests.e2e.installkit import NAMESPACE, Installed, wait_running

pytestmark = pytest.mark.e2e

PRINT = (
    "echo channel=$FABRICDRA_IMEX_CHANNEL domain=$FABRICDRA_COMPUTE_DOMAIN; "
    "stat -c '%n %t %T %F' /dev/nvidia-caps-imex-channels/*; sleep 3600"
)


def domain_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": cd.API_VERSION,
        "kind": cd.KIND,
        "metadata": {"name": name},
        "spec": {"channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}},
    }


def domain_pod(core: client.CoreV1Api, ns: str, name: str, domain: str) -> None:
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [
                    {"name": "imex", "resourceClaimTemplateName": f"{domain}-channel"}
                ],
                "containers": [
                    {
                        "name": "c",
                        "image": TEST_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", PRINT],
                        "resources": {"claims": [{"name": "imex"}]},
                    }
                ],
            },
        },
    )


def create_domain(rest: Rest, ns: str, name: str) -> dict[str, Any]:
    """The domain, once the controller made its workload claim template and gave it a channel."""
    rest.create(COMPUTE_DOMAINS, domain_body(name), ns)
    wait_for(
        lambda: rest.get_or_none(CLAIM_TEMPLATES, f"{name}-channel", ns),
        timeout=60,
        what=f"the controller's claim template of {name}",
    )

    def with_channel() -> dict[str, Any] | None:
        domain: dict[str, Any] = rest.get(COMPUTE_DOMAINS, name, ns)
        return domain if domain.get("status", {}).get("channels") else None

    found: dict[str, Any] = wait_for(with_channel, timeout=60, what=f"a channel for {name}")
    return found


def pod_output(core: client.CoreV1Api, ns: str, name: str) -> dict[str, str]:
    """`channel`, `domain` and `devices` (path, hex major and minor, type of each channel
    device the container has) as the pod printed them."""
    log: str = wait_for(
        lambda: core.read_namespaced_pod_log(name, ns) or None, what=f"{name}'s output"
    )
    first, _, listing = log.partition("\n")
    out = dict(kv.split("=", 1) for kv in first.split())
    out["devices"] = listing
    return out


def condition_true(domain: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in domain.get("status", {}).get("conditions", []) or []:
        if c.get("type") == kind and c.get("status") == "True":
            return domain
    return None


def unschedulable(core: client.CoreV1Api, ns: str, name: str) -> Any:
    pod = core.read_namespaced_pod(name, ns)
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return pod
    return None


def test_domain_pods_share_the_node_and_a_second_domain_waits_for_it(
    installed: Installed,
) -> None:
    node = installed.cluster.node_name
    ns = f"cd-{uuid.uuid4().hex[:6]}"
    with installed.cluster.api_client() as api:
        core, rest = client.CoreV1Api(api), Rest(api)
        # The controller publishes the node's compute-domain slice once the chart's plugin
        # labelled the node: the node is offered for domains.
        wait_for(
            lambda: [
                s
                for s in rest.list(SLICES, field_selector=f"spec.driver={cd.DRIVER}")["items"]
                if s["spec"]["nodeName"] == node
            ],
            timeout=120,
            what="the node's compute-domain slice",
        )
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), what="default SA")

        try:
            first = create_domain(rest, ns, "first")
            for name in ("a1", "a2"):
                domain_pod(core, ns, name, "first")
            for name in ("a1", "a2"):
                wait_running(core, ns, name)
            seen = {name: pod_output(core, ns, name) for name in ("a1", "a2")}
            held = core.read_node(node).metadata.labels.get(cd.DOMAIN_LABEL)
            daemons = client.AppsV1Api(api).list_namespaced_daemon_set(
                NAMESPACE, label_selector=f"{cd.DOMAIN_LABEL}={first['metadata']['uid']}"
            )
            # Managed mode: the domain's IMEX daemon runs on the held node (the fabricdra image,
            # with what its claim injects from the driver root). This HGX node has no NVLink
            # fabric: the daemon runs no IMEX and reports ready, which makes the domain Ready
            # (issue 22 point 7).
            ready = wait_for(
                lambda: condition_true(rest.get(COMPUTE_DOMAINS, "first", ns), cd.READY),
                timeout=120,
                what="the first domain Ready (its IMEX daemon reporting ready)",
            )
            # Its probes run in the product image (issue 29, point 11): the startup probe
            # (its loop's heartbeat file) passed, then readiness (IMEX READY: here "no
            # fabric", ready) made the container ready.
            selector = f"{cd.DOMAIN_LABEL}={first['metadata']['uid']}"
            daemon = wait_for(
                lambda: next(
                    (
                        st
                        for p in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
                        for st in p.status.container_statuses or []
                        if st.started and st.ready
                    ),
                    None,
                ),
                timeout=120,
                what="the IMEX daemon container started and ready",
            )

            second = create_domain(rest, ns, "second")
            domain_pod(core, ns, "b1", "second")
            wait_for(
                lambda: unschedulable(core, ns, "b1"),
                timeout=60,
                what="b1 to be found unschedulable while the first domain holds the node",
            )
            waiting = core.read_namespaced_pod("b1", ns)
            still = [core.read_namespaced_pod(n, ns).status.phase for n in ("a1", "a2")]

            for name in ("a1", "a2"):
                core.delete_namespaced_pod(name, ns)
            rest.delete(COMPUTE_DOMAINS, "first", ns)
            wait_for(
                lambda: rest.get_or_none(COMPUTE_DOMAINS, "first", ns) is None,
                timeout=60,
                what="the first domain to be finalized",
            )
            wait_running(core, ns, "b1")
            later = pod_output(core, ns, "b1")
        finally:
            # A failure must not leave the node held for the next scenario.
            with contextlib.suppress(Exception):
                core.delete_namespace(ns)

    channel = str(first["status"]["channels"][0])
    for name, out in seen.items():
        assert out["domain"] == "first", name
        assert out["channel"] == channel, name
        # Exactly the domain's channel device: the driver's major, the channel as minor.
        assert out["devices"].strip() == (
            f"/dev/nvidia-caps-imex-channels/channel{channel} "
            f"{IMEX_CHANNELS_MAJOR:x} {int(channel):x} character special file"
        ), name
    assert held == first["metadata"]["uid"]
    assert len(daemons.items) == 1  # managed mode: the domain's IMEX DaemonSet
    probes = daemons.items[0].spec.template.spec.containers[0]
    assert probes.startup_probe is not None
    assert probes.liveness_probe is not None
    assert daemon.started
    assert condition_true(ready, cd.DAEMONS_READY)
    daemons_ready = next(c for c in ready["status"]["conditions"] if c["type"] == cd.DAEMONS_READY)
    assert daemons_ready["reason"] == "NoFabric"
    assert [n["ready"] for n in ready["status"]["nodes"]] == [True]
    assert waiting.status.phase == "Pending"
    assert still == ["Running", "Running"]
    assert second["status"]["channels"][0] != first["status"]["channels"][0]
    assert later["domain"] == "second"
    assert later["channel"] == str(second["status"]["channels"][0])
