"""In-cluster upgrade from the previous chart (issue 30 point 2): the release installed by the
0.1.0 chart (this repository at `PREVIOUS_CHART`), then upgraded to this chart the documented
way, `helm upgrade --reset-then-reuse-values`, with the same image: the upgrade succeeds, the node
pods roll to the new chart and the node's devices are offered again. The session's release is
replaced by the upgraded one (same values), which later scenarios use as it is."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.helm import CHART_DIR, PREVIOUS_CHART, Chart, chart_at
from tests.e2e.installkit import NAMESPACE, Installed, offered_untainted


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
    old = Chart(chart_at(PREVIOUS_CHART, tmp_path))
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
