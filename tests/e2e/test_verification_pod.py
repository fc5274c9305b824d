"""The verification pod in a real cluster (real kubelet and containerd): the chart installed
with `verification.image` set to an image holding the stand-in tools (tests/standins, built by
deployments/verification/build.sh); the node agent starts the pod on its node, reads the
tools' output from its log, deletes it, and the node verifies on the measurements."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.harness.controlplane import wait_for
from e2e.harness.images import verification_image
from tests.e2e.installkit import NAMESPACE, Installed, offered_untainted

pytestmark = pytest.mark.e2e

STANDINS = Path(__file__).resolve().parents[1] / "standins"
ACTIVE = ("host-bandwidth", "gpu-bandwidth", "nccl-allreduce", "nic-bandwidth")


def test_the_agent_measures_the_node_in_a_verification_pod(
    installed: Installed, tmp_path_factory: pytest.TempPathFactory
) -> None:
    archive, image = verification_image(tmp_path_factory.mktemp("verify-image"), STANDINS)
    installed.cluster.import_image(archive)
    node = installed.cluster.node_name
    values = {
        **installed.values,
        "verification": {"activeProbes": True, "image": image, "toolTimeoutSeconds": 120},
    }
    # The active probes run only on an idle node (no prepared claim): earlier scenarios'
    # claims must be unprepared first, or the run is skipped as "busy" until this times out.
    checkpoint = installed.cluster.plugins_dir / "devices.fabricdra.io" / "checkpoint.json"
    wait_for(
        lambda: not checkpoint.exists() or not json.loads(checkpoint.read_text()).get("claims"),
        timeout=300,
        what=f"no claim prepared on the node ({checkpoint})",
    )
    try:
        installed.chart.install(installed.cluster.kubeconfig, NAMESPACE, values=values)
        with installed.cluster.api_client() as api:
            custom = client.CustomObjectsApi(api)

            def measured() -> dict[str, Any] | None:
                record = custom.get_cluster_custom_object(
                    "fabricdra.io", "v1alpha1", "nodedevices", node
                )
                v = (record.get("status") or {}).get("verification") or {}
                probes = v.get("probes") or []
                done = {p["probe"] for p in probes if p["outcome"] == "Passed"}
                return v if set(ACTIVE) <= done and v.get("state") == "Verified" else None

            v = wait_for(measured, timeout=600, what="a verification run with the tools")
            nic = [p for p in v["probes"] if p["probe"] == "nic-bandwidth"]
            assert any(p["measured"] == "391.71 Gb/s" for p in nic)  # the stand-in's figure
            wait_for(lambda: offered_untainted(api, node), timeout=120, what="untainted devices")
            core = client.CoreV1Api(api)
            left = core.list_namespaced_pod(
                NAMESPACE, label_selector="app.kubernetes.io/component=verification"
            ).items
            assert [p.metadata.name for p in left if not p.metadata.deletion_timestamp] == []
    finally:
        installed.chart.install(installed.cluster.kubeconfig, NAMESPACE, values=installed.values)
