"""In-cluster upgrade from the previous chart (issue 30 point 2): the release installed by the
0.1.0 chart (this repository at `PREVIOUS_CHART`), then upgraded to this chart the documented
way, `helm upgrade --reset-then-reuse-values`, with the same image: the upgrade succeeds, the node
pods roll to the new chart and the node's devices are offered again. The session's release is
replaced by the upgraded one (same values), which later scenarios use as it is. And an upgrade
that turns ComputeDomains off (point 6): its pre-upgrade hook releases what the controller made
for a running domain."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.helm import CHART_DIR, PREVIOUS_CHART, Chart, chart_at
from fabricdra.api import computedomain as cd
from fabricdra.controller.cleanup import DEPLOYMENTS
from fabricdra.kube.rest import (
    CLAIM_TEMPLATES,
    COMPUTE_DOMAINS,
    DAEMON_SETS,
    NODES,
    SLICES,
    Kind,
    Rest,
)
from tests.e2e.installkit import NAMESPACE, Installed, offered_untainted, wait_running
from tests.e2e.test_install_computedomain import create_domain, domain_pod

pytestmark = pytest.mark.e2e


def _node_pods_of(api: client.ApiClient, chart: str) -> list[str]:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/component=node"
    )
    return [
        p.metadata.name
        for p in pods.items
        if p.metadata.labels.get("helm.sh/chart") == chart and p.status.phase == "Running"
    ]


def test_upgrade_from_the_previous_chart_keeps_offering_devices(
    installation: Installed, tmp_path: Path
) -> None:
    new = "fabricdra-" + yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["version"]
    kubeconfig = installation.cluster.kubeconfig
    node = installation.cluster.node_name
    if installation.present:
        installation.uninstall()
    # The 0.1.0 chart's schema refuses keys it does not know (devicePlugins among them).
    old = Chart(chart_at(PREVIOUS_CHART, tmp_path), base_values={})
    # 0.1.0 required the active probes by default; without a verification image its users
    # turned them off (the value the upgrade then keeps).
    values = {**installation.values, "verification": {"activeProbes": False}}
    old.install(kubeconfig, NAMESPACE, values=values)
    installation.present = True  # whatever follows, the session's teardown uninstalls it
    with installation.cluster.api_client() as api:
        wait_for(lambda: offered_untainted(api, node), timeout=120, what="devices, 0.1.0")
        assert _node_pods_of(api, "fabricdra-0.1.0")

        upgraded = installation.chart.run(
            "upgrade",
            "fabricdra",
            str(installation.chart.chart_dir),
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            "--reset-then-reuse-values",
            # A release from before devicePlugins.absent has no answer to it: the upgrade is
            # refused until it is given (docs/install.md, "Upgrade").
            "--set=devicePlugins.absent=true",
            "--wait",
            "--timeout=5m",
        )
        assert "has been upgraded" in upgraded

        version = installation.chart.run(
            "list", f"--kubeconfig={kubeconfig}", f"--namespace={NAMESPACE}", "-o", "json"
        )
        assert f'"chart":"{new}"' in version.replace(" ", "")

        def only_new() -> bool:
            return bool(_node_pods_of(api, new)) and not _node_pods_of(api, "fabricdra-0.1.0")

        wait_for(
            only_new,
            timeout=180,
            what="the node pods of the new chart only",
        )
        wait_for(lambda: offered_untainted(api, node), timeout=120, what=f"devices, {new}")


def _names(rest: Rest, kind: Kind, namespace: str | None = None, **sel: str) -> list[str]:
    items = rest.list(kind, namespace, **sel)["items"]
    return sorted(i["metadata"]["name"] for i in items)


def test_turning_compute_domains_off_releases_what_the_controller_made(
    installed: Installed,
) -> None:
    """`helm upgrade --set computeDomains.enabled=false` with a domain whose IMEX daemon runs:
    the pre-upgrade hook Job (`fabricdra cleanup --scope=compute-domains`, the hook's own
    account) stops the controller and releases the domain while the compute-domain plugin
    still runs; the user's domain stays, nothing the controller made for it does, the devices
    are still offered. The release is uninstalled after (the next scenario installs it anew)."""
    node = installed.cluster.node_name
    ns = f"cd-off-{uuid.uuid4().hex[:6]}"
    kubeconfig = installed.cluster.kubeconfig
    with installed.cluster.api_client() as api:
        core, rest = client.CoreV1Api(api), Rest(api)
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.read_namespaced_service_account("default", ns), what="default SA")
        try:
            uid = create_domain(rest, ns, "job")["metadata"]["uid"]
            domain_pod(core, ns, "worker", "job")
            wait_running(core, ns, "worker")
            selector = f"{cd.DOMAIN_LABEL}={uid}"
            assert _names(rest, DAEMON_SETS, NAMESPACE, label_selector=selector)
            assert _names(rest, SLICES, field_selector=f"spec.driver={cd.DRIVER}")
            core.delete_namespaced_pod("worker", ns)
            wait_for(lambda: not core.list_namespaced_pod(ns).items, what="the worker gone")

            installed.chart.run(
                "upgrade",
                "fabricdra",
                str(installed.chart.chart_dir),
                f"--kubeconfig={kubeconfig}",
                f"--namespace={NAMESPACE}",
                "--reset-then-reuse-values",
                f"--set-json=computeDomains={json.dumps({'enabled': False})}",
                "--wait",
                "--timeout=5m",
            )

            kept = rest.get(COMPUTE_DOMAINS, "job", ns)
            assert cd.FINALIZER not in (kept["metadata"].get("finalizers") or [])
            assert _names(rest, DAEMON_SETS, NAMESPACE, label_selector=cd.DOMAIN_LABEL) == []
            assert _names(rest, CLAIM_TEMPLATES, None, label_selector=cd.DOMAIN_LABEL) == []
            assert _names(rest, SLICES, field_selector=f"spec.driver={cd.DRIVER}") == []
            assert _names(rest, DEPLOYMENTS, NAMESPACE) == []
            labels = rest.get(NODES, node)["metadata"]["labels"]
            assert cd.DOMAIN_LABEL not in labels
            assert "fabricdra-node" in _names(rest, DAEMON_SETS, NAMESPACE)
            wait_for(lambda: offered_untainted(api, node), timeout=120, what="devices, still")
        finally:
            installed.uninstall()
            core.delete_namespace(ns)
