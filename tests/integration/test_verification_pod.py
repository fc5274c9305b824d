"""The verification pod against a real kube-apiserver (no kubelet: the pod is never run):
what the agent asks for — its own node, the host network, privileged, no token, the probe
script — and that a pod that never runs leaves the probes NotRun and is deleted."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.harness.controlplane import ControlPlane
from fabricdra.api.verification import load_expectations
from fabricdra.kube.rest import PODS, Rest
from fabricdra.kubeletplugin.verification.active import Judge, Plan, Step, execute
from fabricdra.kubeletplugin.verification.podrun import PodExecutor, pod_manifest
from tests.integration.computedomain_helpers import new_namespace, unique

pytestmark = pytest.mark.integration

IMAGE = "registry.example/fabricdra-verify:1"


def test_the_pod_runs_on_the_agents_node_and_one_that_never_runs_is_not_run_and_deleted(
    control_plane: ControlPlane,
) -> None:
    ns = new_namespace(control_plane, "verify")
    node = unique("gpu-node")
    control_plane.create_node(node)
    seen: list[dict[str, Any]] = []
    with control_plane.api_client() as api:
        rest = Rest(api)

        def watch(_: float) -> None:  # the executor's wait between polls: look at the pod
            for pod in rest.list(PODS, ns)["items"]:
                seen.append(pod)

        # A pod an earlier agent left on this node (restarted mid-run), and another node's.
        for stale, on in (
            ("fabricdra-verify-stale", node),
            ("fabricdra-verify-other", "elsewhere"),
        ):
            body = pod_manifest(stale, ns, on, IMAGE, "sleep 600", 600)
            rest.create(PODS, body, ns)
        pod = PodExecutor(rest, ns, node, IMAGE, poll_seconds=0.2, start_seconds=2, sleep=watch)
        row = load_expectations().for_nic()
        step = Step("p0", "ib_write_bw", ("-d", "mlx5_0"), 1.0, loopback=True)
        plan = Plan([[Judge(step, "nic-bandwidth", "mlx5_0", row, 360.0)]])
        [result] = execute(plan, pod, None)
        left = rest.list(PODS, ns)["items"]
    assert result.outcome == "NotRun"
    assert (result.reason or "").startswith("the verification run failed: verification pod ")
    assert "did not finish" in (result.reason or "")
    mine = [p for p in seen if p["metadata"]["name"] not in ("fabricdra-verify-other",)]
    assert mine, "the pod was never seen"
    # the leftover of this node was deleted before the run's pod was created
    assert "fabricdra-verify-stale" not in {p["metadata"]["name"] for p in mine}
    spec = mine[0]["spec"]
    assert spec["nodeName"] == node
    assert spec["hostNetwork"] is True
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert "volumes" not in spec or not spec["volumes"]
    [container] = spec["containers"]
    assert container["image"] == IMAGE
    assert container["securityContext"]["privileged"] is True
    assert container["command"][:2] == ["sh", "-c"]
    assert "ib_write_bw" in container["command"][2]
    alive = [p["metadata"]["name"] for p in left if p["metadata"].get("deletionTimestamp") is None]
    assert alive == ["fabricdra-verify-other"]  # another node's pod is not this agent's
